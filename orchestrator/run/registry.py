"""A new launch's registration on the driver: its id and folder claimed, its driver.lock held, its
MLflow parent run, and launch.json; and the lock a driver holds while it runs a launch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import os
import socket
import time
from pathlib import Path
from typing import IO

from ..plan.study import Study
from ..record.runs import close_launch, open_launch, running_launch_runs
from ..record.secrets import redact_text
from ..record.state import SNAPSHOT_MODULES, LaunchState, TrackedLaunch, plan_of
from ..record.stores import normalize_store, remember
from .stacking import Stacking, decide


class LaunchExists(RuntimeError):
    """--launch-id names a launch another command registered after this one's check."""


def register(
    study: Study,
    spec_text: str,
    launch_id: str | None = None,
    night: int | None = None,
    stacking: Stacking | None = None,
) -> tuple[LaunchState, IO]:
    """Register a launch: its folder, its driver.lock (held: status sees a driver from the moment
    launch.json is there) and its MLflow parent run. Call only after the spec validated, the store
    answered and the cluster saw the trial storage. `stacking`: as Launch.begin decided it (launch.json
    keeps it); by default the file's alone."""
    launch_id, launch_dir, lock = claim_launch(study, launch_id, night)
    uri = normalize_store(study.tracking.uri)
    # The password stays in this process's memory (stores.reveal); every record of the launch
    # (launch.json, Tune's pickles, MLflow) holds the redacted URI and the redacted file.
    stored_uri = remember(uri)
    spec_text = redact_text(spec_text, uri)
    try:
        end_unregistered_launches(stored_uri, study, launch_id)
        tracked = TrackedLaunch(stored_uri, study.experiment, launch_id)
        parent = open_launch(tracked, str(study.path), spec_text, Path(study.storage_path))
    except BaseException:  # nothing registered: the id's claim goes, so it can be given again
        lock.close()
        raise
    state = LaunchState(
        launch_id,
        launch_dir,
        study.experiment,
        str(study.path),
        spec_text,
        stored_uri,
        parent,
        storage=dataclasses.asdict(study.storage.resolved()),
        plan=plan_of(study),
        night=night,
        created=time.time(),
        **(stacking or decide(study, use_gpu=None)).record(),
        snapshot_modules=SNAPSHOT_MODULES,
    )
    try:
        state.save()
    except BaseException:
        # No launch.json, no launch to resume: its run ends (MLflow showed it RUNNING for good) and
        # the id's claim goes.
        with contextlib.suppress(Exception):
            close_launch(stored_uri, parent, status="KILLED", launch_status="never registered")
        lock.close()
        raise
    return state, lock


def claim_launch(study: Study, launch_id: str | None, night: int | None) -> tuple[str, Path, IO]:
    """(id, folder, its driver.lock held) of a new launch: `launch_id` (--launch-id, which the
    command refused where it named a launch), else the file's name and the second."""
    if launch_id:
        launch_dir = (Path(study.storage_path) / launch_id).resolve()
        launch_dir.mkdir(parents=True, exist_ok=True)
        # Claimed by its lock, which a killed driver leaves free (an empty launch.json claiming the
        # id was left for good, and a RayJob's retry then resumed a "damaged" launch): two launches
        # of one id both passed the check.
        lock = hold_driver_lock(launch_dir)
        if lock is None or (launch_dir / "launch.json").exists():
            if lock:
                lock.close()
            raise LaunchExists(f"launch {launch_id} exists in {study.storage_path}, begun a moment ago")
        return launch_id, launch_dir, lock
    stamped = f"{study.name}-{'' if night is None else 'night-'}{time.strftime('%Y%m%d-%H%M%S')}"
    launch_id, launch_dir = claim_launch_id(Path(study.storage_path), stamped)
    return launch_id, launch_dir, hold_driver_lock(launch_dir)


def claim_launch_id(storage_path: Path, stamped: str) -> tuple[str, Path]:
    """`stamped` (the file's name and the second), or `stamped-2`, ...: the first whose folder this
    launch makes itself. Two launches of one file begun in the same second shared one folder and
    one MLflow parent run."""
    storage_path.mkdir(parents=True, exist_ok=True)
    for k in itertools.count(1):
        launch_id = stamped if k == 1 else f"{stamped}-{k}"
        try:
            (storage_path / launch_id).mkdir()
        except FileExistsError:
            continue
        return launch_id, (storage_path / launch_id).resolve()


def hold_driver_lock(launch_dir: Path) -> IO | None:
    """driver.lock, locked and holding this driver's line, or None where another driver holds it.
    The lock tells a second driver on this machine that this one runs; the heartbeat tells a
    reader on another machine (state.driver). Opened without truncating: a driver that holds it
    keeps its line (two resumes at once)."""
    lock = open(launch_dir / "driver.lock", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    lock.truncate(0)
    lock.write(f"{socket.gethostname()} {os.getpid()}\n")
    lock.flush()
    return lock


def end_unregistered_launches(uri: str, study: Study, launch_id: str) -> None:
    """A driver of this machine killed between creating its launch's run and writing launch.json
    left the run RUNNING in MLflow for good, beside a folder that no command reads (without
    launch.json there is nothing to resume): the next launch of the experiment ends such a run as
    a failed save would have, where no driver holds the folder's lock. (`launch_id`'s own run, left
    so, is the one a launch given that id again with --launch-id takes over.)"""
    for run in running_launch_runs(uri, study.experiment, socket.gethostname()):
        folder = Path(study.storage_path) / run.data.tags["launch_id"]
        if (
            run.data.tags["launch_id"] == launch_id
            or not folder.is_dir()
            or (folder / "launch.json").exists()
        ):
            continue
        lock = hold_driver_lock(folder)
        if lock is None:  # a driver registering this launch now
            continue
        with lock:
            close_launch(uri, run.info.run_id, status="KILLED", launch_status="never registered")
