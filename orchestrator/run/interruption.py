"""Ctrl-C and SIGTERM while a phase's Tune run goes: Tune stops calmly, saving every trial's state,
and the console says so in our words.
"""

from __future__ import annotations

import logging
import signal


class CalmStop(logging.Filter):
    """Ctrl-C as a user sees it, for the span of a phase. Tune stops at the first SIGINT, saving
    its state, then puts back the SIGINT handler it found: this one, which answers further Ctrl-Cs
    with a line instead of a KeyboardInterrupt in the middle of that save. Tune's own lines about
    the stop (they invite a second Ctrl-C and name Tuner.restore, not `orchestrator resume`) become
    ours. SIGTERM (a scheduler's stop) is taken as SIGINT."""

    def __init__(self):
        super().__init__()
        self.stopping = False
        self.tune_log = logging.getLogger("ray.tune.tune")

    def __enter__(self):
        self.previous = {
            sig: signal.signal(sig, handler)
            for sig, handler in (
                (signal.SIGINT, self.on_sigint),
                (signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT)),
            )
        }
        self.tune_log.addFilter(self)
        return self

    def __exit__(self, *exc):
        self.tune_log.removeFilter(self)
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Stop signal received"):
            self.stopping = True
            print("[launch] stopping: saving every trial's state (a few seconds)", flush=True)
            return False
        return not message.startswith("Experiment has been interrupted")

    def on_sigint(self, signum, frame) -> None:
        if not self.stopping:
            raise KeyboardInterrupt
        print("[launch] still saving the launch's state; it stops by itself in a moment", flush=True)
