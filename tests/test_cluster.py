"""A real multi-node Ray cluster on this machine, and faults caused for real: a worker node that
cannot see the driver's disk, a node killed mid-trial, a driver killed the moment a checkpoint is
pruned, SIGINT to a launch, PostgreSQL connections terminated mid-launch (the nodes: tests/nodes.py)."""

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

import pytest
import yaml
from nodes import RAY, Cluster, free_port
from test_service import foreign_lines, optuna_trial_states, orchestrator, spec, trial_runs

pytestmark = pytest.mark.slow

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "sysgen-test",
    "AWS_SECRET_ACCESS_KEY": "sysgen-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def cluster():
    c = Cluster(env=S3_ENV)
    yield c
    c.stop()


def popen_launch(*args, cwd, env):
    """A driver in a process group of its own (with the local Ray it may start), output to a file:
    a pipe nobody reads while the test waits would fill up and stall it."""
    log = Path(cwd) / f"driver-{uuid.uuid4().hex[:6]}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", *args],
            cwd=cwd,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process.log = log
    return process


def finish(process, timeout=300) -> str:
    process.wait(timeout=timeout)
    return process.log.read_text()


def wait_for_checkpoint(root: Path | None, process, fs=None, path: str = "", timeout=300) -> None:
    """Until a trial checkpoint exists under `root` (or under `path` in pyarrow filesystem `fs`)."""
    import pyarrow.fs

    deadline = time.time() + timeout
    while time.time() < deadline:
        assert process.poll() is None, process.log.read_text()[-3000:]
        if fs is not None:
            try:
                infos = fs.get_file_info(pyarrow.fs.FileSelector(path, recursive=True))
            except OSError:
                infos = []
            if any(Path(i.path).name.startswith("checkpoint_") for i in infos):
                return
        elif root.exists() and any(root.glob("**/checkpoint_*")):
            return
        time.sleep(0.2)
    raise AssertionError("no checkpoint appeared")


def interrupt_then_resume(process, tmp_path, env, address) -> str:
    """SIGINT to the driver as Ctrl-C would send it; it must stop the whole launch cleanly."""
    os.kill(process.pid, signal.SIGINT)
    out = finish(process, timeout=180)
    assert process.returncode == 130, out[-3000:]
    assert "interrupted" in out and "orchestrator resume" in out
    launch_dir = next((tmp_path / "runs").glob("*/launch.json")).parent
    assert json.loads((launch_dir / "launch.json").read_text())["state"] == "interrupted"
    assert not (launch_dir / "best").exists()  # no best configs from partial trials
    status = orchestrator("status", str(launch_dir), cwd=tmp_path, env_extra=env).stdout
    assert "interrupted; continue with: orchestrator resume" in status
    return orchestrator("resume", str(launch_dir), "--address", address, cwd=tmp_path, env_extra=env).stdout


def check_complete(uri: str, path: Path, trials: int, n_iters: int, eval_every: int):
    """Every trial completed, in one MLflow run each, every evaluation step logged exactly once;
    the parent run finished; the Optuna study holds every trial as COMPLETE."""
    experiment = yaml.safe_load(path.read_text())["name"]
    client, parents, children = trial_runs(uri, experiment)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.tags["launch_status"] == "finished"
    children = [r for r in children if r.data.tags["trial_status"] != "lost"]
    assert len(children) == trials and len({r.data.tags["trial_id"] for r in children}) == trials
    for run in children:
        assert run.data.tags["trial_status"] == "completed", run.data.tags
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "ood_valid_acc")]
        assert steps == list(range(eval_every, n_iters + 1, eval_every)), steps
    states = (
        optuna_trial_states(uri.rsplit(".", 1)[0] + ".optuna.db", experiment)
        if uri.startswith("sqlite")
        else None
    )
    if states is not None:
        assert all(s == "COMPLETE" for pair in states.values() for s in pair), states
    return children


STORAGE_ITERS, STORAGE_EVERY = 200, 20


def cluster_with_a_blind_node(tmp_path, cluster) -> tuple[Path, str, Path]:
    """Two workers, the second in a private mount namespace where the driver's launch folder
    `runs` is an empty folder; -> (runs, the store's URI, a search file of 3 NDR trials)."""
    cluster.worker()
    runs = tmp_path / "runs"
    runs.mkdir()
    cluster.worker(hide=runs)  # the second "machine" sees an empty folder there
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    return (
        runs,
        uri,
        spec(
            tmp_path,
            uri,
            trials=3,
            concurrent=2,
            n_iters=STORAGE_ITERS,
            eval_every=STORAGE_EVERY,
            cpu=1,
            models=("ndr",),
        ),
    )


MEASURED_TWICE = """
import os, sys
import ray
from orchestrator.run.cluster import measurement

def pid():
    return os.getpid()

ray.init(address=sys.argv[1], log_to_driver=False)
measured = measurement(pid, num_cpus=1, num_gpus=1)
print(ray.get(measured.remote()), ray.get(measured.remote()))
"""


def test_a_measurement_given_a_gpu_runs_in_a_worker_process_of_its_own(cluster):
    """The launch's CUDA check and stack-size curves, and the dry run's timings, got their GPU
    through .options(); Ray runs a worker once only for tasks declared with GPUs in ray.remote, so
    a measurement's worker stayed for the next task, holding its CUDA context and memory on the GPU
    the trials train on (and the device it started with). A GPU declared to Ray here: none is
    touched."""
    cluster.start(f"--address={cluster.address}", "--num-cpus=1", "--num-gpus=1")
    done = subprocess.run(
        [sys.executable, "-c", MEASURED_TWICE, cluster.address],
        env=cluster.env,
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.split()
    assert first != second


def test_a_driver_must_run_on_a_node_of_the_cluster(tmp_path, cluster):
    """A driver on a machine that runs no raylet (a Kubernetes pod, a laptop; here a private PID
    namespace, where the cluster's processes are out of sight) is refused in one line that says how
    to join, before anything is written (Ray itself gave up after a minute with a ConnectionError).
    Joined as a node with no CPUs, as deploy/nightly-cronjob.yaml does, it drives a launch whose
    trials run on the cluster's worker."""
    cluster.worker()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(tmp_path, uri, trials=2, concurrent=1, n_iters=20, eval_every=10, cpu=1)
    elsewhere = ["unshare", "--pid", "--fork", "--mount-proc"]
    command = f"{sys.executable} -m orchestrator.cli launch {path} --address {cluster.address}"
    refused = subprocess.run(
        [*elsewhere, "sh", "-c", command],
        cwd=tmp_path,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip() == (
        "orchestrator: error: --address: this machine is not a node of the Ray cluster at "
        f"{cluster.address}, and a driver runs on one: join it first with `ray start --address "
        f"{cluster.address} --num-cpus=0` (trials never run there; deploy/README.md)"
    )
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()
    joined = subprocess.run(
        [
            *elsewhere,
            "sh",
            "-c",
            f"{RAY} start --address {cluster.address} --num-cpus=0 --num-gpus=0 > /dev/null && {command}",
        ],
        cwd=tmp_path,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert joined.returncode == 0, (joined.stdout + joined.stderr)[-3000:]
    check_complete(uri, path, trials=2, n_iters=20, eval_every=10)


@pytest.mark.long  # 126 s; test_a_driver_must_run_on_a_node_of_the_cluster also runs `ray start` nodes
def test_storage_every_node_must_see(tmp_path, cluster, monkeypatch):
    """A worker in a private mount namespace cannot see the driver's launch folder: local storage
    is refused before anything is written; an S3-compatible object store on a loopback port
    carries a launch through SIGINT and resume to the end."""
    runs, uri, path = cluster_with_a_blind_node(tmp_path, cluster)
    n_iters, every = STORAGE_ITERS, STORAGE_EVERY
    refused = orchestrator(
        "launch", str(path), "--address", cluster.address, cwd=tmp_path, env_extra=cluster.env, check=False
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    [line] = [said for said in refused.stderr.splitlines() if said.startswith("orchestrator:")]
    assert (
        line.startswith(f"orchestrator: error: {path}: storage: node ")
        and "cannot see" in line
        and "deploy/README.md" in line
    )
    assert list(runs.iterdir()) == []  # no launch folder, no marker left behind
    assert not (tmp_path / "mlflow.db").exists()  # nor a store

    # An S3-compatible object store: a real server on a loopback port.
    import pyarrow.fs

    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=cluster.env,
    )
    try:
        for (
            key,
            value,
        ) in S3_ENV.items():  # this process's S3 clients read them; later tests of the worker must not
            monkeypatch.setenv(key, value)
        deadline = time.time() + 120  # the server imports for seconds, longer on loaded cores
        while True:
            try:
                pyarrow.fs.S3FileSystem(
                    endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True
                ).create_dir("ckpt")
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, (
                    "the object-store server did not answer"
                )
                time.sleep(0.2)
        s3 = spec(
            tmp_path,
            uri,
            trials=3,
            concurrent=2,
            n_iters=n_iters,
            eval_every=every,
            cpu=1,
            models=("ndr",),
            storage={"uri": "s3://ckpt/sweeps", "endpoint": f"http://127.0.0.1:{port}"},
        )
        driver = popen_launch("launch", str(s3), "--address", cluster.address, cwd=tmp_path, env=cluster.env)
        fs = pyarrow.fs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http")
        wait_for_checkpoint(None, driver, fs=fs, path="ckpt/sweeps")
        interrupt_then_resume(driver, tmp_path, cluster.env, cluster.address)
        check_complete(uri, s3, trials=3, n_iters=n_iters, eval_every=every)
        stored = [i.path for i in fs.get_file_info(pyarrow.fs.FileSelector("ckpt/sweeps", recursive=True))]
        assert sum(1 for p in stored if Path(p).name.startswith("checkpoint_")) == 6  # 2 a trial
        assert any(p.endswith(".json") and "experiment_state" in p for p in stored)
        launch_json = next(runs.glob("*/launch.json")).read_text()
        assert S3_ENV["AWS_SECRET_ACCESS_KEY"] not in launch_json  # credentials stay in the environment
    finally:
        os.killpg(server.pid, signal.SIGKILL)


def test_a_trial_no_node_can_hold_is_refused(tmp_path, cluster):
    """Trials asking for 2 CPUs on a cluster whose nodes have 1 would wait for ever: refused in one
    line naming the key, before a launch folder or a store exists."""
    cluster.worker()
    path = spec(tmp_path, f"sqlite:///{tmp_path}/mlflow.db", trials=1, concurrent=1, cpu=2)
    out = orchestrator(
        "launch",
        str(path),
        "--address",
        cluster.address,
        cwd=tmp_path,
        env_extra=cluster.env,
        check=False,
        timeout=120,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == (
        f"orchestrator: error: {path}: resources.cpu: a trial asks for 2 CPU; no node of the cluster has "
        "that much (the most on one node: 1)"
    )
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.long
def test_storage_on_a_path_every_node_sees(tmp_path, cluster):
    """The same blind node, with `--storage` on a path both nodes see: a launch through SIGINT and
    resume to the end, its checkpoints there and none in the launch folder."""
    runs, uri, path = cluster_with_a_blind_node(tmp_path, cluster)
    n_iters, every = STORAGE_ITERS, STORAGE_EVERY
    shared = Path(tempfile.mkdtemp(prefix="sysgen-shared-", dir="/tmp"))  # outside the hidden folder
    try:
        driver = popen_launch(
            "launch",
            str(path),
            "--address",
            cluster.address,
            "--storage",
            str(shared),
            cwd=tmp_path,
            env=cluster.env,
        )
        wait_for_checkpoint(shared, driver)
        out = interrupt_then_resume(driver, tmp_path, cluster.env, cluster.address)
        assert "resuming from" in out
        children = check_complete(uri, path, trials=3, n_iters=n_iters, eval_every=every)
        assert len({r.data.tags["node_id"] for r in children}) == 2  # both nodes ran trials
        launch_id = next(runs.glob("*/launch.json")).parent.name
        assert (
            len(list((shared / launch_id / "tune").glob("tiny__ndr_*/checkpoint_*"))) == 6
        )  # the last two of each trial
        assert not list(runs.glob("*/tune"))
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.long  # the short chaos soak (long too) kills a node mid-trial and audits every trial and step
def test_trial_survives_the_death_of_its_node(tmp_path, cluster):
    """SIGKILL every process of the node running the only trial: Tune restarts it from its last
    checkpoint on the other node; one MLflow run, every evaluation step exactly once."""
    first = cluster.worker()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    n_iters, every = 4000, 200  # about half a minute: the trial is still running when its node dies
    path = spec(tmp_path, uri, trials=1, concurrent=1, n_iters=n_iters, eval_every=every, cpu=1)
    driver = popen_launch("launch", str(path), "--address", cluster.address, cwd=tmp_path, env=cluster.env)
    wait_for_checkpoint(tmp_path / "runs", driver)
    cluster.worker()  # a node to fail over to, joining only now, so the trial surely ran on the first
    experiment = yaml.safe_load(path.read_text())["name"]
    _, _, [before] = trial_runs(uri, experiment)
    cluster.kill(first)
    out = finish(driver)
    assert driver.returncode == 0, out[-3000:]
    assert "restarting it from its last checkpoint" in out
    # The failure in our words; of Ray's, only its notice that the node was marked dead (and why).
    assert [
        line
        for line in foreign_lines(out, path)
        if "(raylet)" not in line and "raylet has lagging heartbeats" not in line
    ] == [], out[-3000:]
    [run] = check_complete(uri, path, trials=1, n_iters=n_iters, eval_every=every)
    assert run.data.tags["node_id"] != before.data.tags["node_id"]  # finished elsewhere


def wait_for_line(process, text: str, timeout=300) -> None:
    deadline = time.time() + timeout
    while text not in process.log.read_text():
        assert process.poll() is None and time.time() < deadline, process.log.read_text()[-3000:]
        time.sleep(0.1)


def test_a_ctrl_c_raised_inside_a_finalizer_is_delivered_again():
    """SIGINT arriving while the main thread runs a __del__ (the garbage collector runs them, and
    weakref callbacks, anywhere): Python's KeyboardInterrupt is raised there and only printed
    ("Exception ignored in ..."); a chaos soak saw the launch finish after its Ctrl-C. The command
    delivers it again once the finalizer has returned."""
    program = """
import os, signal, time
from orchestrator.cli.process import redeliver_lost_interrupts
# as under a terminal (a background job inherits SIGINT ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)
redeliver_lost_interrupts()
class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000): pass  # the handler runs between these bytecodes, inside __del__
Finalized()
try:
    time.sleep(10)
except KeyboardInterrupt:
    print("interrupted")
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "interrupted", out.stdout + out.stderr
    assert "Exception ignored" not in out.stderr


@pytest.mark.long  # the short chaos soak (long too) sends SIGINT mid-launch, resumes and audits the records
def test_ctrl_c_pressed_until_the_driver_exits_then_resume(tmp_path):
    """Ctrl-C as a terminal sends it (to the driver's whole process group, its local Ray too),
    again and again from the moment the third of three trials runs and the first two have ended:
    one calm stop (exit 130, every line ours), the unfinished trial's run interrupted (KILLED), the
    count of ended trials from our records (2 of 3, where Tune counts all 3 TERMINATED); then a
    resume that keeps the trial's number and the best so far, and finishes with every line ours."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    n_iters, every = 600, 50
    # One trial at a time: two at once, the third starts as the first ends, and the second may end
    # or not before Ctrl-C (CI saw "1 of 3", rightly): the count is the test, not the race.
    path = spec(
        tmp_path,
        uri,
        trials=3,
        concurrent=1,
        n_iters=n_iters,
        eval_every=every,
        models=("lstm",),
        space={"lr": {"loguniform": [1e-4, 1e-3]}},
    )
    driver = popen_launch("launch", str(path), cwd=tmp_path, env=os.environ)
    wait_for_line(driver, "trial 3/3] it ")
    # Pressed again and again until the driver has exited: every moment of the stop, the exit's
    # included (Ray's atexit shutdown once printed a traceback), meets one.
    deadline = time.time() + 180
    while driver.poll() is None and time.time() < deadline:
        os.killpg(driver.pid, signal.SIGINT)
        time.sleep(0.1)
    out = finish(driver, timeout=10)
    assert driver.returncode == 130, out[-3000:]
    assert "[launch] interrupted with 2 of 3 runs ended; nothing is lost: orchestrator resume" in out, out[
        -3000:
    ]
    assert foreign_lines(out, path) == [], out[-3000:]
    launch_dir = next((tmp_path / "runs").glob("*/launch.json")).parent
    assert json.loads((launch_dir / "launch.json").read_text())["state"] == "interrupted"
    experiment = yaml.safe_load(path.read_text())["name"]
    _, [parent], children = trial_runs(uri, experiment)
    assert parent.info.status == "KILLED" and parent.data.tags["launch_status"] == "interrupted"
    assert sorted((r.data.tags["trial_status"], r.info.status) for r in children) == [
        ("completed", "FINISHED"),
        ("completed", "FINISHED"),
        ("interrupted", "KILLED"),
    ]
    best_before = max(
        r.data.metrics["best_ood_valid_acc"] for r in children if r.data.tags["trial_status"] == "completed"
    )

    done = orchestrator("resume", str(launch_dir), cwd=tmp_path)
    resumed = done.stdout
    assert foreign_lines(resumed + done.stderr, path) == [], (resumed + done.stderr)[-3000:]
    trial_lines = [line for line in resumed.splitlines() if " trial " in line and "] it " in line]
    assert trial_lines and all("trial 3/3]" in line for line in trial_lines), resumed[-3000:]
    overall = [line for line in resumed.splitlines() if "runs ended" in line]
    assert "runs ended 3/3" in overall[-1] and "best: -" not in "".join(overall), overall
    assert float(overall[0].rsplit(" ", 1)[1]) >= best_before
    check_complete(uri, path, trials=3, n_iters=n_iters, eval_every=every)


@pytest.mark.long
def test_resume_after_the_driver_dies_as_a_checkpoint_is_pruned(tmp_path):
    """Tune deletes a trial's previous checkpoint as it registers a new one, a moment before the
    experiment snapshot that resume reads is rewritten. Kill the driver (and its local Ray) the
    moment a checkpoint folder disappears, then resume: no trial is lost or failed."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    n_iters, every = 400, 10
    path = spec(tmp_path, uri, trials=2, concurrent=2, n_iters=n_iters, eval_every=every)
    driver = popen_launch("launch", str(path), cwd=tmp_path, env=os.environ)
    runs = tmp_path / "runs"
    wait_for_checkpoint(runs, driver)
    seen: set[Path] = set()
    deadline = time.time() + 300
    while time.time() < deadline:
        now = set(runs.glob("*/tune/*/checkpoint_*"))
        if seen - now:
            os.killpg(driver.pid, signal.SIGKILL)
            break
        seen |= now
    else:
        raise AssertionError("no checkpoint was ever pruned")
    driver.wait()
    launch_dir = next(runs.glob("*/launch.json")).parent
    out = orchestrator("resume", str(launch_dir), cwd=tmp_path).stdout
    assert "resuming from" in out
    check_complete(uri, path, trials=2, n_iters=n_iters, eval_every=every)


@pytest.mark.long  # so is the short chaos soak, which does it too; test_tracking's retries are default
def test_launch_survives_postgresql_dropping_its_connections(tmp_path, postgres_database):
    """Terminate every server connection of the launch's database, repeatedly, mid-launch: MLflow
    and the Optuna storage reconnect, the console says so in our lines only, and the launch completes."""
    database, uri = postgres_database.name, postgres_database.uri
    n_iters, every = 200, 20
    path = spec(tmp_path, uri, trials=4, concurrent=2, n_iters=n_iters, eval_every=every)
    driver = popen_launch("launch", str(path), cwd=tmp_path, env=os.environ)
    wait_for_checkpoint(tmp_path / "runs", driver)
    terminated = busy = 0
    while driver.poll() is None:
        cut = postgres_database.admin.execute(
            "SELECT pg_terminate_backend(pid), state FROM pg_stat_activity WHERE datname = %s", (database,)
        ).fetchall()
        terminated += len(cut)
        busy += sum(state != "idle" for _, state in cut)
        time.sleep(0.2)
    out = finish(driver)
    assert driver.returncode == 0, out[-3000:]
    assert terminated > 0
    # A retried fault is our one line, not the library's ERROR log with its SQL and traceback.
    assert foreign_lines(out, path) == [], out[-3000:]
    # A connection cut while idle is replaced unseen (the pool pings it); one cut mid-statement
    # is a fault the store retries, and says so. Which of the two happens is the machine's timing.
    if busy:
        assert "[store] tracking store " in out or "[store] search store " in out, (busy, out[-3000:])
    check_complete(uri, path, trials=4, n_iters=n_iters, eval_every=every)


# 165 s in CI; test_launch_survives_postgresql_dropping_its_connections causes the store's faults by default
@pytest.mark.long
def test_a_postgresql_outage_longer_than_the_retries_stops_the_launch_in_one_line_and_resume_finishes_it(
    tmp_path, postgres_database
):
    """The database refuses every connection for longer than the store retries (about 31 s): the
    driver stops with one line naming the store and the resume command (exit status 4), leaving
    the launch `failed`. A resume whose database goes as Tune reads its state back stops so too
    (Tune answered the failed read by starting the phase afresh in the same folder: its snapshot
    then listed no trial and every later resume failed, as a chaos soak found). Once the database
    is back, `resume` finishes the launch with nothing lost."""
    database, uri, admin = postgres_database.name, postgres_database.uri, postgres_database.admin
    n_iters, every = 200, 20
    path = spec(tmp_path, uri, trials=4, concurrent=2, n_iters=n_iters, eval_every=every)
    driver = popen_launch("launch", str(path), cwd=tmp_path, env=os.environ)
    wait_for_checkpoint(tmp_path / "runs", driver)
    admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
    while driver.poll() is None:  # connections opened before the switch go too
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,)
        )
        time.sleep(1)
    out = finish(driver)
    assert driver.returncode == 4, out[-3000:]  # not 1: a nightly reads that as a regression
    assert foreign_lines(out, path) == [], out[-3000:]
    error = [line for line in out.splitlines() if line.startswith("orchestrator: error: ")]
    assert len(error) == 1 and " unreachable for " in error[0] and "orchestrator resume " in error[0], out[
        -3000:
    ]
    launch_dir = next((tmp_path / "runs").glob("*/launch.json")).parent
    assert json.loads((launch_dir / "launch.json").read_text())["state"] == "failed"
    admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS true")
    driver = popen_launch("resume", str(launch_dir), cwd=tmp_path, env=os.environ)
    deadline = time.time() + 120
    while "[launch] resuming from " not in driver.log.read_text():  # Tune reads its state back next
        assert driver.poll() is None and time.time() < deadline, driver.log.read_text()[-3000:]
        time.sleep(0.02)
    admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
    while driver.poll() is None:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,)
        )
        time.sleep(1)
    out = finish(driver)
    assert driver.returncode == 4 and foreign_lines(out, path) == [], out[-3000:]
    assert sum(line.startswith("orchestrator: error: ") for line in out.splitlines()) == 1, out[-3000:]
    admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS true")
    resumed = orchestrator("resume", str(launch_dir), cwd=tmp_path)
    assert foreign_lines(resumed.stdout, path) == [], resumed.stdout[-3000:]
    check_complete(uri, path, trials=4, n_iters=n_iters, eval_every=every)


@pytest.mark.long  # its parts have fast tests (test_spec, test_batched); this one joins them on a cluster
def test_stack_size_auto_is_measured_on_a_gpu_node_and_kept_in_launch_json(tmp_path, cluster):
    """Trials that get a GPU stack (batch_seeds auto); budget.stack_size auto measures the pair's
    throughput curve at 1, 2 and 4 members with a trial's resources, on a node that has a GPU, and
    takes its knee. The node's GPU is declared, not real: torch finds no CUDA and the curve is the
    CPU's, which is what this test can run; the path is the GPU one."""
    cluster.start(f"--address={cluster.address}", "--num-cpus=2", "--num-gpus=1")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(
        tmp_path,
        uri,
        trials=4,
        concurrent=1,
        n_iters=20,
        eval_every=10,
        models=("transformer",),
        tasks=[
            {"task": "contextual_retrieval", "variant": "cr", "options": {"train_size": 300, "eval_size": 30}}
        ],
        metric="best_ood_valid_l1",
        mode="min",
        space={"lr": {"loguniform": [1e-4, 1e-2]}},
        fixed={"batch_size": 16, "d_model": 16, "n_heads": 2},
        resources={"cpu": 1, "gpu": 1},
    )
    out = orchestrator("launch", str(path), "--address", cluster.address, cwd=tmp_path, env_extra=cluster.env)
    launch = json.loads(next((tmp_path / "runs").glob("*/launch.json")).read_text())
    size = launch["stack_sizes"]["cr__transformer"]
    assert launch["batch_seeds"] is True and size in (1, 2, 4)
    # The declared GPU's node has this machine's CPU build of torch: said once, before the trials.
    assert (
        sum(
            "finds no CUDA (a CPU-only build): trials that hold a GPU there train on its CPU" in line
            for line in out.stdout.splitlines()
        )
        == 1
    )
    assert (
        f"[launch] stack size of cr__transformer: {size}, where the member-steps/s of its 4 members (a stack "
        "of the rest included) level off (1: " in out.stdout
    )
    experiment = yaml.safe_load(path.read_text())["name"]
    _, _, runs = trial_runs(uri, experiment)
    assert len(runs) == 4 and len({r.data.tags["trial_id"] for r in runs}) == -(-4 // size)
    assert (
        sorted(optuna_trial_states(f"sqlite:///{tmp_path}/mlflow.optuna.db", experiment)["cr__transformer"])
        == ["COMPLETE"] * 4
    )


# its parts have fast tests (test_spec); this one checks that Ray honours each pair's request
@pytest.mark.long
def test_each_pair_asks_for_its_own_share_of_a_gpu(tmp_path, cluster):
    """A node with 2 CPUs and one (declared) GPU. A stacked Transformer trial asks for the whole GPU,
    the LSTM's trials (per_model resources) for half of it each: the two LSTM trials run at once,
    and no LSTM trial runs beside the Transformer's."""
    cluster.start(f"--address={cluster.address}", "--num-cpus=2", "--num-gpus=1")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(
        tmp_path,
        uri,
        concurrent=2,
        n_iters=150,
        eval_every=50,
        cpu=1,
        models=("transformer", "lstm"),
        space={},
        seeds=[0, 1],
        batch_seeds=True,
        budget={"max_concurrent": 2, "n_iters": 150, "eval_every": 50, "stack_size": 2},
        fixed={"batch_size": 16, "d_model": 16, "n_heads": 2},
        resources={"cpu": 1, "gpu": 1},
        per_model={"lstm": {"resources": {"gpu": 0.5}}},
    )
    orchestrator("launch", str(path), "--address", cluster.address, cwd=tmp_path, env_extra=cluster.env)
    _, _, runs = trial_runs(uri, yaml.safe_load(path.read_text())["name"])
    spans = {}
    for run in runs:
        spans.setdefault(
            (run.data.tags["pair"], run.data.tags["trial_id"]), (run.info.start_time, run.info.end_time)
        )
    lstm = [span for (pair, _), span in spans.items() if pair.endswith("__lstm")]
    transformer = [span for (pair, _), span in spans.items() if pair.endswith("__transformer")]
    assert len(lstm) == 2 and len(transformer) == 1, spans  # the Transformer's two seeds stacked in one trial
    overlap = lambda a, b: a[0] < b[1] and b[0] < a[1]  # noqa: E731
    assert overlap(*lstm) and not any(overlap(transformer[0], span) for span in lstm), spans


def test_a_dry_run_with_address_times_the_trials_on_the_clusters_nodes(tmp_path, cluster):
    """`launch --dry-run --address`: each pair's calibration runs as a Ray task with a trial's
    resources on the cluster (here its one worker, under a host name of its own), not on the
    driver's machine. A pair whose trials train on GPUs is timed on a node with one, and where
    torch there finds no CUDA (the GPU is declared, not real), not at all: a CPU's time is no
    estimate of a GPU's."""
    cluster.start(f"--address={cluster.address}", "--num-cpus=2", "--num-gpus=1", hostname="gpu-node-7")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = spec(
        tmp_path,
        uri,
        trials=2,
        models=("lstm", "ndr"),
        resources={"cpu": 1, "gpu": 1},
        per_model={"lstm": {"resources": {"gpu": 0}}},
        space={"lr": {"loguniform": [1e-4, 1e-3]}},
    )
    out = orchestrator(
        "launch",
        str(path),
        "--dry-run",
        "--calibrate",
        "--address",
        cluster.address,
        cwd=tmp_path,
        env_extra=cluster.env,
    ).stdout
    lstm = next(line for line in out.splitlines() if line.startswith("  cost of tiny__lstm: "))
    ndr = next(line for line in out.splitlines() if line.startswith("  cost of tiny__ndr: "))
    timed = r" s per step on gpu-node-7; 2 evaluation\(s\) a trial, at most .* -> at most "
    assert re.search(timed, lstm), out
    assert ndr.endswith(
        "not timed: its trials train on GPUs and torch on gpu-node-7, a node with GPUs, finds no CUDA"
    ), out
    assert "1 pair(s) without an estimate left out" in out and not (tmp_path / "runs").exists(), out
