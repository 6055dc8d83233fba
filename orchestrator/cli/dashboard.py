"""`orchestrator dashboard`: optuna-dashboard on a search launch's Optuna studies until Ctrl-C."""

from __future__ import annotations

import sys

from ..record.optuna_store import read_only_view, search_storage
from ..record.stores import TrackingError
from .inputs import UsageError, load_state


def cmd_dashboard(args) -> int:
    """optuna-dashboard (an optional extra) on the Optuna storage of a search launch."""
    try:
        import optuna_dashboard  # noqa: PLC0415 - an optional extra: only this command asks for it
    except ImportError:
        raise UsageError(
            "dashboard: optuna-dashboard is not installed; pip install -e '.[dashboard]'"
        ) from None

    state = load_state(args)
    plan = state.the_plan()
    if plan["ablation"]:
        raise UsageError(
            f"dashboard: launch {state.launch_id} is an ablation, whose grid runs without Optuna; "
            "`orchestrator report` or `orchestrator export` show its runs"
        )
    names = {state.optuna_study_name(pair["name"]) for pair in plan["pairs"]}
    try:
        storage = read_only_view(search_storage(state.tracking_uri, state.dir, read_only=True), names)
    except TrackingError as e:
        raise UsageError(f"dashboard: {e}") from None
    print(f"the Optuna studies of launch {state.launch_id}, one per pair:")
    for pair in plan["pairs"]:
        print(f"  {state.optuna_study_name(pair['name'])}")
    sys.stdout.flush()  # before the dashboard's own lines (where it listens, how to quit) on stderr
    try:
        optuna_dashboard.run_server(storage, host=args.host, port=args.port)
    except OSError as e:  # the port is taken, or the host is not one of this machine's addresses
        raise UsageError(f"--port: cannot listen on {args.host}:{args.port} ({e.strerror or e})") from None
    return 0
