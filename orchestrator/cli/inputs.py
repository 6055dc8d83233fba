"""What every command reads from its arguments: one bad input as a UsageError (one line, exit
status 2), argparse's types for ports and addresses, and the launch a reader names."""

from __future__ import annotations

import argparse
import urllib.parse
from pathlib import Path

from ..record.mlflow_ui import DEFAULT_URL
from ..record.secrets import redact
from ..record.state import LaunchState, find_launch
from ..record.stores import TrackingError, check_store, missing_sqlite_file, reveal, store_exists


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2, nothing launched. `where` (a file and key)
    is printed as it is; the message goes through redact_secrets, which would take a key named
    like a secret and the reason's first word (`fixed.password: no model ...`) for a secret."""

    def __init__(self, message: str, where: str = ""):
        super().__init__(where + message)
        self.where, self.message = where, message

    @classmethod
    def of_spec(cls, e) -> UsageError:
        return cls(e.reason, f"{e.path}: {e.key}: ")


def port_number(text: str) -> int:
    """argparse's type for a TCP port: its error is the one line argparse prints."""
    port = int(text)  # argparse turns a ValueError into "invalid port_number value"
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535)")
    return port


def ui_url(text: str) -> str:
    """argparse's type for `--mlflow-url`: an http(s) address; its error is the one line argparse prints."""
    parts = urllib.parse.urlsplit(text)
    try:
        parts.port  # raises where the port is no number or out of range
        good = parts.scheme in ("http", "https") and parts.hostname and not (parts.query or parts.fragment)
    except ValueError:
        good = False
    if not good:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not the http(s) address of MLflow's UI, e.g. {DEFAULT_URL}"
        )
    return text.rstrip("/")


def load_state(args, uses_store: bool = True, writes_store: bool = False):
    """The launch `args` name, its tracking store checked: it answers and holds MLflow's tables,
    and with `writes_store` (`resume`) a SQLite file is writable too; with `uses_store` False
    (`accept`, which only writes launch.json) neither checked nor its password asked for."""
    try:
        folder = find_launch(args.storage_path, args.launch)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    except (OSError, ValueError) as e:  # a name too long, a NUL: no launch folder can have it
        raise UsageError(f"no launch {args.launch!r}: {getattr(e, 'strerror', None) or e}") from None
    try:
        state = LaunchState.load(folder)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    if not uses_store:
        return state
    args.store_uri = state.tracking_uri
    database = missing_sqlite_file(state.tracking_uri)
    if database:  # opening it would make an empty store and show no trials
        moved = (
            f", nor at {state.here(Path(database))}, where the launch folder's move from "
            f"{state.moved_from} puts it"
            if state.moved_from
            else ""
        )
        raise UsageError(
            f"{state.dir / 'launch.json'}: tracking_uri: no SQLite store at {database} from "
            f"{Path.cwd()}{moved} "
            "(run where the launch ran, or copy its database there)"
        )
    try:  # one line where a server or database cannot answer, not its client's traceback (the
        # SQLite file is there: it may be only readable to this user, which check_store refuses);
        # check_store reveals the password as it connects, and a command that does not connect still needs it
        sqlite = state.tracking_uri.startswith("sqlite:")
        if sqlite:
            reveal(state.tracking_uri)
        else:
            check_store(state.tracking_uri)
        if not store_exists(state.tracking_uri):  # reading it through MLflow would write its tables into it
            raise TrackingError(
                f"{redact(state.tracking_uri)} holds no MLflow store (an empty file, or another program's "
                "database)"
            )
        if sqlite and writes_store:  # a read needs the file readable only
            check_store(state.tracking_uri)
    except TrackingError as e:
        raise UsageError(f"{state.dir / 'launch.json'}: tracking_uri: {e}") from None
    return state
