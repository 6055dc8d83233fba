"""A full disk as a fault, like a lost node (docs/guide/faults.md#a-disk-fills-up): the launch stops
while there is still room for what it writes next, so that every checkpoint and Tune's snapshot
land whole and `orchestrator resume` continues once space is freed. Writing until ENOSPC instead
failed every trial three times, cut Tune's snapshot short and crashed the driver."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pyarrow.fs
from ray.tune import Callback

from ..record.retries import DiskFull

MIB = 1 << 20
FLOOR = MIB  # room kept before anything is measured (and beside what is): SQLite's journal, a log line
CHECK_EVERY_S = 1.0


def mib(size: float) -> str:
    return f"{size / MIB:.2f} MiB"


def free_bytes(folder: Path) -> int | None:
    """Bytes an unprivileged writer may still use where `folder` (or its nearest existing ancestor)
    lives; None where that cannot be asked."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        found = os.statvfs(folder)
    except OSError:
        return None
    return found.f_bavail * found.f_frsize


def least_free(places: dict[str, Path]) -> str:
    """ "<what> <folder>: <n> MiB free" for the place with the least free space, or ""."""
    found = [
        (free, what, folder) for what, folder in places.items() if (free := free_bytes(folder)) is not None
    ]
    if not found:
        return ""
    free, what, folder = min(found, key=lambda f: f[0])
    return f"{what} {folder}: {mib(free)} free"


def tree_size(fs, path: str) -> int:
    """Bytes of the files under `path` on `fs` (a pyarrow filesystem)."""
    found = fs.get_file_info(pyarrow.fs.FileSelector(path, recursive=True, allow_not_found=True))
    return sum(f.size or 0 for f in found if f.type == pyarrow.fs.FileType.File)


class DiskWatch(Callback):
    """Stops the launch (DiskFull, which the driver reports as a resumable stop, exit 4) once a
    local disk it writes to has less free space than the next round of writes needs: a checkpoint
    per running trial (the largest seen) and Tune's snapshot, twice over (Tune writes the new one
    before it deletes the old), plus FLOOR. `places`: what -> local folder (trial storage, the
    SQLite store's folder, the launch folder); an object store is not watched."""

    def __init__(self, places: dict[str, Path], experiment: str | None):
        self.places, self.experiment = places, experiment
        self.largest_checkpoint, self.last_check = 0, 0.0

    def __getstate__(self):  # pickled with the tuner: measured afresh on resume
        return {"places": self.places, "experiment": self.experiment}

    def __setstate__(self, state):
        self.__init__(**state)

    def needed(self, running: int) -> int:
        snapshot = 0
        if self.experiment is not None:
            found = pyarrow.fs.LocalFileSystem().get_file_info(
                pyarrow.fs.FileSelector(self.experiment, allow_not_found=True)
            )
            snapshot = sum(f.size or 0 for f in found if f.type == pyarrow.fs.FileType.File)
        return 2 * (self.largest_checkpoint * max(running, 1) + snapshot) + FLOOR

    def check(self, trials, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_check < CHECK_EVERY_S:
            return
        self.last_check = now
        needed = self.needed(sum(1 for t in trials if t.status == "RUNNING"))
        for what, folder in self.places.items():
            free = free_bytes(folder)
            if free is not None and free < needed:
                raise DiskFull(
                    f"{what} {folder}: {mib(free)} free, less than the {mib(needed)} the launch writes next "
                    "(a checkpoint per running trial and Tune's snapshot, twice over)"
                )

    def on_step_begin(self, iteration, trials, **info):
        self.check(trials)

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        if checkpoint.filesystem.type_name == "local":
            self.largest_checkpoint = max(
                self.largest_checkpoint, tree_size(checkpoint.filesystem, checkpoint.path)
            )
        self.last_check = -math.inf  # checked as the next step begins: Tune logs, and drops, an error here

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.check(trials, force=True)  # a write that failed for want of space fails the trial

    def on_trial_error(self, iteration, trials, trial, **info):
        self.check(trials, force=True)
