"""`orchestrator report`: a launch's report, alone or compared with another launch's."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..record.state import previous_launch
from ..report.report import verdict_lines, write_launch_report, write_report
from .inputs import UsageError, load_state


def cmd_report(args) -> int:

    state = load_state(args)
    if args.compare and not state.study().is_ablation:
        raise UsageError(
            f"--compare: launch {state.launch_id} is a search; launches compare cell by cell only as "
            "ablations"
        )
    previous = None
    if args.compare == "previous":
        previous = previous_launch(state)
        if previous is None:
            raise UsageError(
                f"--compare previous: no finished launch of {Path(state.spec_file).name} in "
                f"{state.experiment} under {state.dir.parent} before {state.launch_id}; "
                "nothing to compare with"
            )
    elif args.compare:
        previous = load_state(argparse.Namespace(storage_path=args.storage_path, launch=args.compare))
        # A search, or a launch of other pairs, shares no cell: its verdict was "no regression in 0
        # cells", exit 0.
        theirs = previous.the_plan()
        if not theirs["ablation"]:
            raise UsageError(
                f"--compare: launch {previous.launch_id} is a search; launches compare cell by cell only "
                "as ablations"
            )
        if not {p["name"] for p in theirs["pairs"]} & {p["name"] for p in state.the_plan()["pairs"]}:
            raise UsageError(
                f"--compare: launch {previous.launch_id} ({previous.spec_file}) has no model/task pair of "
                f"{state.launch_id} "
                f"({state.spec_file}); nothing to compare"
            )
    paths, regressions = (
        write_report(state, previous, ui_url=args.mlflow_url)
        if previous
        else write_launch_report(state, args.mlflow_url)
    )
    for path in paths:
        print(path)
    for line in verdict_lines(regressions):
        print(line)
    return 1 if regressions else 0
