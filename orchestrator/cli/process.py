"""The command as a process: its exit status for each error, its signals (SIGTERM as Ctrl-C, an
interrupt lost in a callback delivered again), its tracebacks without secrets, and console streams
that outlive their reader."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import traceback

from ..record.retries import DiskFull, StoreUnavailable, retry_delays
from ..record.secrets import redact_secrets
from ..record.state import DamagedLaunch
from ..record.stores import damaged_store, schema_problem
from ..run.cluster import ClusterUnreachable
from ..run.exits import EXIT_INTERRUPTED, EXIT_READER_GONE, EXIT_STORE_UNREACHABLE, EXIT_USAGE
from .inputs import UsageError
from .parser import build_parser, chosen, runs_trials

CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # all but the tab


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        try:
            retry_delays()  # the environment's retry window, refused before anything starts
        except ValueError as e:
            raise UsageError(str(e)) from None
        return chosen(args)(args)
    except (
        UsageError,
        DamagedLaunch,
        ClusterUnreachable,
    ) as e:  # a message may echo a bad value, secrets and all
        where, message = (e.where, e.message) if isinstance(e, UsageError) else ("", str(e))
        print(one_line(f"orchestrator: error: {where}{redact_secrets(message)}"), file=sys.stderr)
        return EXIT_USAGE
    except (
        FileExistsError,
        NotADirectoryError,
        IsADirectoryError,
    ) as e:  # a launch folder's report/ or best/ made a file
        print(
            f"orchestrator: error: {e.filename}: {e.strerror}: a launch's folders and files are the "
            "service's to write",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except StoreUnavailable as e:  # before a launch is registered (Launch.run says how to resume one)
        print(
            f"orchestrator: error: {redact_secrets(str(e))}; nothing was started: run the command again "
            f"once {'space is freed' if isinstance(e, DiskFull) else 'the store answers'}",
            file=sys.stderr,
        )
        return EXIT_STORE_UNREACHABLE
    except BrokenPipeError:  # `orchestrator status | head -1`: the reader has what it wanted
        to_devnull(sys.stdout)  # so the exit's flush fails no more
        return EXIT_READER_GONE
    except KeyboardInterrupt:  # before a launch is registered (Launch.run records one stopped later)
        print("orchestrator: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # last: an error of its own kind above is not re-raised from here
        store = getattr(args, "store_uri", None)  # the store the command opened: load_state and launch say
        damage = damaged_store(e)
        problem = (
            f"the tracking store's database is damaged: {damage}"
            if damage
            else store and schema_problem(store)
        )
        if not problem:
            raise
        print(
            f"orchestrator: error: {redact_secrets(store) + ': ' if store else ''}{problem}", file=sys.stderr
        )
        return EXIT_USAGE


def one_line(text: str) -> str:
    """`text` with its control characters escaped: a name or a value the user gave may hold a line
    break, and an error is one line."""
    return CONTROL.sub(lambda found: repr(found[0])[1:-1], text)


def to_devnull(stream) -> None:
    """A stream whose reader has gone, pointed at /dev/null: its later writes and flushes succeed."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


class OutlivesItsReader:
    """A console stream that a launch outlives: `orchestrator launch FILE | less`, then q, closed
    the pipe, and the next line's BrokenPipeError (raised in a Tune callback) killed the driver of
    an hours-long launch with its trials RUNNING. Once the reader is gone, the lines go nowhere."""

    def __init__(self, stream, name: str):
        self._stream, self._name = stream, name

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        to_devnull(self._stream)  # what the stream still buffers goes there too
        other = sys.stderr if self._name == "stdout" else sys.stdout
        other.write(
            "[launch] the console's reader is gone; the launch goes on: `orchestrator status` shows its "
            "progress\n"
        )
        other.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def redeliver_lost_interrupts() -> None:
    """A Ctrl-C whose KeyboardInterrupt the signal handler raises while the main thread runs a
    weakref callback or a __del__ (the garbage collector calls them anywhere) is lost: Python prints
    "Exception ignored in ..." and the command goes on (a chaos soak saw a launch finish after its
    Ctrl-C). Such an interrupt is delivered again, once the main thread has left that callback."""
    default_hook = sys.unraisablehook

    def hook(unraisable) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            threading.Timer(0.05, signal.raise_signal, (signal.SIGINT,)).start()
        else:
            default_hook(unraisable)

    sys.unraisablehook = hook


def redact_tracebacks() -> None:
    """A traceback (a defect, or a library's error this command does not expect) printed without
    the secrets its messages may hold: a store's error names its URI, password and all."""

    def hook(kind, value, tb) -> None:
        sys.stderr.write(redact_secrets("".join(traceback.format_exception(kind, value, tb))))

    sys.excepthook = hook


def console() -> None:
    """The command as a shell runs it. Once main has answered, a Ctrl-C has nothing left to stop,
    and one pressed while the interpreter exits (Ray's atexit shutdown of its local instance
    sleeps) printed a traceback after our last line: so the exit ignores it."""
    redact_tracebacks()
    redeliver_lost_interrupts()
    # A scheduler (systemd, Kubernetes, a CronJob's deadline) stops a command with SIGTERM: it stops
    # as on Ctrl-C, recording what it leaves resumable (docs/guide/faults.md#stopping).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if runs_trials(sys.argv[1:]):
        sys.stdout, sys.stderr = (
            OutlivesItsReader(sys.stdout, "stdout"),
            OutlivesItsReader(sys.stderr, "stderr"),
        )
    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)
