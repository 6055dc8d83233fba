"""Store calls retried while a store is unreachable: which errors are transient, the retry with
backoff, and the one-line notices that stand for the libraries' logged tracebacks."""

from __future__ import annotations

import errno
import functools
import math
import os
import re
import sqlite3
import time

RETRY_DELAYS_S = (0.5, 1, 2, 4, 8, 16)  # a store that drops connections gets about 30 s to come back
RETRY_WINDOW_ENV = "SYSGEN_STORE_RETRY_S"  # docs/guide/faults.md#store-outages
SQLITE_FULL = 13  # sqlite3.h: "Insertion failed because database is full"


class StoreUnavailable(RuntimeError):
    """A store stayed unreachable through every retry."""


class DiskFull(StoreUnavailable):
    """A disk the launch writes to (trial storage, the store's, the launch folder) is full: a fault
    like an outage (the launch stops, resumable), not one a retry mends within seconds."""


def retry_delays() -> tuple[float, ...]:
    """The pauses between a store call's tries: RETRY_DELAYS_S, or doubling from 0.5 s over the
    window SYSGEN_STORE_RETRY_S sets (a cluster whose database fails over in minutes); ValueError
    where that is not a number of seconds."""
    window = os.environ.get(RETRY_WINDOW_ENV)
    if window is None:
        return RETRY_DELAYS_S
    try:
        left = float(window)
    except ValueError:
        raise ValueError(f"{RETRY_WINDOW_ENV}={window!r}: expected a number of seconds") from None
    if not math.isfinite(left) or left < 0:
        raise ValueError(f"{RETRY_WINDOW_ENV}={window!r}: expected a number of seconds, 0 or more")
    delays, delay = [], 0.5
    while left > 0:
        delays.append(min(delay, left))
        left, delay = left - delays[-1], delay * 2
    return tuple(delays)


def disk_full(error: BaseException) -> BaseException | None:
    """The error in `error`'s chain that says a disk is full (ENOSPC, a quota, SQLite's FULL), or None."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return seen
        if isinstance(seen, sqlite3.Error) and getattr(seen, "sqlite_errorcode", None) == SQLITE_FULL:
            return seen
        seen = getattr(seen, "orig", None) or seen.__cause__ or seen.__context__
    return None


def transient(error: BaseException) -> bool:
    """Whether an error means "the store is unreachable right now" (worth retrying) rather than a
    request it refused."""
    # Here, not at the top: MLflow takes seconds to import, which only a failed store call needs.
    import sqlalchemy.exc  # noqa: PLC0415
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    seen = error
    while seen is not None:
        if isinstance(seen, StoreUnavailable):  # an inner call has already retried for the whole budget
            return False
        if isinstance(
            seen,
            (
                sqlalchemy.exc.OperationalError,
                sqlalchemy.exc.InterfaceError,
                sqlalchemy.exc.PendingRollbackError,
                ConnectionError,
                TimeoutError,
            ),
        ):
            # PendingRollbackError: a session whose connection dropped mid-transaction (retried() may
            # reset it)
            return True
        if isinstance(seen, MlflowException) and seen.error_code == "TEMPORARILY_UNAVAILABLE":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def store_outage(error: BaseException) -> StoreUnavailable | None:
    """The StoreUnavailable (an outage, a full disk) that `error` (as Tune re-raises it) comes from."""
    seen = error
    while seen is not None:
        if isinstance(seen, StoreUnavailable):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class RetryNotices:
    """Our line for a store fault being retried, in place of the library's ERROR log and traceback
    (MLflow logs every failed query before raising it to us): at most one every `every_s`, so a burst
    of dropped connections reads as a few lines, each counting the retries it stands for."""

    def __init__(self, every_s: float = 10.0):
        self.every_s, self.last, self.unsaid = every_s, -math.inf, 0

    def retrying(self, what: str, reason: str, delay: float) -> None:
        self.unsaid += 1
        now = time.monotonic()
        if now - self.last >= self.every_s:
            burst = f" ({self.unsaid} calls retried since the last notice)" if self.unsaid > 1 else ""
            print(f"[store] {what}: {reason}; retrying in {delay:g} s{burst}", flush=True)
            self.last, self.unsaid = now, 0


NOTICES = RetryNotices()


def first_line(error: BaseException) -> str:
    """The reason a store call failed: the first line of the innermost error (the driver's, not a
    wrapper's such as Optuna's "An exception is raised during the commit ... invalid data"),
    without SQLAlchemy's "(psycopg.errors.AdminShutdown) " prefix; its type's name where that
    leaves nothing (a bare TimeoutError, a driver's prefix alone), not an empty reason."""
    while (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    error = getattr(error, "orig", None) or error
    line = re.sub(r"^\([\w.]+\)(?: |$)", "", (str(error).strip().splitlines() or [""])[0]).strip()
    return line[:200] if re.search(r"\w", line) else type(error).__name__  # "()" says nothing


def retried(method, what: str, reset=None):
    """`method`, called again with backoff while the store is unreachable (after `reset(*args)`,
    where given); StoreUnavailable once retry_delays() are spent, DiskFull at once where the
    store's disk is full."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        delays = retry_delays()
        for delay in (*delays, None):
            try:
                return method(*args, **kwargs)
            except Exception as e:
                if full := disk_full(e):
                    if isinstance(e, DiskFull):
                        raise
                    raise DiskFull(f"{what}: its disk is full ({first_line(full)})") from e
                if not transient(e):
                    raise
                if delay is None:
                    raise StoreUnavailable(
                        f"{what} unreachable for {sum(delays):.0f} s ({len(delays) + 1} tries): "
                        f"{first_line(e)}"
                    ) from e
                NOTICES.retrying(what, first_line(e), delay)
                time.sleep(delay)
                if reset is not None:
                    reset(*args)

    return call
