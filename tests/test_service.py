"""`orchestrator launch | status | best | resume` on a real local Ray instance, with real MLflow stores.

Each test drives the CLI as a user would (a subprocess) and then reads what landed in the store.
"""

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient
from nodes import free_port

from trainables.devices import cpu_kernels
from trainables.tasks import load_task

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
POSTGRES_AS_WRITTEN = "postgresql://postgres@127.0.0.1:5432/test"  # what users write; we add the driver
TASK = {
    "train_size": 600,
    "eval_size": 40,
    "train_depths": [1, 2],
    "ood_valid_depths": [3, 3],
    "test_depths": [4, 4],
}


def spec(
    tmp_path: Path,
    uri: str,
    *,
    trials=3,
    concurrent=2,
    n_iters=20,
    eval_every=10,
    cpu=0.5,
    models=("ndr",),
    **extra,
) -> Path:
    data = {
        "name": f"it-{uuid.uuid4().hex[:8]}",
        "tasks": [{"task": "ctl", "variant": "tiny", "options": TASK}],
        "models": list(models),
        "budget": {
            "trials": trials,
            "max_concurrent": concurrent,
            "n_iters": n_iters,
            "eval_every": eval_every,
        },
        "scheduler": {"name": "fifo"},
        "resources": {"cpu": cpu},
        "fixed": {"batch_size": 16},
        "warm_start": False,
        "space": {
            "lr": {"loguniform": [1e-4, 1e-3]},
            "d_model": {"choice": [16, 32]},
            "n_layers": {"int": [1, 2]},
            "n_heads": {"choice": [1, 2]},
        },
        "tracking": {"uri": uri},
        "storage_path": str(tmp_path / "runs"),
        **extra,
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def orchestrator(*args, cwd, timeout=600, check=True, env_extra=None, **kw):
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", **(env_extra or {})}
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kw,
    )
    if check and out.returncode != 0:
        raise AssertionError(
            f"orchestrator {' '.join(args)} exited "
            f"{out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )
    return out


def foreign_lines(out: str, path: Path) -> list[str]:
    """Console lines that are not ours: ours start with "[launch]", "[<pair> trial ...]", the search
    file's path (the plan), two spaces (a table's rows) or "orchestrator: " (the one line a command
    ends with when it cannot go on or a Ctrl-C stopped it before a launch was registered). A
    traceback, a library's log line or warning shows up here."""
    return [
        line
        for line in out.splitlines()
        if line.strip() and not line.startswith(("[", "  ", f"{path}: ", "orchestrator: "))
    ]


def trial_runs(uri: str, experiment: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "launch"]
    children = [r for r in runs if r.data.tags.get("kind") == "trial"]
    return client, parents, children


@functools.cache
def data_hash(task: str, options: str) -> str:
    return load_task(task, json.loads(options)).data_hash


def check_store_contents(uri: str, path: Path, trials: int, n_iters=20, eval_every=10):
    experiment = yaml.safe_load(path.read_text())["name"]
    client, parents, children = trial_runs(uri, experiment)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == trials
    steps = list(range(eval_every, n_iters + 1, eval_every))
    # MLflow's table groups launch > pair > trials: each trial under its pair's run, each pair's under
    # the launch's.
    pair_runs = {
        r.info.run_id: r
        for r in client.search_runs([parents[0].info.experiment_id], filter_string="tags.kind = 'pair'")
    }
    for run in children:
        pair_run = pair_runs[run.data.tags["mlflow.parentRunId"]]
        assert (
            pair_run.data.tags["pair"] == run.data.tags["pair"]
            and pair_run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        )
        assert pair_run.info.status == "FINISHED"
        for tag in (
            "model",
            "task",
            "variant",
            "launch_id",
            "trial_id",
            "code_version",
            "mlflow.source.git.commit",
            "node",
            "node_id",
            "device",
        ):
            assert run.data.tags.get(tag), tag
        assert run.data.tags["device"] == "cpu" and run.data.tags["trial_status"] == "completed"
        assert (run.data.tags["compile"], run.data.tags["bf16"]) == ("off", "false")  # what auto is on a CPU
        config = json.loads(run.data.tags["trial_config"])
        # The data it trained and was tested on, as this process reads the same task config.
        assert run.data.tags["data_hash"] == data_hash(config["task"], json.dumps(config["task_options"]))
        for key in ("lr", "d_model", "n_layers", "batch_size", "n_iters", "task", "model") + (
            ("n_heads",) if "n_heads" in config else ()
        ):
            assert run.data.params[key] == (
                json.dumps(config[key]) if isinstance(config[key], (dict, list)) else str(config[key])
            )
        for metric in ("ood_valid_acc", "iid_valid_acc", "loss", "best_ood_valid_acc"):
            assert [m.step for m in client.get_metric_history(run.info.run_id, metric)] == steps, metric
        assert 0 <= run.data.metrics["test_acc_at_best"] <= 1
    return children


def test_launch_on_sqlite_with_eight_concurrent_trials(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(tmp_path, uri, trials=8, concurrent=8, cpu=0.25)
    out = orchestrator("launch", str(path), cwd=tmp_path)
    assert "best/tiny__ndr.yaml" in out.stdout
    # The console: one line per evaluation (8 trials x 2), overall lines, a summary; no Tune table
    # or box, no per-checkpoint line, no traceback.
    lines = out.stdout.splitlines()
    assert sum(1 for line in lines if line.startswith("[tiny__ndr trial ")) == 8 * 2
    assert any(line.startswith("[launch] pairs done 1/1, runs ended 8/8") for line in lines)
    assert any(line.startswith("  tiny__ndr ") and "uniform guess: 0.125" in line for line in lines)
    assert any(line.startswith("[launch] next: orchestrator status ") for line in lines)
    assert "[launch] started a local Ray instance" in lines
    for noise in (
        "Trial status",
        "│",
        "╭",
        "Checkpoint successfully created",
        "tensorboard",
        "Token authentication",
        "Creating initial MLflow",
        "Started a local Ray instance",
    ):
        assert noise not in out.stdout + out.stderr, noise
    # The driver prints no traceback. (A trial process that Ray ends can still print a SystemExit
    # traceback from its interpreter's shutdown, prefixed "(trial pid=...)": not silenced yet.)
    driver = [line for line in (out.stdout + out.stderr).splitlines() if "(trial pid=" not in line]
    assert not any("Traceback" in line for line in driver)
    children = check_store_contents(uri, path, trials=8)
    # MLflow at a glance: short run names, the pair's answer on the launch's run and on a nested pair run.
    # A search trial's name: its number, the values TPE chose, its pair.
    for run in children:
        config = json.loads(run.data.tags["trial_config"])
        number, *chosen, pair = run.info.run_name.split()
        assert re.fullmatch(r"#\d", number) and pair == "tiny__ndr", run.info.run_name
        assert sorted(chosen) == sorted(
            [f"lr={config['lr']:.3g}", *(f"{k}={config[k]}" for k in ("d_model", "n_heads", "n_layers"))]
        )
    assert sorted(int(r.info.run_name.split()[0][1:]) for r in children) == list(range(1, 9))
    client, parents, _ = trial_runs(uri, yaml.safe_load(path.read_text())["name"])
    best = max(r.data.metrics["best_ood_valid_acc"] for r in children)
    assert parents[0].data.metrics["tiny__ndr/best_ood_valid_acc"] == best
    pair_run = client.search_runs([parents[0].info.experiment_id], filter_string="tags.kind = 'pair'")[0]
    assert (
        pair_run.info.run_name == "tiny__ndr"
        and pair_run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    )
    assert pair_run.data.metrics["best_ood_valid_acc"] == best and "lr" in pair_run.data.params
    # A search's report: its best trial per pair (one seed: no confirmation), Figure 2's maps of it.
    assert {"report/report.html", "report/tiny__ndr_attention.png"} <= {
        a.path for a in client.list_artifacts(parents[0].info.run_id, "report")
    }
    search_report = next((tmp_path / "runs").glob("*/report/report.md")).read_text()
    assert (
        "# Search " in search_report
        and "(one seed: no confirmation)" in search_report
        and f"{best:.3f} (one seed)" in search_report
    )
    assert (
        "Winning config (trial #" in search_report
        and sum(1 for line in search_report.splitlines() if re.match(r"\| (\*\*)?\d", line)) == 8
    )
    assert {"report/tiny__ndr_curves.png", "report/tiny__ndr_slices.png"} <= {
        a.path for a in client.list_artifacts(parents[0].info.run_id, "report")
    }
    # Eight trials asked to run together did run together: their MLflow runs overlap in time.
    spans = sorted((r.info.start_time, r.info.end_time) for r in children)
    overlap = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert overlap >= 6, spans

    status = orchestrator("status", "--storage-path", str(tmp_path / "runs"), cwd=tmp_path).stdout
    assert "tiny__ndr" in status and "    8 " in status
    best = next((tmp_path / "runs").glob("*/best/tiny__ndr.yaml"))
    written = yaml.safe_load(best.read_text())
    config = written["config"]
    assert config["model"] == "ndr" and config["n_iters"] == 20 and config["threads"] == 1  # as the trial ran
    # The best config re-runs its trial: the same data, and the same numbers to the digit on a CPU.
    trained = orchestrator("train", str(best), cwd=tmp_path)
    again = json.loads(trained.stdout[trained.stdout.index("{") :])
    (run,) = [r for r in children if r.info.run_id in best.read_text()]
    assert (
        again["status"] == "completed"
        and again["data_hash"] == written["data_hash"] == run.data.tags["data_hash"]
    )
    for metric in ("best_ood_valid_acc", "test_acc_at_best", "loss"):
        assert again[metric] == round(run.data.metrics[metric], 4), metric
    assert written["cpu_kernels"] == run.data.tags["cpu_kernels"] == cpu_kernels()
    assert not any(f"[train] {words}" in trained.stdout for words in ("--set", "the data", "this CPU"))
    elsewhere = tmp_path / "from_another_cpu.yaml"  # as if the launch ran on other vector units
    elsewhere.write_text(yaml.safe_dump({**written, "cpu_kernels": "AVX512_BF16"}))
    changed = orchestrator(
        "train", str(elsewhere), "--set", "threads=2", "--set", "n_iters=1", cwd=tmp_path
    ).stdout
    assert "[train] --set changes the launch's trial (n_iters 20 -> 1, threads 1 -> 2)" in changed
    assert "the launch's trial ran on AVX512_BF16: they round otherwise" in changed


def test_launch_on_postgresql(tmp_path):
    path = spec(
        tmp_path,
        POSTGRES_AS_WRITTEN,
        trials=2,
        models=("ndr", "lstm"),
        per_model={"lstm": {"space": {"n_layers": {"int": [1, 2]}}}},
    )
    orchestrator("launch", str(path), cwd=tmp_path)
    children = check_store_contents(POSTGRES, path, trials=4)
    assert {r.data.tags["model"] for r in children} == {"ndr", "lstm"}
    assert "n_heads" not in next(r for r in children if r.data.tags["model"] == "lstm").data.params
    # The Optuna studies live in the same database, in their own schema (both libraries keep an
    # alembic_version table).
    import optuna

    storage = optuna.storages.RDBStorage(
        POSTGRES, engine_kwargs={"connect_args": {"options": "-csearch_path=optuna"}}
    )
    states = optuna_trial_states(storage, yaml.safe_load(path.read_text())["name"])
    assert states == {"tiny__ndr": ["COMPLETE"] * 2, "tiny__lstm": ["COMPLETE"] * 2}


def optuna_trial_states(storage, experiment: str) -> dict[str, list[str]]:
    """The Optuna studies of an experiment's launches, kept in SQL beside MLflow: pair -> trial states."""
    import optuna

    return {
        name.rsplit("/", 1)[-1]: [
            t.state.name for t in optuna.load_study(study_name=name, storage=storage).trials
        ]
        for name in optuna.get_all_study_names(storage)
        if name.startswith(experiment + "/")
    }


def test_asha_stops_poor_trials_and_tells_optuna_they_were_pruned(tmp_path):
    """One trial at a time, on a score without ties (L1 on contextual retrieval), over a learning-rate
    range so wide that some trials barely move: ASHA stops some at a rung and lets others finish, and
    the Optuna study holds the stopped ones as PRUNED, not as COMPLETE with a truncated score."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(
        tmp_path,
        uri,
        trials=8,
        concurrent=1,
        n_iters=40,
        eval_every=10,
        models=("transformer",),
        metric="best_ood_valid_l1",
        mode="min",
        scheduler={"name": "asha", "grace_period": 10, "reduction_factor": 2},
        tasks=[
            {"task": "contextual_retrieval", "variant": "cr", "options": {"train_size": 300, "eval_size": 30}}
        ],
        space={"lr": {"loguniform": [1e-6, 1e-2]}},
        fixed={"batch_size": 16, "d_model": 16, "n_heads": 2},
    )
    orchestrator("launch", str(path), cwd=tmp_path)
    experiment = yaml.safe_load(path.read_text())["name"]
    _, _, children = trial_runs(uri, experiment)
    statuses = sorted(r.data.tags["trial_status"] for r in children)
    assert "early_stopped" in statuses and "completed" in statuses, statuses
    states = optuna_trial_states(f"sqlite:///{tmp_path}/mlflow.optuna.db", experiment)
    assert sorted(states["cr__transformer"]) == sorted(
        {"completed": "COMPLETE", "early_stopped": "PRUNED"}[s] for s in statuses
    )


def trial_processes(root_pid: int) -> list[int]:
    """The trial actors' processes under a driver (Ray titles them after the trainable's class)."""
    parents, titles = {}, {}
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError):
            parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            titles[int(proc.name)] = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")

    def under_root(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == root_pid:
                return True
        return False

    return [
        pid
        for pid, title in titles.items()
        if title.startswith("ray::CheckpointFallbackTrial") and under_root(pid)
    ]


def test_a_trial_that_fails_for_good_is_recorded_and_the_exit_status_says_so(tmp_path):
    """The first trial's process killed, as the kernel's OOM killer would, with no retries left
    (max_failures 0): one line names it, its MLflow run ends FAILED with trial_status failed and its
    Optuna trial FAIL; the other trials, the answer and the report as ever; and the launch exits 3,
    not 0, so that a script does not take its answer for a whole one."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(
        tmp_path,
        uri,
        budget={"trials": 3, "max_concurrent": 1, "n_iters": 200, "eval_every": 100, "max_failures": 0},
    )
    experiment = yaml.safe_load(path.read_text())["name"]
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "launch", str(path)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.time() + 300
        while not (trials := trial_processes(driver.pid)):
            assert driver.poll() is None and time.time() < deadline, (tmp_path / "driver.log").read_text()[
                -3000:
            ]
            time.sleep(0.05)
        os.kill(trials[0], signal.SIGKILL)
        code = driver.wait(timeout=600)
    out = (tmp_path / "driver.log").read_text()
    assert code == 3, out[-3000:]
    assert sum(" failed for good" in line for line in out.splitlines()) == 1, out[-3000:]
    assert "[launch] 1 run(s) failed: " in out and "best/tiny__ndr.yaml" in out
    # Ours, and Ray's notice of the worker process it lost (as of a node it marks dead).
    foreign = [
        line
        for line in foreign_lines(out, path)
        if "(raylet)" not in line or "A worker died or was killed" not in line
    ]
    assert foreign == [], foreign
    _, parents, children = trial_runs(uri, experiment)
    assert parents[0].info.status == "FINISHED" and len(children) == 3
    failed = [r for r in children if r.data.tags["trial_status"] == "failed"]
    assert len(failed) == 1 and failed[0].info.status == "FAILED" and failed[0].data.tags.get("error")
    assert sorted(r.data.tags["trial_status"] for r in children if r not in failed) == [
        "completed",
        "completed",
    ]
    states = optuna_trial_states(f"sqlite:///{tmp_path}/mlflow.optuna.db", experiment)["tiny__ndr"]
    assert sorted(states) == ["COMPLETE", "COMPLETE", "FAIL"]


@pytest.mark.long
def test_a_launch_outlives_the_reader_of_its_console(tmp_path):
    """`orchestrator launch FILE | less`, then q: the pipe closed, and the next progress line's
    BrokenPipeError killed the driver (exit 1, its trials left RUNNING). The launch now goes on to
    its end, says once on stderr that its console is gone, and records every trial."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(tmp_path, uri, trials=2)
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    with open(tmp_path / "stderr.log", "w") as stderr:
        driver = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "launch", str(path)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        assert driver.stdout.readline().startswith(
            f"{path}: "
        )  # the plan's first line, then the reader leaves
        driver.stdout.close()
        code = driver.wait(timeout=600)
    err = (tmp_path / "stderr.log").read_text()
    assert code == 0, err[-3000:]
    assert (
        err.count("[launch] the console's reader is gone; the launch goes on") == 1 and "Traceback" not in err
    )
    check_store_contents(uri, path, trials=2)
    assert json.loads(next((tmp_path / "runs").glob("*/launch.json")).read_text())["state"] == "finished"


@pytest.mark.long  # a stacked search's driver kill (default, below) and the short chaos soak (long) cause it
def test_resume_after_the_driver_is_killed(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(tmp_path, uri, trials=4, concurrent=2, n_iters=300, eval_every=50)
    experiment = yaml.safe_load(path.read_text())["name"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    driver = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "launch", str(path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    # Kill the driver (and the local Ray it started) once the first trial has finished.
    deadline = time.time() + 300
    for line in driver.stdout:
        if "runs ended 1/" in line or time.time() > deadline:  # callbacks.ProgressLines, as a trial ends
            break
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    client, _, before = trial_runs(uri, experiment)
    finished_before = {r.data.tags["trial_id"] for r in before if r.data.tags["trial_status"] == "completed"}
    assert (
        finished_before and len(before) < 4 or any(r.data.tags["trial_status"] == "running" for r in before)
    )

    launch_dir = next((tmp_path / "runs").glob("*/launch.json")).parent
    status = orchestrator("status", str(launch_dir), cwd=tmp_path).stdout
    assert "tiny__ndr" in status
    resumed = orchestrator("resume", str(launch_dir), cwd=tmp_path)
    # Every line of the resumed driver and its trials is ours: no traceback, no library warning.
    assert foreign_lines(resumed.stdout + resumed.stderr, path) == [], (resumed.stdout + resumed.stderr)[
        -3000:
    ]

    _, parents, after = trial_runs(uri, experiment)
    assert len(parents) == 1
    # A trial that started after Tune's last experiment checkpoint is forgotten and replaced on resume;
    # its run is marked lost rather than left "running" for ever.
    lost = [r for r in after if r.data.tags["trial_status"] == "lost"]
    assert all(r.info.status == "KILLED" for r in lost)
    after = [r for r in after if r not in lost]
    assert len(after) == 4 and len({r.data.tags["trial_id"] for r in after}) == 4  # no duplicated runs
    states = optuna_trial_states(f"sqlite:///{tmp_path}/mlflow.optuna.db", experiment)["tiny__ndr"]
    assert states.count("COMPLETE") == 4 and "RUNNING" not in states
    assert all(r.data.tags["trial_status"] == "completed" for r in after)
    for run in after:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "ood_valid_acc")]
        assert steps == sorted(set(steps)) and steps[-1] == 300  # each evaluation logged once
        if run.data.tags["trial_id"] in finished_before:
            assert run.info.end_time < parents[0].info.end_time  # not run again


@pytest.mark.long  # the short chaos soak (long) kills drivers at random moments, this one among them
def test_resume_after_the_driver_is_killed_before_tunes_first_snapshot(tmp_path):
    """Tune writes tuner.pkl as its run starts and its first snapshot a moment later; a driver
    killed in between (CI's chaos soak did so) used to leave a launch whose every resume ran one
    trial and stopped "interrupted". It must start the phase afresh and finish."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(tmp_path, uri, trials=3)
    experiment = yaml.safe_load(path.read_text())["name"]
    driver = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "launch", str(path), "--launch-id", "early"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    tune_dir = tmp_path / "runs" / "early" / "tune"
    deadline = time.time() + 300
    while not (tune_dir / "tuner.pkl").exists() and time.time() < deadline and driver.poll() is None:
        time.sleep(0.005)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    # A loaded machine may let Tune write its first snapshot before the kill lands: taking it away
    # leaves the launch as a kill in between would.
    for snapshot in tune_dir.glob("experiment_state-*.json"):
        snapshot.unlink()
    assert (tune_dir / "tuner.pkl").exists() and not list(tune_dir.glob("experiment_state-*.json"))

    resumed = orchestrator("resume", str(tmp_path / "runs" / "early"), cwd=tmp_path)
    assert foreign_lines(resumed.stdout + resumed.stderr, path) == [], (resumed.stdout + resumed.stderr)[
        -3000:
    ]
    _, _, runs = trial_runs(uri, experiment)
    assert (
        sorted(r.data.tags["trial_status"] for r in runs if r.data.tags["trial_status"] != "lost")
        == ["completed"] * 3
    )
    assert (
        optuna_trial_states(f"sqlite:///{tmp_path}/mlflow.optuna.db", experiment)["tiny__ndr"]
        == ["COMPLETE"] * 3
    )


@pytest.mark.long
def test_two_nodes(tmp_path, request):
    """A head and a worker node on this machine; a custom resource with one slot per node makes the
    two concurrent trials land on different nodes, and MLflow shows which node ran each. Then, with
    that cluster dead, a launch without --address starts its own local instance instead of waiting
    for the cluster `ray start` left recorded."""
    port = free_port()
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths live under it
    # Ray 2.60 enables token authentication on a local head: every node and the driver share one token.
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex,
        "RAY_TMPDIR": ray_tmp,
    }
    ray = str(Path(sys.executable).parent / "ray")
    request.addfinalizer(lambda: shutil.rmtree(ray_tmp, ignore_errors=True))
    # Each node in a process group of its own, stopped by killing that group: `ray stop` would also
    # stop every other Ray on the machine (a launch the developer is running, say).
    node_groups = []

    def start_node(*args):
        node = subprocess.Popen(
            [ray, "start", *args, "--num-cpus=1", "--resources={\"slot\": 1}"],
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        node_groups.append(node.pid)
        out, _ = node.communicate(timeout=120)
        assert node.returncode == 0, out

    try:
        start_node("--head", f"--port={port}", "--include-dashboard=false")
        start_node(f"--address=127.0.0.1:{port}")
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        path = spec(
            tmp_path,
            uri,
            trials=2,
            concurrent=2,
            n_iters=200,
            eval_every=100,
            cpu=1,
            resources={"cpu": 1, "custom": {"slot": 1}},
        )
        orchestrator("launch", str(path), "--address", f"127.0.0.1:{port}", cwd=tmp_path, env_extra=env)
        _, _, children = trial_runs(uri, yaml.safe_load(path.read_text())["name"])
        assert len(children) == 2
        assert len({r.data.tags["node_id"] for r in children}) == 2
    finally:
        for group in node_groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert (Path(ray_tmp) / "ray" / "ray_current_cluster").exists()  # the dead cluster, still recorded
    again = spec(tmp_path, uri, trials=1)
    orchestrator("launch", str(again), cwd=tmp_path, env_extra=env, timeout=180)


@contextlib.contextmanager
def mlflow_server(tmp_path, command: list[str], env: dict):
    """A real MLflow tracking server on a loopback port, started by `command` (which gets the port
    appended or through $PORT), until /health answers. Yields its URI."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [part.replace("{port}", str(port)) for part in command],
        cwd=tmp_path,  # its ./mlartifacts
        env={**os.environ, **env, "PORT": str(port), "ALLOWED_HOSTS": f"127.0.0.1:{port}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300  # migrations twice, then the server: minutes on loaded cores
        while True:
            try:
                urllib.request.urlopen(uri + "/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, "the MLflow server did not start"
                time.sleep(1)
        yield uri
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


@pytest.mark.long
def test_launch_tracked_by_a_real_mlflow_server(tmp_path):
    mlflow_bin = str(Path(sys.executable).parent / "mlflow")
    command = [
        mlflow_bin,
        "server",
        "--backend-store-uri",
        f"sqlite:///{tmp_path}/server.db",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--workers",
        "1",
        "--allowed-hosts",
        "127.0.0.1:{port}",
    ]
    with mlflow_server(tmp_path, command, {}) as uri:
        path = spec(tmp_path, uri, trials=2)
        # The server's host check refuses "localhost": the dry run says so (/health would not have).
        refused = orchestrator(
            "launch",
            str(path),
            "--dry-run",
            "--tracking-uri",
            uri.replace("127.0.0.1", "localhost"),
            cwd=tmp_path,
            check=False,
        )
        assert refused.returncode == 2 and "refuses requests: 403 Invalid Host header" in refused.stderr, (
            refused.stderr
        )
        assert not (tmp_path / "runs").exists()
        orchestrator("launch", str(path), cwd=tmp_path)
        check_store_contents(uri, path, trials=2)


@pytest.mark.long  # 112 s; a real `mlflow server` also serves test_ui's browser check
def test_a_team_server_with_authentication_tracks_a_launch_from_the_environment(tmp_path, monkeypatch):
    """deploy/mlflow-server.sh as a team runs it (SQLite here for the runs and the users): a request
    without credentials is refused, and so is a launch without them (one line, nothing written);
    with MLFLOW_TRACKING_USERNAME / _PASSWORD in its environment a launch is tracked through it."""
    import urllib.error
    import urllib.request

    admin = {"MLFLOW_AUTH_ADMIN_PASSWORD": "team-Admin-pw-1"}
    server_env = {
        **admin,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-secret-key",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "HOST": "127.0.0.1",
        "MLFLOW_DB": f"sqlite:///{tmp_path}/server.db",
        "MLFLOW_AUTH_DB": f"sqlite:///{tmp_path}/users.db",
    }
    with mlflow_server(tmp_path, ["bash", str(ROOT / "deploy" / "mlflow-server.sh")], server_env) as uri:
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(uri + "/api/2.0/mlflow/experiments/search?max_results=1", timeout=10)
        assert anonymous.value.code == 401
        path = spec(tmp_path, uri, trials=2)
        refused = orchestrator("launch", str(path), cwd=tmp_path, check=False)
        [line] = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and line.startswith(
            f"orchestrator: error: {path}: tracking.uri: tracking server {uri} refuses requests: 401 "
        )
        assert line.endswith(
            "(it asks for credentials: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD)"
        ), line
        assert not (tmp_path / "runs").exists()
        credentials = {
            "MLFLOW_TRACKING_USERNAME": "admin",
            "MLFLOW_TRACKING_PASSWORD": admin["MLFLOW_AUTH_ADMIN_PASSWORD"],
        }
        orchestrator("launch", str(path), cwd=tmp_path, env_extra=credentials)
        for name, value in credentials.items():
            monkeypatch.setenv(name, value)
        check_store_contents(uri, path, trials=2)


@pytest.mark.long
def test_launch_minimises_l1_on_set_regression_and_covers_seq2seq(tmp_path):
    """The other papers' pairs through the whole service: compositional vs multi-head attention on
    contextual retrieval (L1, minimised) and PANM on Copy (token and sequence accuracy per test length)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    retrieval = spec(
        tmp_path,
        uri,
        trials=2,
        models=("transformer", "transformer_compositional"),
        metric="best_ood_valid_l1",
        mode="min",
        tasks=[
            {"task": "contextual_retrieval", "variant": "cr", "options": {"train_size": 300, "eval_size": 30}}
        ],
        space={"lr": {"loguniform": [1e-4, 1e-3]}, "d_model": {"choice": [16, 32]}},
        fixed={"batch_size": 16, "n_heads": 2},
    )
    orchestrator("launch", str(retrieval), cwd=tmp_path)
    _, _, children = trial_runs(uri, yaml.safe_load(retrieval.read_text())["name"])
    assert {r.data.tags["model"] for r in children} == {"transformer", "transformer_compositional"}
    assert all(
        "best_ood_valid_l1" in r.data.metrics and "test_l1_at_best" in r.data.metrics for r in children
    )
    best_text = next((tmp_path / "runs").glob("*/best/cr__transformer_compositional.yaml")).read_text()
    lowest = min(
        r.data.metrics["best_ood_valid_l1"]
        for r in children
        if r.data.tags["model"] == "transformer_compositional"
    )
    assert f"best_ood_valid_l1 = {lowest:.4f}" in best_text  # the minimum, since mode is min
    assert yaml.safe_load(best_text)["config"]["model"] == "transformer_compositional"
    status = orchestrator("status", "--storage-path", str(tmp_path / "runs"), cwd=tmp_path).stdout
    rows = [line.split() for line in status.splitlines() if line.startswith("cr__")]
    assert "stopped" not in status  # scheduler fifo: no trial stopped early, no column for it
    assert len(rows) == 2 and all(row[6] != "-" for row in rows)  # the L1 test score is shown, not "-"
    assert all(
        " ".join(row[7:]) == "predicting zero: l1 of each set's own targets (rel_l1 1.0)" for row in rows
    )  # and what chance scores

    copy = spec(
        tmp_path,
        uri,
        trials=1,
        models=("panm",),
        space={"lr": {"loguniform": [1e-4, 1e-3]}},
        metric="best_ood_valid_token_acc",
        tasks=[
            {
                "task": "copy",
                "options": {
                    "train_size": 200,
                    "eval_size": 20,
                    "max_train_length": 5,
                    "test_multipliers": [1, 2],
                },
            }
        ],
        fixed={"batch_size": 16, "d_model": 16, "hidden": 16, "mlp_hidden": 8},
    )
    orchestrator("launch", str(copy), cwd=tmp_path)
    _, _, children = trial_runs(uri, yaml.safe_load(copy.read_text())["name"])
    assert {
        "test_L_token_acc_at_best",
        "test_x1_token_acc_at_best",
        "test_x2_seq_acc_at_best",
        "test_token_acc_at_best",
    } <= set(children[0].data.metrics)
    assert (
        next((tmp_path / "runs").glob("*/report/copy__panm_pointers.png")).stat().st_size > 1000
    )  # PANM's pointer attention


def test_ablation_grid_over_seeds_with_report(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(
        tmp_path,
        uri,
        space={},
        grid={"n_layers": [1, 2]},
        seeds=[0, 1],
        concurrent=2,
        fixed={"batch_size": 16, "d_model": 16, "n_heads": 2},
        batch_seeds=True,
    )
    out = orchestrator("launch", str(path), cwd=tmp_path)
    assert "ablation of 1 model/task pairs, 2 grid cells in all x 2 seeds" in out.stdout
    _, parents, children = trial_runs(uri, yaml.safe_load(path.read_text())["name"])
    configs = sorted(
        (json.loads(r.data.tags["trial_config"])["n_layers"], json.loads(r.data.tags["trial_config"])["seed"])
        for r in children
    )
    assert configs == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert sorted(r.info.run_name for r in children) == [
        f"n_layers={n} s{s} tiny__ndr" for n in (1, 2) for s in (0, 1)
    ]
    assert {(r.data.tags["cell"], r.data.tags["seed"]) for r in children} == {
        (f"n_layers={n}", str(s)) for n in (1, 2) for s in (0, 1)
    }
    # NDR's seeds train stacked: one trial per cell, one MLflow run per seed.
    trials = {r.data.tags["trial_id"]: r.data.tags["cell"] for r in children}
    assert sorted(trials.values()) == ["n_layers=1", "n_layers=2"]
    assert (
        "pair tiny__ndr: grid over n_layers (2 cells; stacked: 2 trial(s) train its 4 "
        "runs (trainables.batched))" in out.stdout
    )
    report = next((tmp_path / "runs").glob("*/report/report.md")).read_text()
    # Every number of the report is an independent aggregation of the MLflow runs, rows in numeric order.
    rows = [
        line for line in report.splitlines() if line.startswith("| n_layers=") and "±" in line
    ]  # the cell table, not the per-depth one
    assert [line.split(" | ")[0] for line in rows] == ["| n_layers=1", "| n_layers=2"]
    for layers, row in zip((1, 2), rows):
        for metric in ("best_ood_valid_acc", "test_acc_at_best", "test_acc_final"):
            values = [
                r.data.metrics[metric]
                for r in children
                if json.loads(r.data.tags["trial_config"])["n_layers"] == layers
            ]
            assert f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f} [" in row, (metric, row)
    assert next((tmp_path / "runs").glob("*/report/tiny__ndr.png")).stat().st_size > 1000
    parent = MlflowClient(uri).get_run(parents[0].info.run_id)  # each cell's mean on the launch's run
    layer_one = [
        r.data.metrics["test_acc_at_best"]
        for r in children
        if json.loads(r.data.tags["trial_config"])["n_layers"] == 1
    ]
    assert parent.data.metrics["tiny__ndr/n_layers:1/test_acc_at_best"] == pytest.approx(np.mean(layer_one))
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(parents[0].info.run_id, "report")}
    assert {
        "report/report.md",
        "report/report.html",
        "report/tiny__ndr.png",
        "report/tiny__ndr_attention.png",
    } <= artifacts

    # The same ablation again, compared with the first.
    orchestrator("launch", str(path), "--launch-id", "second", cwd=tmp_path)
    compared = orchestrator(
        "report", "second", "--storage-path", str(tmp_path / "runs"), "--compare", "previous", cwd=tmp_path
    )
    assert "; was " in (tmp_path / "runs" / "second" / "report" / "report.md").read_text()
    assert "REGRESSION" not in compared.stdout  # same code, same seeds: same numbers
    first = next(
        p.name
        for p in (tmp_path / "runs").iterdir()
        if p.name not in ("second", "mlflow.db", "mlartifacts") and p.is_dir()
    )
    alone = orchestrator(
        "report",
        first,
        "--storage-path",
        str(tmp_path / "runs"),
        "--compare",
        "previous",
        cwd=tmp_path,
        check=False,
    )
    assert alone.returncode == 2 and "--compare previous: no finished launch of" in alone.stderr


@pytest.mark.long
def test_stacked_members_resume_after_the_driver_is_killed(tmp_path):
    """A trial of stacked members (every seed of the cells that differ only in learning rate) is
    checkpointed and restored as one; after a SIGKILL of the driver mid-trial and `resume`, each
    member's MLflow run holds every evaluation exactly once, under its own cell and seed."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(
        tmp_path,
        uri,
        space={},
        grid={"n_layers": [1, 2], "lr": [1e-3, 3e-3]},
        seeds=[0, 1, 2],
        concurrent=2,
        n_iters=300,
        eval_every=50,
        fixed={"batch_size": 16, "d_model": 16, "n_heads": 2},
        batch_seeds=True,
    )
    experiment = yaml.safe_load(path.read_text())["name"]
    driver = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "launch", str(path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 300
    for line in driver.stdout:
        if " it 100/300 " in line or time.time() > deadline:  # a batched trial has checkpointed twice
            assert "(mean of 6 stacked members)" in line
            break
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    launch_dir = next((tmp_path / "runs").glob("*/launch.json")).parent
    assert json.loads((launch_dir / "launch.json").read_text())["batch_seeds"] is True
    orchestrator("resume", str(launch_dir), cwd=tmp_path)

    client, _, runs = trial_runs(uri, experiment)
    runs = [r for r in runs if r.data.tags["trial_status"] != "lost"]
    assert sorted((r.data.tags["cell"], r.data.tags["seed"]) for r in runs) == sorted(
        (f"lr={lr} n_layers={n}", str(s)) for n in (1, 2) for lr in (0.001, 0.003) for s in (0, 1, 2)
    )  # the file's grid order
    assert len({r.data.tags["trial_id"] for r in runs}) == 2  # one trial per layer count
    for run in runs:  # each run's config is its member's own
        cell = dict(part.split("=") for part in run.data.tags["cell"].split())
        assert json.loads(run.data.tags["trial_config"])["lr"] == float(cell["lr"])
    for run in runs:
        assert run.data.tags["trial_status"] == "completed"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "ood_valid_acc")] == list(
            range(50, 301, 50)
        )
    by_seed = {}
    for run in runs:  # seeds differ from one another: each run holds its own seed's numbers
        by_seed.setdefault(run.data.tags["cell"], set()).add(run.data.metrics["loss"])
    assert all(len(losses) == 3 for losses in by_seed.values()) and len(by_seed) == 4


@pytest.mark.long
def test_a_search_confirms_its_best_trials_over_new_seeds(tmp_path):
    """`confirm: {top_k: 2, seeds: [5, 6]}`: after the search, each pair's two best trials run again
    with seeds 5 and 6; the pair's answer (summary, best config, MLflow) is the best candidate's mean."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(
        tmp_path,
        uri,
        trials=3,
        concurrent=3,
        models=("lstm",),
        n_iters=100,
        eval_every=50,
        space={"lr": {"loguniform": [1e-3, 1e-2]}},
        fixed={"batch_size": 32, "d_model": 32, "n_layers": 1, "dropout": 0.0},
        confirm={"top_k": 2, "seeds": [5, 6]},
    )
    out = orchestrator("launch", str(path), cwd=tmp_path)
    assert "then confirming: each pair's 2 best trials again with seeds 5, 6" in out.stdout
    assert (
        sum(1 for line in out.stdout.splitlines() if line.startswith("[tiny__lstm confirmation trial "))
        == 4 * 2
    )
    client, parents, children = trial_runs(uri, yaml.safe_load(path.read_text())["name"])
    search = [r for r in children if r.data.tags["phase"] == "search"]
    confirm = [r for r in children if r.data.tags["phase"] == "confirm"]
    assert len(search) == 3 and len(confirm) == 4
    # Of trials tied on the metric the earlier started ranks first, as everywhere in the service.
    in_start_order = sorted(search, key=lambda r: (r.info.start_time, r.info.run_id))
    ranked = sorted(in_start_order, key=lambda r: r.data.metrics["best_ood_valid_acc"], reverse=True)[:2]
    for k, run in enumerate(ranked):  # candidate k repeats the k-th best trial's config with each new seed
        repeats = [r for r in confirm if r.data.tags["candidate"] == str(k)]
        assert sorted(json.loads(r.data.tags["trial_config"])["seed"] for r in repeats) == [5, 6]
        assert {json.loads(r.data.tags["trial_config"])["lr"] for r in repeats} == {
            json.loads(run.data.tags["trial_config"])["lr"]
        }
        assert sorted(r.info.run_name for r in repeats) == [
            f"candidate {k + 1} s{seed} tiny__lstm" for seed in (5, 6)
        ]
    means = {
        k: np.mean(
            [r.data.metrics["best_ood_valid_acc"] for r in confirm if r.data.tags["candidate"] == str(k)]
        )
        for k in (0, 1)
    }
    chosen = max(means, key=means.get)
    tests = [r.data.metrics["test_acc_at_best"] for r in confirm if r.data.tags["candidate"] == str(chosen)]
    assert parents[0].data.metrics["tiny__lstm/confirmed_test_acc"] == pytest.approx(np.mean(tests))
    assert (
        f"confirmed {np.mean(tests):.3f} ± {np.std(tests, ddof=1):.3f} over 2 seeds (candidate {chosen + 1})"
        in out.stdout
    )
    # Crowned only past chance over its two seeds (answer.answer_lines): 100 steps may not get there.
    assert (
        re.search(
            r"\[launch\] answer on tiny: (lstm generalizes best, test_acc_at_best|no model generalizes "
            rf"beyond chance, test_acc_at_best lstm) {np.mean(tests):.3f}",
            out.stdout,
        )
        and "; each pair's confirmed candidate, the mean over its seeds (lstm 2), at this launch's scale"
        in out.stdout
    ), out.stdout[-3000:]
    best = next((tmp_path / "runs").glob("*/best/tiny__lstm.yaml")).read_text()
    assert f"confirmed candidate {chosen + 1} of 2" in best
    assert yaml.safe_load(best)["config"]["lr"] == json.loads(ranked[chosen].data.tags["trial_config"])["lr"]
    status = orchestrator("status", "--storage-path", str(tmp_path / "runs"), cwd=tmp_path).stdout
    assert (
        "confirmed " in status and "    3 " in status
    )  # the search's 3 trials; confirmation runs counted apart
    rows = [
        line
        for line in next((tmp_path / "runs").glob("*/report/report.md")).read_text().splitlines()
        if line.startswith("| candidate=") and "±" in line
    ]  # the cell table, not the per-depth one
    assert [row.split(" | ")[0] for row in rows] == ["| candidate=1", "| candidate=2"]
    assert f"{np.mean(tests):.3f} ± {np.std(tests, ddof=1):.3f} [" in rows[chosen]


@pytest.mark.long
def test_nightly_flags_only_the_night_that_got_worse(tmp_path):
    """Three nights of one ablation (3 seeds, new ones each night): unchanged, unchanged, then with
    a learning rate too small to learn. Only the third is flagged, and its exit status says so."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    task = {
        "train_size": 400,
        "eval_size": 60,
        "train_depths": [1, 2],
        "ood_valid_depths": [2, 2],
        "test_depths": [2, 2],
    }
    good = {
        "batch_size": 64,
        "d_model": 64,
        "n_layers": 1,
        "lr": 0.01,
        "dropout": 0.0,
    }  # about 0.85 in 300 iterations
    path = spec(
        tmp_path,
        uri,
        models=("lstm",),
        space={},
        seeds=[0, 1, 2],
        concurrent=3,
        cpu=0.5,
        n_iters=300,
        eval_every=100,
        fixed=good,
        tasks=[{"task": "ctl", "variant": "tiny", "options": task}],
        report={"alpha": 0.01},
    )
    runs = tmp_path / "runs"
    first = orchestrator("nightly", str(path), cwd=tmp_path)
    assert (
        "night 1 of " in first.stdout
        and "No previous launch compared" in next(runs.glob("*/report/report.md")).read_text()
    )
    second = orchestrator("nightly", str(path), cwd=tmp_path)
    assert (
        "night 2 of " in second.stdout
        and "seeds + 1000" in second.stdout
        and "REGRESSION" not in second.stdout
    )
    assert "[launch] no regression in 1 cell compared with " in second.stdout  # the verdict, said either way
    assert (
        "changed config" not in second.stdout and "pooling" not in second.stdout
    )  # a night differs from the last by its seeds only
    data = yaml.safe_load(path.read_text())
    data["fixed"]["lr"] = 1e-7
    path.write_text(yaml.safe_dump(data))
    third = orchestrator("nightly", str(path), cwd=tmp_path, check=False)
    assert third.returncode == 1, third.stdout[-2000:] + third.stderr[-2000:]
    assert (
        "[launch] REGRESSION tiny__lstm" in third.stdout
        and "its config changed since: lr 0.01 -> 1e-07" in third.stdout
    )
    dated = sorted((runs / "nightly" / data["name"]).glob("*.html"))
    assert (
        len(dated) == 3 and "REGRESSION" in dated[-1].read_text() and "REGRESSION" not in dated[1].read_text()
    )
    assert (
        runs / sorted(p.name for p in runs.glob("*-night-*"))[-1] / "report" / "tiny__lstm_history.png"
    ).exists()
    verdicts = [
        json.loads((runs / name / "launch.json").read_text())["regressed"]
        for name in sorted(p.name for p in runs.glob("*-night-*"))
    ]
    assert verdicts == [
        None,
        False,
        True,
    ]  # the first compared with none; the third is no baseline for the fourth (report.write_night)


def test_a_planted_password_is_in_no_file_record_or_output(tmp_path, postgres_database):
    """A password in --tracking-uri (where `ps` would show it) is refused; a launch (a search, so
    Optuna's storage is pickled too) with it in MLFLOW_TRACKING_URI, then status: the password is in
    none of the files the launch wrote, not in the store, not in the output; nor is the password of
    the file's own tracking.uri, which the environment's replaces (the file is stored with the launch).
    The local PostgreSQL trusts every login, so the planted password is accepted."""
    secret, file_secret = "Planted-S3cret-pw", "File-S3cret-pw"
    database = postgres_database.name
    uri = f"postgresql+psycopg://postgres:{secret}@127.0.0.1:5432/{database}"
    work = tmp_path / "work"
    work.mkdir()
    path = spec(work, f"postgresql://postgres:{file_secret}@127.0.0.1:5432/{database}", trials=2)
    on_command_line = orchestrator("launch", str(path), "--tracking-uri", uri, cwd=work, check=False)
    assert on_command_line.returncode == 2 and on_command_line.stderr.startswith(
        "orchestrator: error: --tracking-uri: holds a password"
    )
    assert not (work / "runs").exists()
    outputs = [
        on_command_line,
        orchestrator("launch", str(path), cwd=work, env_extra={"MLFLOW_TRACKING_URI": uri}),
    ]
    refused = orchestrator("status", "--storage-path", str(work / "runs"), cwd=work, check=False)
    assert refused.returncode == 2 and "set MLFLOW_TRACKING_URI" in refused.stderr, refused.stderr
    outputs += [
        refused,
        orchestrator(
            "status", "--storage-path", str(work / "runs"), cwd=work, env_extra={"MLFLOW_TRACKING_URI": uri}
        ),
    ]
    assert "tiny__ndr" in outputs[-1].stdout
    for out in outputs:
        assert secret not in out.stdout + out.stderr and file_secret not in out.stdout + out.stderr
    written = [p for p in work.rglob("*") if p.is_file() and p != path]
    assert any(p.name == "launch.json" for p in written) and any(".pkl" in p.name for p in written)
    assert [
        p for p in written if secret.encode() in p.read_bytes() or file_secret.encode() in p.read_bytes()
    ] == []
    dump = subprocess.run(
        ["pg_dump", "-h", "127.0.0.1", "-U", "postgres", database], capture_output=True, text=True, check=True
    ).stdout
    assert "search_space.yaml" in dump or "launch_id" in dump  # the store holds the launch...
    assert secret not in dump and file_secret not in dump  # ...and not the passwords


def test_a_stacked_search_survives_a_driver_kill_with_one_run_and_one_optuna_trial_per_suggestion(tmp_path):
    """budget.stack_size 3: each Tune trial trains three TPE suggestions stacked, ASHA judges a stack
    by its best member. The driver is killed during the second stack and resumed: MLflow ends with
    one run per suggestion (each with its own learning rate, under its trial and member), Optuna
    with one trial per suggestion told the end its run had, and none left running."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(
        tmp_path,
        uri,
        trials=6,
        concurrent=1,
        n_iters=60,
        eval_every=10,
        models=("transformer",),
        metric="best_ood_valid_l1",
        mode="min",
        scheduler={"name": "asha", "grace_period": 10, "reduction_factor": 2},
        tasks=[
            {"task": "contextual_retrieval", "variant": "cr", "options": {"train_size": 300, "eval_size": 30}}
        ],
        space={"lr": {"loguniform": [1e-6, 1e-2]}, "weight_decay": {"uniform": [0.0, 0.1]}},
        fixed={"batch_size": 16, "d_model": 16, "n_heads": 2},
        batch_seeds=True,
        budget={"trials": 6, "max_concurrent": 1, "n_iters": 60, "eval_every": 10, "stack_size": 3},
    )
    experiment = yaml.safe_load(path.read_text())["name"]
    plan = orchestrator("launch", str(path), "--dry-run", "--no-calibrate", cwd=tmp_path).stdout
    assert "3 TPE suggestions per trial, stacked" in plan, plan
    driver = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "launch", str(path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline, seen = time.time() + 300, []
    for line in driver.stdout:
        seen.append(line)
        if "[cr__transformer runs 4-6/6] it 20/60" in line or time.time() > deadline:
            assert "(best of 3 stacked members)" in line, "".join(seen)[-3000:]
            break
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    launch_dir = next((tmp_path / "runs").glob("*/launch.json")).parent
    resumed = orchestrator("resume", str(launch_dir), cwd=tmp_path)
    assert foreign_lines(resumed.stdout + resumed.stderr, path) == [], (resumed.stdout + resumed.stderr)[
        -3000:
    ]

    _, _, runs = trial_runs(uri, experiment)
    runs = [r for r in runs if r.data.tags["trial_status"] != "lost"]
    assert len(runs) == 6 and len({r.data.tags["trial_id"] for r in runs}) == 2
    assert sorted(r.data.tags["member"] for r in runs) == ["0", "0", "1", "1", "2", "2"]
    configs = [json.loads(r.data.tags["trial_config"]) for r in runs]
    assert len({c["lr"] for c in configs}) == 6 and all("seed" in c and "members" not in c for c in configs)
    assert all(r.data.tags["trial_status"] in ("completed", "early_stopped") for r in runs)
    states = optuna_trial_states(f"sqlite:///{tmp_path}/mlflow.optuna.db", experiment)["cr__transformer"]
    assert sorted(states) == sorted(
        {"completed": "COMPLETE", "early_stopped": "PRUNED"}[r.data.tags["trial_status"]] for r in runs
    )
    best = orchestrator("best", str(launch_dir), cwd=tmp_path).stdout
    assert "cr__transformer" in best
