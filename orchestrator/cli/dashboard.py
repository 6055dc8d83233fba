"""`orchestrator dashboard`: optuna-dashboard on a search launch's Optuna studies until Ctrl-C."""

from __future__ import annotations

import sys

from ..record.optuna_store import READ_ONLY, read_only_view, search_storage
from ..record.stores import TrackingError
from .inputs import UsageError, load_state


def cmd_dashboard(args) -> int:
    """optuna-dashboard (an optional extra) on the Optuna storage of a search launch."""
    try:
        import bottle  # noqa: PLC0415 - optuna-dashboard's web framework, installed with it
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
    try:  # Bottle's own server, as optuna_dashboard.run_server starts it, on the app refusing writes
        bottle.run(refusing_writes(optuna_dashboard.wsgi(storage)), host=args.host, port=args.port)
    except OSError as e:  # the port is taken, or the host is not one of this machine's addresses
        raise UsageError(f"--port: cannot listen on {args.host}:{args.port} ({e.strerror or e})") from None
    return 0


def refusing_writes(app):
    """`app` (a WSGI application) answering every request but a read (GET, HEAD) with 403 and one line,
    before optuna-dashboard sees it: its handlers log the storage's refusal (read_only_view) as a
    traceback and answer 500."""

    def app_read_only(environ, start_response):
        if environ.get("REQUEST_METHOD", "GET") in ("GET", "HEAD"):
            return app(environ, start_response)
        body = f"{READ_ONLY}\n".encode()
        headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
        start_response("403 Forbidden", headers)
        return [body]

    return app_read_only
