"""Faults at the edges of a launch, caused for real: SIGTERM from a scheduler, a PostgreSQL store that
refuses connections when a resume starts, a port where something other than Ray answers, a full disk
(docs/guide/faults.md). Each audits MLflow and Optuna afterwards: nothing lost, duplicated or over
budget, exit statuses as documented."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import yaml
from nodes import leave_free
from test_service import foreign_lines, optuna_trial_states, orchestrator, spec, trial_runs

from orchestrator.plan.storage import StorageError, TrialStorage, _write_marker
from orchestrator.record.state import DamagedLaunch
from orchestrator.record.stores import refused_for_now
from orchestrator.run.tuner import has_snapshot

pytestmark = pytest.mark.slow


def popen_cli(*args, cwd, env_extra=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def read_until(driver: subprocess.Popen, text: str, timeout_s: float = 300) -> str:
    seen, deadline = [], time.time() + timeout_s
    for line in driver.stdout:
        seen.append(line)
        if text in line or time.time() > deadline:
            break
    return "".join(seen)


def allow_connections(admin, database: str, allowed: bool) -> None:
    admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS {str(allowed).lower()}")
    if not allowed:
        admin.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}'")


@pytest.mark.long
def test_sigterm_stops_a_launch_and_a_resume_in_an_outage_waits_for_the_store(tmp_path, postgres_database):
    """SIGTERM (a scheduler's stop) stops the driver as Ctrl-C does: exit 130, resumable. A resume
    that starts while the database refuses connections exits 4 once its retry window is spent (not
    2, which a scheduler never retries); one whose outage ends within the window waits, says that
    the file changed since, and finishes the recorded plan: 3 runs and 3 Optuna trials, each
    evaluation logged once."""
    db = postgres_database
    path = spec(tmp_path, db.uri, trials=3, concurrent=1, n_iters=200, eval_every=100)
    experiment = yaml.safe_load(path.read_text())["name"]
    driver = popen_cli("launch", str(path), cwd=tmp_path)
    read_until(driver, "runs ended 1/")
    driver.send_signal(signal.SIGTERM)  # the driver alone: a process group's SIGTERM stops Ray's own too
    rest, _ = driver.communicate(timeout=120)
    assert driver.returncode == 130, rest[-3000:]
    launch_dir = next((tmp_path / "runs").glob("*/launch.json")).parent
    assert json.loads((launch_dir / "launch.json").read_text())["state"] == "interrupted"

    allow_connections(db.admin, db.name, False)
    refused = orchestrator(
        "resume", str(launch_dir), cwd=tmp_path, check=False, env_extra={"SYSGEN_STORE_RETRY_S": "0"}
    )
    assert refused.returncode == 4, refused.stderr
    assert refused.stderr.count("\n") == 1 and refused.stderr.endswith(
        "nothing was started: run the command again once the store answers\n"
    )

    path.write_text(path.read_text().replace("trials: 3", "trials: 2"))  # the plan stays launch.json's
    resume = popen_cli("resume", str(launch_dir), cwd=tmp_path, env_extra={"SYSGEN_STORE_RETRY_S": "60"})
    waited = read_until(resume, "[store] tracking store ", timeout_s=120)
    assert "retrying in" in waited, waited
    allow_connections(db.admin, db.name, True)
    rest, _ = resume.communicate(timeout=600)
    out = waited + rest
    assert resume.returncode == 0, out[-3000:]
    assert (
        f"[resume] {path} changed since {launch_dir.name} began (budget.trials: 3 -> 2): the launch goes on "
        "with the plan it began with (launch.json); launch the file again to run the new one"
    ) in out
    assert foreign_lines(out, path) == [], out[-3000:]
    client, parents, runs = trial_runs(db.uri, experiment)
    runs = [r for r in runs if r.data.tags["trial_status"] != "lost"]
    assert len(parents) == 1 and len(runs) == 3 and len({r.data.tags["trial_id"] for r in runs}) == 3
    assert all(r.data.tags["trial_status"] == "completed" for r in runs)
    optuna_store = optuna.storages.RDBStorage(
        db.uri, engine_kwargs={"connect_args": {"options": "-csearch_path=optuna"}}
    )
    assert optuna_trial_states(optuna_store, experiment) == {"tiny__ndr": ["COMPLETE"] * 3}
    for run in runs:
        assert [m.step for m in client.get_metric_history(run.info.run_id, "ood_valid_acc")] == [100, 200]


def test_a_store_refused_for_good_is_told_from_an_outage(postgres_database):
    """By what the server answers, not the words of the driver's error."""
    db = postgres_database
    error = RuntimeError("the driver's error: its words are not read")
    base = "postgresql+psycopg://postgres@127.0.0.1"
    assert not refused_for_now(f"{base}:5432/no_such_database_here", error)
    assert not refused_for_now(f"postgresql+psycopg://no_such_role@127.0.0.1:5432/{db.name}", error)
    assert refused_for_now(f"{base}:1/{db.name}", error)  # nothing listens: down
    allow_connections(db.admin, db.name, False)
    assert refused_for_now(db.uri, error)  # connections disallowed for a while
    allow_connections(db.admin, db.name, True)


class NotRay:
    """A TCP server on a loopback port that answers as Redis does to anything it does not know."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.recv(64)
                conn.sendall(b"-ERR unknown command 'PRI'\r\n")


def test_an_address_where_ray_does_not_answer_is_one_line_within_seconds(tmp_path):
    server = NotRay()
    path = spec(tmp_path, f"sqlite:///{tmp_path}/mlflow.db")
    started = time.monotonic()
    out = orchestrator(
        "launch", str(path), "--address", f"127.0.0.1:{server.port}", cwd=tmp_path, check=False
    )
    assert time.monotonic() - started < 60  # the CLI's own imports; the check itself takes milliseconds
    assert out.returncode == 2 and out.stderr == (
        f"orchestrator: error: --address: 127.0.0.1:{server.port} is not a Ray cluster's head: it answered "
        "b\"-ERR unknown command 'PRI'\"\n"
    )
    assert not (tmp_path / "runs").exists()
    server.server.close()


@contextlib.contextmanager
def small_disk(folder: Path, size: str):
    """A tmpfs of `size` at `folder` (root only: CI runs as root)."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_a_storage_check_on_a_full_disk_leaves_no_marker(tmp_path):
    with small_disk(tmp_path / "disk", "64k") as disk:
        leave_free(disk, 0)
        with pytest.raises(StorageError, match="No space left on device"):
            _write_marker(TrialStorage(str(disk / "st")), "storage")
        assert not list(disk.rglob(".sysgen-storage-check-*"))


def audit(uri: str, optuna_store, experiment: str, pairs: list[str], trials: int, steps: list[int]) -> None:
    """Every pair ran exactly its budget: one completed run and one COMPLETE Optuna trial per trial,
    no run duplicated or left RUNNING, every evaluation logged once."""
    client, parents, runs = trial_runs(uri, experiment)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert not [r for r in runs if r.info.status == "RUNNING"]
    runs = [r for r in runs if r.data.tags["trial_status"] != "lost"]
    for pair in pairs:
        own = [r for r in runs if r.data.tags["pair"] == pair]
        assert len(own) == trials and len({r.data.tags["trial_id"] for r in own}) == trials, pair
        assert all(r.data.tags["trial_status"] == "completed" for r in own), pair
        for run in own:
            assert [m.step for m in client.get_metric_history(run.info.run_id, "ood_valid_acc")] == steps
    assert optuna_trial_states(optuna_store, experiment) == {pair: ["COMPLETE"] * trials for pair in pairs}


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
@pytest.mark.long  # 80-100 s each; test_full_disk (default) fills the store's, launch's and trials' disk
@pytest.mark.parametrize("what", ["trial storage", "store"])
def test_a_disk_that_fills_up_stops_the_launch_and_resume_finishes_it(tmp_path, what):
    """Another job fills the disk of the launch's trial storage (or of its SQLite store and launch
    folder) mid-run: the launch stops in one line naming the place and its free space, exit 4,
    recorded interrupted; once space is freed, resume runs every pair to its budget."""
    with small_disk(tmp_path / "disk", "64M") as disk:
        store = disk if what == "store" else tmp_path
        uri = f"sqlite:///{store}/mlflow.db"
        path = spec(tmp_path, uri, trials=3, concurrent=2, n_iters=200, eval_every=50, models=("ndr", "lstm"))
        data = yaml.safe_load(path.read_text())
        data["storage_path"] = str(store / "runs")
        path.write_text(yaml.safe_dump(data))
        storage = ["--storage", str(disk / "st")] if what == "trial storage" else []
        driver = popen_cli("launch", str(path), *storage, cwd=tmp_path)
        read_until(driver, "runs ended 1/")
        filler = leave_free(disk, 256 << 10)
        out, _ = driver.communicate(timeout=300)
        assert driver.returncode == 4, out[-3000:]
        last = out.strip().splitlines()[-1]
        assert re.fullmatch(
            r"orchestrator: error: (.* \S+: 0\.\d\d MiB free, less than the \d+\.\d\d MiB the launch "
            r"writes next .*|tracking store \S+: its disk is full \(database or disk is full\); "
            r".* \S+: 0\.\d\d MiB free)"
            r"; every trial is checkpointed: free space, then continue with `orchestrator resume \S+`",
            last,
        ), last
        assert foreign_lines(out, path) == [], out[-3000:]
        launch_dir = next((store / "runs").glob("*/launch.json")).parent
        # Where the launch folder shares the full disk, launch.json may stay as it was, whole.
        recorded = json.loads((launch_dir / "launch.json").read_text())["state"]
        assert recorded == "interrupted" or what == "store" and recorded == "running"
        if recorded == "running":
            status = orchestrator("status", str(launch_dir), cwd=tmp_path).stdout
            assert "driver" in status.splitlines()[0], status

        filler.unlink()
        resumed = orchestrator("resume", str(launch_dir), cwd=tmp_path)
        assert foreign_lines(resumed.stdout + resumed.stderr, path) == [], resumed.stdout[-3000:]
        audit(
            uri,
            f"sqlite:///{store}/mlflow.optuna.db",
            data["name"],
            ["tiny__ndr", "tiny__lstm"],
            3,
            [50, 100, 150, 200],
        )


def test_a_snapshot_cut_short_is_refused_in_one_line(tmp_path):
    """Tune drops a snapshot it cannot parse and starts the phase again, one trial for a whole
    search: resume refuses instead, saying what to do."""
    (tmp_path / "experiment_state-2026-12-05_10-00-00.json").write_text('{"whole": true}')
    assert has_snapshot(str(tmp_path), None)
    (tmp_path / "experiment_state-2026-12-05_11-00-00.json").write_text('{"trial_data": [["cut')
    with pytest.raises(
        DamagedLaunch,
        match=r"experiment_state-2026-12-05_11-00-00.json: Tune's snapshot .* "
        r"unreadable .*: launch its file again to run its plan afresh$",
    ):
        has_snapshot(str(tmp_path), None)
