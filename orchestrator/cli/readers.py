"""`orchestrator status | best | accept`: from launch.json and the tracking store only (no Ray, no
spec parsing, no torch), as quick as the files they read."""

from __future__ import annotations

from pathlib import Path

from ..record.best import searched_and_ablation, summaries_of, write_ablation, write_best
from ..record.state import describe, driver
from ..record.summaries import failed_text
from ..record.tables import launch_table
from .inputs import UsageError, load_state


def cmd_status(args) -> int:
    """From launch.json and the tracking store only: no Ray, no spec parsing, no torch."""
    state = load_state(args)
    plan = state.the_plan()
    # Asked once: a driver that stops between two asks made the header and the table disagree.
    driver_now = driver(state.dir)
    print(f"launch {state.launch_id} ({state.dir}): {describe(state, driver_now)}")
    print(f"{plan['metric']}, {plan['mode']}")
    # Runs the driver left running when it stopped (Ctrl-C, killed) run no more: `resume` continues them.
    running = "running" if driver_now[0] else "unfinished"
    for line in launch_table(state, plan, running):
        print(line)
    if running == "unfinished" and state.state != "finished":
        print(
            f"('unfinished': running when the driver stopped; `orchestrator resume {state.dir}` continues "
            "them)"
        )
    return 0


def cmd_accept(args) -> int:
    """A night's regression was intended (a new protocol, a fixed bug that inflated scores): later
    nights compare with this night instead of the last one before it."""
    state = load_state(args, uses_store=False)
    if state.night is None:
        raise UsageError(
            f"accept: launch {state.launch_id} is no night of the nightly job; nights compare with nights"
        )
    if not state.regressed:
        raise UsageError(f"accept: night {state.launch_id} flagged no regression; it is already a baseline")
    state.accepted = True
    state.save()
    print(f"accepted night {state.launch_id}'s regression: the nights after it compare with it")
    return 0


def cmd_best(args) -> int:
    """From launch.json and the tracking store only, as `status`."""
    state = load_state(args)
    if state.the_plan()["ablation"]:  # its best seed across cells is chosen on noise
        raise UsageError(
            f"best: launch {state.launch_id} is an ablation, whose answer is per cell over seeds: "
            f"orchestrator status {state.launch_id} or orchestrator report {state.launch_id}"
        )
    if args.ablation:  # refused before anything is written
        try:
            studies = searched_and_ablation(state, Path(args.ablation))
        except ValueError as e:
            raise UsageError(f"best: {e}") from None
    summaries = summaries_of(state)  # the store read once, for both files
    written = write_best(state, summaries)
    for path in written:
        print(path)
    answered = {path.stem for path in written}
    for pair in [p["name"] for p in state.the_plan()["pairs"] if p["name"] not in answered]:
        s = summaries.get(pair, {})
        print(
            f"no best config for {pair}: none of its trials completed ({failed_text(s)}; "
            f"{s.get('stopped', 0)} stopped early)"
        )
    if args.ablation:
        try:
            path, lines = write_ablation(state, Path(args.ablation), summaries, studies)
        except ValueError as e:
            raise UsageError(f"best: {e}") from None
        for line in lines:
            print(f"  {line}")
        print(path)
    return 0
