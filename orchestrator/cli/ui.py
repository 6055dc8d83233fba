"""`orchestrator ui`: MLflow's UI on a launch's store until Ctrl-C, and the links into it."""

from __future__ import annotations

from ..record.mlflow_ui import DEFAULT_URL, Server, free_port, launch_lines
from ..record.secrets import redact
from ..record.stores import TrackingError
from .inputs import UsageError, load_state


def cmd_ui(args) -> int:
    """MLflow's UI (`mlflow server`, one worker) on the launch's store until Ctrl-C or SIGTERM, and
    the links into it with its address; a tracking server is its own UI: its links only."""
    state = load_state(args)
    if state.tracking_uri.startswith(("http://", "https://")):
        for line in launch_lines(state, redact(state.tracking_uri)):
            print(line)
        return 0
    try:
        port = free_port(args.port)
    except OSError as e:
        raise UsageError(f"--port: cannot listen on 127.0.0.1:{args.port} ({e.strerror or e})") from None
    try:
        with Server(state.tracking_uri, port) as server:
            print(f"MLflow's UI on {redact(state.tracking_uri)}: starting at {server.address}", flush=True)
            lines = launch_lines(state, server.address)  # MLflow's and torch's imports while it starts
            server.wait_until_it_answers()
            for line in lines:
                print(line)
            if server.address != DEFAULT_URL:
                print(
                    f"(the report's links point at {DEFAULT_URL}: `orchestrator report {state.dir} "
                    f"--mlflow-url {server.address}` points them here)"
                )
            print("Ctrl-C stops it", flush=True)
            server.process.wait()
            raise TrackingError(server.why_stopped())
    except KeyboardInterrupt:
        print("MLflow's UI stopped")
        return 0
    except TrackingError as e:
        raise UsageError(f"ui: {e}") from None
