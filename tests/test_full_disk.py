"""A disk filled to the last byte by another writer while a launch runs (docs/guide/faults.md#a-disk-
fills-up), caused for real: a small tmpfs in a mount namespace of its own (nothing mounted on the
machine, nothing left mounted by a test that fails) holding the SQLite stores, the launch folder and
the trial storage. The launch stops in one line, exit 4; once space is freed, resume runs every pair
to its budget and leaves no run or Optuna trial RUNNING."""

import errno
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.fs
import pytest
import yaml
from test_edges import audit
from test_service import foreign_lines, spec

from orchestrator.run.disk import KEPT, keep_whole, whole
from orchestrator.run.tuner import has_snapshot

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")]


class PrivateDisk:
    """A tmpfs of `size` at `folder`, seen by the commands `run` starts (in the mount namespace of a
    process holding it) and by the test through `outside` (/proc/<holder>/root)."""

    def __init__(self, folder: Path, size: str):
        folder.mkdir(parents=True)
        self.folder = folder
        self.holder = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f'mount -t tmpfs -o size={size} tmpfs "{folder}" && echo mounted && exec sleep infinity',
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.holder.stdout.readline() == "mounted\n"

    def outside(self, path: Path) -> Path:
        return Path(f"/proc/{self.holder.pid}/root{path}")

    def command(self, *args) -> list[str]:
        return [
            "nsenter",
            f"--mount=/proc/{self.holder.pid}/ns/mnt",
            f"--wd={self.folder.parent}",
            sys.executable,
            "-m",
            "orchestrator.cli",
            *args,
        ]

    def run(self, *args) -> subprocess.CompletedProcess:
        """`orchestrator ARGS` in the disk's namespace. Its output goes to a file: a pipe would be
        held open past a timeout by the Ray processes it started."""
        log = self.folder.parent / f"{args[0]}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
        with open(log, "w") as out:
            done = subprocess.run(
                self.command(*args), stdout=out, stderr=subprocess.STDOUT, env=env, timeout=300
            )
        return subprocess.CompletedProcess(args, done.returncode, log.read_text())

    def close(self) -> None:
        self.holder.kill()  # the namespace, and its tmpfs, go with its last process
        self.holder.wait()


class Filler(threading.Thread):
    """Another job's writer: once `ready()` holds, fills the disk of `folder` to its last byte and
    keeps it full (taking whatever the launch frees) until stopped; then removes its file."""

    def __init__(self, folder: Path, ready):
        super().__init__(daemon=True)
        self.path, self.ready = folder / "filler", ready
        self.full, self.stopping = threading.Event(), threading.Event()

    def run(self) -> None:
        while not self.ready():
            if self.stopping.wait(0.05):
                return
        with open(self.path, "wb", buffering=0) as f:
            while not self.stopping.is_set():
                if not self.top_up(f):
                    self.full.set()
                    self.stopping.wait(0.02)

    @staticmethod
    def top_up(f) -> bool:
        """Writes what still fits; False once nothing does (0 bytes free)."""
        wrote = False
        for chunk in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    f.write(b"\0" * chunk)
                    wrote = True
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
        return wrote

    def stop(self) -> None:
        self.stopping.set()
        self.join()
        self.path.unlink(missing_ok=True)


def cut_short(snapshot: Path, staging: Path) -> None:
    """A larger snapshot copied over `snapshot` on its full disk as Tune copies it onto its storage
    (pyarrow's copy_files, in place): the copy fails, leaving a prefix of the new file."""
    bigger = staging / snapshot.name
    bigger.write_text(json.dumps({"padding": "x" * (1 << 20), **json.loads(snapshot.read_text())}))
    with pytest.raises(OSError, match="No space left on device"):
        pyarrow.fs.copy_files(str(bigger), str(snapshot))
    assert whole(snapshot) is None


def test_a_disk_filled_to_the_last_byte_stops_the_launch_and_resume_finishes_it(tmp_path):
    """The store, the launch folder and the trial storage share a 64 MB disk that another writer
    fills to 0 bytes free once the first trials have checkpointed and Tune has written its snapshot,
    and keeps full: one line, exit 4, no traceback; launch.json interrupted, or, where its disk took
    no write, `status` shows the driver gone. Space freed, resume runs every pair to its budget."""
    disk = PrivateDisk(tmp_path / "disk", "64M")
    filler = None
    try:
        uri = f"sqlite:///{disk.folder}/mlflow.db"
        path = spec(tmp_path, uri, trials=2, concurrent=2, n_iters=40, eval_every=20, models=("ndr",))
        data = yaml.safe_load(path.read_text())
        data["storage_path"] = str(disk.folder / "runs")
        path.write_text(yaml.safe_dump(data))
        runs = disk.outside(disk.folder / "runs")

        def checkpointed() -> bool:  # a trial has checkpointed, and Tune's snapshot has its whole copy
            return bool(list(runs.glob(f"*/tune/{KEPT}/experiment_state-*.json"))) and bool(
                list(runs.glob("*/tune/*/checkpoint_*"))
            )

        filler = Filler(disk.outside(disk.folder), checkpointed)
        filler.start()
        started = time.monotonic()
        launched = disk.run("launch", str(path))
        out = launched.stdout
        assert filler.full.is_set(), out[-3000:]
        print(f"launch stopped after {time.monotonic() - started:.0f} s\n{out}")
        assert launched.returncode == 4, out[-3000:]
        assert foreign_lines(out, path) == [], out[-3000:]
        last = out.strip().splitlines()[-1]
        assert re.fullmatch(
            r"orchestrator: error: .*: 0\.00 MiB free.*; every trial is checkpointed: free space, then "
            r"continue with `orchestrator resume \S+`",
            last,
        ), last
        launch_dir = next(runs.glob("*/launch.json")).parent
        inside_dir = disk.folder / "runs" / launch_dir.name
        recorded = json.loads((launch_dir / "launch.json").read_text())["state"]
        print(f"launch.json: {recorded}")
        assert recorded in ("interrupted", "running")
        status = disk.run("status", str(inside_dir))
        assert status.returncode == 0 and "Traceback" not in status.stdout, status.stdout
        if recorded == "running":
            assert "driver" in status.stdout.splitlines()[0], status.stdout

        # Tune's copy of its snapshot onto the full disk may have been cut short already; else its
        # next one, in place as Tune makes it, is.
        snapshot = max(launch_dir.glob("tune/experiment_state-*.json"))
        print(f"Tune's snapshot {'whole' if whole(snapshot) else 'cut short by Tune'} as the launch stopped")
        if whole(snapshot) is not None:
            cut_short(snapshot, tmp_path)
        still_full = disk.run("resume", str(inside_dir))  # a fault still there: exit 4, nothing started
        lines = still_full.stdout.strip().splitlines()
        assert still_full.returncode == 4 and "No space left on device" in lines[-1], still_full.stdout
        assert lines[-1].endswith("once space is freed"), lines[-1]
        assert foreign_lines(still_full.stdout, path) == [], still_full.stdout
        filler.stop()
        filler = None
        resumed = disk.run("resume", str(inside_dir))
        print(f"launch and resume took {time.monotonic() - started:.0f} s\n{resumed.stdout}")
        assert resumed.returncode == 0, resumed.stdout[-3000:]
        assert f"{snapshot.name} was cut short by a full disk: resuming from its whole copy" in resumed.stdout
        assert foreign_lines(resumed.stdout, path) == [], resumed.stdout[-3000:]
        # Read from copies: SQLite resolves /proc/<holder>/root to / (the host's folder, not the tmpfs).
        copies = tmp_path / "stores"
        copies.mkdir()
        for name in ("mlflow.db", "mlflow.optuna.db"):
            shutil.copyfile(disk.outside(disk.folder / name), copies / name)
        audit(
            f"sqlite:///{copies}/mlflow.db",
            f"sqlite:///{copies}/mlflow.optuna.db",
            data["name"],
            ["tiny__ndr"],
            2,
            [20, 40],
        )
    finally:
        try:
            if filler is not None:
                filler.stop()
        finally:
            disk.close()


def test_a_snapshot_cut_short_by_a_full_disk_is_put_back_from_its_whole_copy(tmp_path):
    """Tune copies its snapshot onto the storage in place (pyarrow's copy_files): on a full disk the
    copy is cut short where the old file's space ran out. Its last whole copy stays, and is put
    back as the launch resumes."""
    disk = PrivateDisk(tmp_path / "disk", "1M")
    try:
        experiment = disk.outside(disk.folder / "tune")
        experiment.mkdir()
        state = experiment / "experiment_state-2026-12-07_02-00-00.json"
        state.write_text(json.dumps({"trial_data": [["a" * 100] * 100]}))
        searcher = experiment / "searcher-state-2026-12-07_02-00-00.pkl"
        searcher.write_bytes(pickle.dumps(list(range(1000))))
        generator = experiment / "search_gen_state-2026-12-07_02-00-00.json"  # a pickle, whatever its name
        generator.write_bytes(pickle.dumps({"counter": 4}))
        kept = {}
        keep_whole(experiment, kept)
        assert {p.name for p in (experiment / KEPT).iterdir()} == {state.name, searcher.name, generator.name}
        first = state.read_bytes()
        with open(disk.outside(disk.folder / "filler"), "wb", buffering=0) as f:
            Filler.top_up(f)
        cut_short(state, tmp_path)
        keep_whole(experiment, kept)  # a snapshot cut short is not copied over the whole one
        assert (experiment / KEPT / state.name).read_bytes() == first

        disk.outside(disk.folder / "filler").unlink()
        assert has_snapshot(str(experiment), None)
        assert state.read_bytes() == first and whole(searcher) and whole(generator)
    finally:
        disk.close()
