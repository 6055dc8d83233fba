"""`orchestrator list`: what a researcher can name in a file or on the command line (tasks,
models, presets), and the launches under a folder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainables.config import preset_models
from trainables.kinds import KINDS
from trainables.models import MODELS
from trainables.tasks import TASKS

from ..record.state import DamagedLaunch, LaunchState, driver, started_at


def cmd_list(args) -> int:
    """What a researcher can name in a file or on the command line, without importing Ray."""
    if args.what == "tasks":
        kind_width = max(len(spec.kind.name) for spec in TASKS.values())
        scores_width = max(len("/".join(kind.scores)) for kind in KINDS.values())
        for name, spec in TASKS.items():
            options = ", ".join(f.name for f in dataclasses.fields(spec.config))
            print(
                f"{name:22s} {spec.kind.name:{kind_width}s} "
                f"scores {'/'.join(spec.kind.scores):{scores_width}s} options: {options}"
            )
    elif args.what == "models":
        for name, spec in MODELS.items():
            print(f"{name:24s} {', '.join(map(str, spec.kinds)):42s} {spec.description}")
    elif args.what == "presets":
        for task, models in preset_models().items():
            print(f"{task:22s} " + " ".join(f"{task}/{model}" for model in models))
    else:
        folders = sorted(
            Path(args.storage_path).glob("*/launch.json"), key=started_at
        )  # as `status` finds the last one
        if not folders:
            print(f"no launches in {args.storage_path}/")
        for path in folders:
            try:
                state = LaunchState.load(path.parent)
            except DamagedLaunch as e:
                print(f"{path.parent.name:48s} {'damaged':12s} {e}")
                continue
            alive, _ = driver(path.parent)
            shown = "running" if alive else ("driver gone" if state.state == "running" else state.state)
            # A night's verdict: which night `orchestrator accept` could take.
            verdict = {
                None: "",
                False: "  (no regression)",
                True: "  (regressed, accepted)" if state.accepted else "  (regressed)",
            }[state.regressed]
            if state.night is not None and state.state == "finished" and state.regressed is None:
                verdict = "  (no earlier night to compare with)"
            print(f"{state.launch_id:48s} {shown:12s} {state.experiment:28s} {state.spec_file}{verdict}")
    return 0
