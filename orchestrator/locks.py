"""Whether a launch's driver is alive, without importing Ray or MLflow (`list` and `status` stay fast)."""
from __future__ import annotations

import fcntl
from pathlib import Path


def driver_alive(launch_dir: Path) -> bool:
    """Whether a driver on this machine holds the launch's lock (a dead driver's lock is released)."""
    lock = launch_dir / "driver.lock"
    if not lock.exists():
        return False
    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False
