"""A full disk as a fault, like a lost node (docs/guide/faults.md#a-disk-fills-up): the launch stops
while there is still room for what it writes next, so that every checkpoint and Tune's snapshot
land whole and `orchestrator resume` continues once space is freed. Another writer may fill the
disk between two checks: a write that then fails stops the launch the same way (as_disk_full), and
Tune's snapshot, which Tune copies onto its storage in place, keeps a whole copy of each of its
files beside it (KEPT), which resume puts back over one cut short (put_back_whole)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickletools
import time
from pathlib import Path

import pyarrow.fs
from ray.tune import Callback

from ..record.files import write_atomically
from ..record.retries import DiskFull, disk_full

MIB = 1 << 20
FLOOR = MIB  # room kept before anything is measured (and beside what is): SQLite's journal, a log line
CHECK_EVERY_S = 1.0
KEPT = ".whole"  # in a local Tune experiment's folder: the last whole copy of each file of its snapshot
# The share of the driver's time the whole copies may take, as Tune's own snapshot's (its
# TUNE_GLOBAL_CHECKPOINT_S auto): a copy reads and checks the whole snapshot, which grows with the
# trials, so the next waits 1 / KEEP_SHARE times as long as the last took.
KEEP_SHARE = 0.05


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


def as_disk_full(error: BaseException) -> DiskFull | None:
    """A DiskFull for an error whose chain says a disk is full (a write of Tune's, a trial's
    checkpoint, a file of the launch), naming the file where the error does; else None."""
    full = disk_full(error)
    if full is None:
        return None
    where = getattr(full, "filename", None)
    return DiskFull(f"{where}: its disk is full" if where else f"a disk is full ({full})")


def snapshot_files(experiment: Path) -> list[Path]:
    """The files Tune restores a local experiment from (the .json and .pkl files its
    sync_down_experiment_state takes): its trials' states, its searcher's and its callbacks'; not
    the temporaries of its writes (".<uuid>-tmp-searcher-state-...")."""
    with contextlib.suppress(FileNotFoundError), os.scandir(experiment) as entries:
        # a directory entry says whether it is a file: the folder's thousands of trial folders
        # (one a trial) are not each asked
        return sorted(
            experiment / e.name
            for e in entries
            if e.name.endswith((".json", ".pkl")) and not e.name.startswith(".") and e.is_file()
        )
    return []


def snapshot_size(experiment: Path) -> int:
    size = 0
    for path in snapshot_files(experiment):
        with contextlib.suppress(FileNotFoundError):  # one Tune has just replaced
            size += path.stat().st_size
    return size


def whole(path: Path) -> bytes | None:
    """The contents of a file of Tune's snapshot where they are whole, else None: a pickle that
    reaches its end (whatever its name says: search_gen_state-*.json is one), else JSON that
    parses. A copy cut short by a full disk is a prefix of the file."""
    try:
        data = path.read_bytes()
        if data[:1] == b"\x80":  # the PROTO opcode every pickle of protocol 2 or later begins with
            for _ in pickletools.genops(data):
                pass
        else:
            json.loads(data)
    except (OSError, ValueError):
        return None
    return data


def keep_whole(experiment: Path, kept: dict[str, tuple[int, int]]) -> None:
    """A copy in KEPT of each file of the snapshot that changed since its last copy (`kept`: name ->
    (mtime, size) copied) and is whole: one Tune is copying onto the storage now is not, and
    waits for the next call. A copy the disk has no room for leaves the one before."""
    for path in snapshot_files(experiment):
        try:
            found = path.stat()
            if kept.get(path.name) == (found.st_mtime_ns, found.st_size) or (data := whole(path)) is None:
                continue
            (experiment / KEPT).mkdir(exist_ok=True)
            write_atomically(experiment / KEPT / path.name, data)
        except OSError:  # a full disk (DiskWatch stops the launch), or a file Tune has just removed
            continue
        kept[path.name] = (found.st_mtime_ns, found.st_size)


def put_back_whole(experiment: Path) -> list[str]:
    """Each file of a local experiment's snapshot that is not whole (a full disk cut Tune's copy of
    it short) replaced by its last whole copy (KEPT), where there is one. -> the files put back."""
    put_back = []
    for path in snapshot_files(experiment):
        if whole(path) is None and (data := whole(experiment / KEPT / path.name)) is not None:
            write_atomically(path, data)
            put_back.append(path.name)
    return put_back


class DiskWatch(Callback):
    """Stops the launch (DiskFull, which the driver reports as a resumable stop, exit 4) once a
    local disk it writes to has less free space than the next round of writes needs: a checkpoint
    per running trial (the largest seen) and Tune's snapshot, twice over (Tune writes the new one
    before it deletes the old), plus FLOOR. `places`: what -> local folder (trial storage, the
    SQLite store's folder, the launch folder); an object store is not watched. `experiment`: the
    local folder of the Tune experiment, whose snapshot it keeps a whole copy of (keep_whole)."""

    def __init__(self, places: dict[str, Path], experiment: str | None):
        self.places, self.experiment = places, experiment
        self.largest_checkpoint, self.last_check, self.next_keep = 0, 0.0, 0.0
        self.kept: dict[str, tuple[int, int]] = {}

    def __getstate__(self):  # pickled with the tuner: measured afresh on resume
        return {"places": self.places, "experiment": self.experiment}

    def __setstate__(self, state):
        self.__init__(**state)

    def needed(self, running: int) -> int:
        snapshot = snapshot_size(Path(self.experiment)) if self.experiment is not None else 0
        return 2 * (self.largest_checkpoint * max(running, 1) + snapshot) + FLOOR

    def check(self, trials) -> None:
        self.last_check = time.monotonic()
        needed = self.needed(sum(1 for t in trials if t.status == "RUNNING"))
        for what, folder in self.places.items():
            free = free_bytes(folder)
            if free is not None and free < needed:
                raise DiskFull(
                    f"{what} {folder}: {mib(free)} free, less than the {mib(needed)} the launch writes next "
                    "(a checkpoint per running trial and Tune's snapshot, twice over)"
                )

    def on_step_begin(self, iteration, trials, **info):
        if time.monotonic() - self.last_check < CHECK_EVERY_S:
            return
        self.check(trials)
        if self.experiment is not None and time.monotonic() >= self.next_keep:
            began = time.monotonic()
            keep_whole(Path(self.experiment), self.kept)
            self.next_keep = time.monotonic() + (time.monotonic() - began) / KEEP_SHARE

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        if checkpoint.filesystem.type_name == "local":
            self.largest_checkpoint = max(
                self.largest_checkpoint, tree_size(checkpoint.filesystem, checkpoint.path)
            )
        self.last_check = -math.inf  # checked as the next step begins: Tune logs, and drops, an error here

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.check(trials)  # a write that failed for want of space fails the trial

    def on_trial_error(self, iteration, trials, trial, **info):
        self.check(trials)
