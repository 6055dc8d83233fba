"""Store calls retried while a store is unreachable: which errors are transient, the retry with
backoff, and the one-line notices that stand for the libraries' logged tracebacks."""

from __future__ import annotations

import functools
import math
import re
import time

RETRY_DELAYS_S = (0.5, 1, 2, 4, 8, 16)  # a store that drops connections gets about 30 s to come back


class StoreUnavailable(RuntimeError):
    """A store stayed unreachable through every retry."""


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


def store_outage(error: BaseException) -> str | None:
    """The one-line reason if `error` (as Tune re-raises it) comes from a store outage."""
    seen = error
    while seen is not None:
        if isinstance(seen, StoreUnavailable):
            return str(seen)
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
    line = (str(error).strip().splitlines() or [""])[0]
    return re.sub(r"^\([\w.]+\)(?: |$)", "", line).strip()[:200] or type(error).__name__


def retried(method, what: str, reset=None):
    """`method`, called again with backoff while the store is unreachable (after `reset(*args)`,
    where given); StoreUnavailable once RETRY_DELAYS_S are spent."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        for delay in (*RETRY_DELAYS_S, None):
            try:
                return method(*args, **kwargs)
            except Exception as e:
                if not transient(e):
                    raise
                if delay is None:
                    raise StoreUnavailable(
                        f"{what} unreachable for {sum(RETRY_DELAYS_S):.0f} s "
                        f"({len(RETRY_DELAYS_S) + 1} tries): {first_line(e)}"
                    ) from e
                NOTICES.retrying(what, first_line(e), delay)
                time.sleep(delay)
                if reset is not None:
                    reset(*args)

    return call
