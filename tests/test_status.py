"""`orchestrator status` and `best` from launch.json and a real MLflow store (SQLite) holding runs
written as callbacks.TrialTracker writes them: an ablation's cells in numeric order with their seeds'
counts and mean ± std, no ASHA column where nothing stops trials early, and neither command
importing Ray or torch."""

import fcntl
import json
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.plan.load import load_study
from orchestrator.record.state import LaunchState, plan_of

ROOT = Path(__file__).resolve().parent.parent
SPEC = {
    "name": "status_test",
    "tasks": [{"task": "ctl", "variant": "fwd", "options": {"direction": "forward"}}],
    "models": ["ndr"],
    "budget": {"trials": 3, "max_concurrent": 1, "n_iters": 10, "eval_every": 5},
}
SEARCH = {**SPEC, "space": {"lr": {"loguniform": [1e-4, 1e-2]}}}
# (n_layers, seed) -> (trial_status, best_ood_valid_acc, test_acc_at_best); n_layers=12 has not started.
RUNS = {
    (4, 0): ("completed", 0.61, 0.52),
    (4, 1): ("completed", 0.65, 0.50),
    (4, 2): ("completed", 0.70, 0.57),
    (10, 0): ("completed", 0.91, 0.88),
    (10, 1): ("running", 0.5, 0.4),
    (10, 2): ("completed", 0.95, 0.81),
    (8, 0): ("diverged", 0.2, 0.1),
    (8, 1): ("completed", 0.8, 0.75),
    (8, 2): ("lost", 0.9, 0.9),
}


def launch(tmp_path: Path, spec: dict, runs: dict, plan_keys=None, chose=lambda key: {}) -> LaunchState:
    """A launch in a SQLite store: `runs` maps (grid values, seed) to (status, metric, test score);
    `plan_keys` keeps only those keys of the plan (a launch.json from an older version); chose(key):
    the values a search's trial of that key chose."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(spec))
    study = load_study(path)
    client = MlflowClient(uri)
    experiment = client.create_experiment(f"{study.experiment}-{uuid.uuid4().hex[:6]}")
    launch_id = f"launch-{uuid.uuid4().hex[:6]}"
    parent = client.create_run(experiment, tags={"launch_id": launch_id, "kind": "launch"})
    for (cell, seed), (status, metric, test) in runs.items():
        setting = dict(zip(study.grid, cell))
        tags = {
            "mlflow.parentRunId": parent.info.run_id,
            "launch_id": launch_id,
            "kind": "trial",
            "pair": study.pairs[0].name,
            "trial_status": status,
            "trial_config": json.dumps(
                {**study.pairs[0].base, **setting, "seed": seed, **chose((cell, seed))}
            ),
        }
        if study.is_ablation:
            tags.update(cell=" ".join(f"{k}={v}" for k, v in setting.items()) or "-", seed=str(seed))
        run = client.create_run(experiment, tags=tags)
        client.log_metric(run.info.run_id, "best_ood_valid_acc", metric)
        client.log_metric(run.info.run_id, "test_acc_at_best", test)
    plan = plan_of(study)
    if plan_keys is not None:
        plan = {k: v for k, v in plan.items() if k in plan_keys}
        plan["pairs"] = [{k: v for k, v in p.items() if k in plan_keys} for p in plan["pairs"]]
    folder = tmp_path / "runs" / launch_id
    folder.mkdir(parents=True)
    state = LaunchState(
        launch_id,
        folder,
        client.get_experiment(experiment).name,
        str(path),
        path.read_text(),
        uri,
        parent.info.run_id,
        state="finished",
        plan=plan,
    )
    state.save()
    return state


def orchestrator(*args: str) -> tuple[str, list[str]]:
    """The command's output, and which of Ray and torch it imported."""
    code = (
        "import sys; from orchestrator.cli.process import main; code = main(sys.argv[1:]); "
        "print('imported:', *(m for m in ('ray', 'torch') if m in sys.modules)); sys.exit(code)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    body, _, imported = out.rpartition("imported:")
    return body, imported.split()


def spread(values: list[float]) -> str:
    return f"{np.mean(values):.4f}" + (f" ± {np.std(values, ddof=1):.4f}" if len(values) > 1 else "")


def test_status_of_an_ablation_shows_each_cell_in_numeric_order(tmp_path):
    state = launch(
        tmp_path,
        {**SPEC, "grid": {"n_layers": [4, 8, 10, 12]}, "seeds": [0, 1, 2]},
        {((n,), s): v for (n, s), v in RUNS.items()},
    )
    out, imported = orchestrator("status", str(state.dir))
    assert imported == []
    assert "stopped" not in out and "ASHA" not in out
    assert out.splitlines()[2].split()[4:6] == ["done", "unfinished"]  # no driver runs the run left running
    rows = [line.split() for line in out.splitlines() if line.startswith("  n_layers=")]
    assert [row[0] for row in rows] == [
        "n_layers=4",
        "n_layers=8",
        "n_layers=10",
        "n_layers=12",
    ]  # as text, 10 sorts before 4
    for row in rows:
        layers = int(row[0].split("=")[1])
        done = [v for (n, _), v in RUNS.items() if n == layers and v[0] == "completed"]
        counted = [
            sum(1 for (n, _), v in RUNS.items() if n == layers and v[0] in kinds)
            for kinds in (("completed",), ("running",), ("diverged",))
        ]
        assert [int(x) for x in row[1:5]] == counted + [3], row
        shown = " ".join(row[5:])
        if done:
            assert shown == f"{spread([v[1] for v in done])} {spread([v[2] for v in done])}", row
        else:
            assert shown == "- -"

    assert (
        out.splitlines()[-1]
        == "('failed' counts seeds that diverged (n_layers=8 1); 'of': the cell's seeds; mean "
        "± std over its done seeds)"
    )
    # A launch.json from before grids and seed counts were saved: the cells its runs name, in the same order.
    old = launch(
        tmp_path,
        {**SPEC, "grid": {"n_layers": [4, 8, 10, 12]}, "seeds": [0, 1, 2]},
        {((n,), s): v for (n, s), v in RUNS.items()},
        plan_keys={"metric", "mode", "score", "ablation", "confirm", "pairs", "name", "trials", "chance"},
    )
    out, imported = orchestrator("status", str(old.dir))
    assert imported == [] and [
        line.split()[0] for line in out.splitlines() if line.startswith("  n_layers=")
    ] == ["n_layers=4", "n_layers=8", "n_layers=10"]
    seeds_only = launch(
        tmp_path,
        {**SPEC, "seeds": [0, 1]},
        {((), 0): ("completed", 0.5, 0.4), ((), 1): ("completed", 0.7, 0.6)},
    )
    out, _ = orchestrator("status", str(seeds_only.dir))
    row = next(line for line in out.splitlines() if line.startswith("  (seeds only)"))
    assert " ".join(row.split()[2:]) == f"2 0 0 2 {spread([0.5, 0.7])} {spread([0.4, 0.6])}"


def test_status_of_an_interrupted_launch_calls_its_trials_unfinished_not_running(tmp_path):
    """After Ctrl-C, status said "interrupted" above a table that counted the runs the driver had
    left as running."""
    state = launch(tmp_path, SEARCH, {((), 0): ("completed", 0.5, 0.4), ((), 1): ("interrupted", 0.3, 0.2)})
    state.state = "interrupted"
    state.save()
    out, _ = orchestrator("status", str(state.dir))
    header, row = out.splitlines()[2:4]
    assert header.split()[1:5] == ["done", "stopped", "unfinished", "failed"] and row.split()[1:5] == [
        "1",
        "0",
        "1",
        "0",
    ]
    assert (
        f"('unfinished': running when the driver stopped; `orchestrator resume {state.dir}` continues them)"
        in out
    )
    with open(state.dir / "driver.lock", "w") as lock:  # a driver that runs it again: its trials run
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out, _ = orchestrator("status", str(state.dir))
    assert out.splitlines()[2].split()[3] == "running" and "'unfinished'" not in out


def test_best_of_an_ablation_is_refused(tmp_path):
    ablation = launch(
        tmp_path,
        {**SPEC, "grid": {"n_layers": [4, 8]}, "seeds": [0, 1]},
        {((4,), 0): ("completed", 0.6, 0.5)},
    )
    refused = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "best", str(ablation.dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "is an ablation, whose answer is per cell over seeds" in refused.stderr
    assert not (ablation.dir / "best").exists()


def test_status_and_best_of_a_search_import_neither_ray_nor_torch(tmp_path):
    runs = {((), k): ("completed", 0.5 + 0.1 * k, 0.4 + 0.1 * k) for k in range(3)}
    fifo = launch(tmp_path, {**SEARCH, "scheduler": {"name": "fifo"}}, runs)
    out, imported = orchestrator("status", str(fifo.dir))
    assert imported == [] and "stopped" not in out
    assert any(line.split()[:6] == ["fwd__ndr", "3", "0", "0", "3", "0.7000"] for line in out.splitlines()), (
        out
    )
    written, imported = orchestrator("best", str(fifo.dir))
    assert imported == [] and written.split() == [str(fifo.dir / "best" / "fwd__ndr.yaml")]
    best = (fifo.dir / "best" / "fwd__ndr.yaml").read_text()
    assert best.startswith(
        f"# Best trial of fwd__ndr in launch {fifo.launch_id}: best_ood_valid_acc = "
        "0.7000, test_acc_at_best = 0.6"
    )
    assert yaml.safe_load(best)["config"]["seed"] == 2
    # ASHA's column where ASHA may have stopped trials, and for a launch.json that does not say.
    asha = launch(tmp_path, SEARCH, runs)
    assert "stopped" in orchestrator("status", str(asha.dir))[0]
    old = launch(
        tmp_path,
        {**SEARCH, "scheduler": {"name": "fifo"}},
        runs,
        plan_keys={"metric", "mode", "score", "ablation", "confirm", "pairs", "name", "trials", "chance"},
    )
    assert "stopped" in orchestrator("status", str(old.dir))[0]
    blown_up = launch(
        tmp_path,
        SEARCH,
        {
            ((), 0): ("diverged", 0.2, 0.1),
            ((), 1): ("failed", 0.0, 0.0),
            ((), 2): ("early_stopped", 0.3, 0.2),
        },
    )
    assert (
        "('stopped': ended early by ASHA; 'failed' counts those that diverged (fwd__ndr "
        "1); 'of': the pair's trials; test_acc_at_best: of the best trial)"
        in orchestrator("status", str(blown_up.dir))[0]
    )
    said, _ = orchestrator("best", str(blown_up.dir))
    assert (
        said == "no best config for fwd__ndr: none of its trials completed (2 failed, 1 of them "
        "diverged; 1 stopped early)\n"
    )
    assert not (blown_up.dir / "best").exists()


def test_a_launch_folder_is_read_where_it_is_now_and_a_missing_store_is_one_line(tmp_path):
    """A launch folder copied elsewhere (to a laptop, or mounted at another path in a pod): status
    and best read and write it there, not at the path launch.json was written at. A SQLite store
    that is not on this machine is one line, exit 2: opening it would create an empty store."""
    import shutil

    runs = {((), k): ("completed", 0.5 + 0.1 * k, 0.4 + 0.1 * k) for k in range(3)}
    original = launch(tmp_path, {**SEARCH, "scheduler": {"name": "fifo"}}, runs)
    moved = tmp_path / "elsewhere" / original.launch_id
    shutil.copytree(original.dir, moved)
    shutil.rmtree(original.dir)
    out, _ = orchestrator("status", str(moved))
    assert f"({moved})" in out
    written, _ = orchestrator("best", str(moved))
    assert written.split() == [str(moved / "best" / "fwd__ndr.yaml")]
    (tmp_path / "mlflow.db").rename(tmp_path / "away.db")
    refused = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "status", str(moved)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        refused.returncode == 2 and f"tracking_uri: no SQLite store at {tmp_path}/mlflow.db" in refused.stderr
    )
    assert not (tmp_path / "mlflow.db").exists() and "Traceback" not in refused.stderr


def test_resume_refuses_a_launch_whose_snapshots_name_the_modules_before_the_split(tmp_path):
    """Tune's snapshot of a launch begun before orchestrator/ split into plan/run/record/report names
    `orchestrator.search`, which no longer exists: unpickling it crashed after the driver had marked
    the launch running. Now one line, exit 2, before Ray starts or launch.json is touched."""
    state = launch(tmp_path, SEARCH, {})
    data = json.loads((state.dir / "launch.json").read_text())
    del data["snapshot_modules"]  # as a launch.json of that time
    data["state"] = "interrupted"
    (state.dir / "launch.json").write_text(json.dumps(data))
    before = (state.dir / "launch.json").read_text()
    refused = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "resume", str(state.dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "snapshot_modules: 1, this service reads 3" in refused.stderr
    assert "ray" not in refused.stdout.lower() and (state.dir / "launch.json").read_text() == before


def test_best_hands_a_searchs_winners_to_an_ablation_file(tmp_path):
    """`best --ablation FILE`: FILE again, in the launch's best/ folder, with each pair's searched
    values of the winning trial as per_pair.<pair>.fixed, but those its grid sweeps; it loads, and
    its pair trains them over the file's own. A pair the search did not run keeps the file's."""
    from orchestrator.plan.load import load_study

    search = {
        **SPEC,
        "scheduler": {"name": "fifo"},
        "space": {"lr": {"loguniform": [1e-4, 1e-2]}, "n_layers": {"int": [2, 8]}},
    }
    runs = {((), k): ("completed", 0.5 + 0.1 * k, 0.4 + 0.1 * k) for k in range(3)}
    state = launch(
        tmp_path, search, runs, chose=lambda key: {"lr": 0.001 * (key[1] + 1), "n_layers": 3 + key[1]}
    )
    ablation = tmp_path / "layers.yaml"
    ablation.write_text(
        yaml.safe_dump(
            {
                **SPEC,
                "models": ["ndr", "lstm"],
                "grid": {"n_layers": [2, 4]},
                "seeds": [0, 1],
                "fixed": {"lr": 0.5},
            }
        )
    )
    out, _ = orchestrator("best", str(state.dir), "--ablation", str(ablation))
    written = state.dir / "best" / "layers_tuned.yaml"
    assert out.split("\n")[-2] == str(written)
    assert "  fwd__ndr: lr=0.003 (its grid sweeps n_layers)" in out.splitlines(), out
    assert f"  fwd__lstm: not a pair of search {state.launch_id}; the file's values" in out.splitlines(), out
    assert yaml.safe_load(written.read_text())["per_pair"] == {"fwd__ndr": {"fixed": {"lr": 0.003}}}
    pairs = {p.name: p for p in load_study(written).pairs}
    assert (
        pairs["fwd__ndr"].base["lr"] == 0.003
        and pairs["fwd__lstm"].base["lr"] == 0.5
        and pairs["fwd__ndr"].grid == {"n_layers": (2, 4)}
    )
    (state.dir / "best").rename(tmp_path / "written_before")
    for file, reason in (
        ("space.yaml", "--ablation hands a search's winners to an ablation file"),
        ("missing.yaml", ""),
    ):
        refused = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "best",
                str(state.dir),
                "--ablation",
                str(tmp_path / file),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 2 and refused.stderr.startswith(
            f"orchestrator: error: best: {reason}"
        ), refused.stderr
        assert not (state.dir / "best").exists(), "a refused --ablation wrote the best configs first"
    (tmp_path / "written_before").rename(state.dir / "best")
    assert (
        yaml.safe_load(written.read_text())["name"] == "status_test_tuned"
    )  # compared with its own launches, not the untuned file's


def test_best_hands_no_winner_to_a_pair_of_other_task_options_and_writes_no_password(tmp_path):
    """A variant name the ablation gives other task options (or another task) keeps the file's
    values; `fixed: null` is an empty mapping, as the spec reads it; the tracking URI's password
    stays out of the written file."""
    from orchestrator.record import best

    search = {**SPEC, "scheduler": {"name": "fifo"}, "space": {"lr": {"loguniform": [1e-4, 1e-2]}}}
    state = launch(
        tmp_path,
        search,
        {((), k): ("completed", 0.5 + 0.1 * k, 0.4) for k in range(2)},
        chose=lambda key: {"lr": 0.001 * (key[1] + 1)},
    )
    ablation = tmp_path / "other.yaml"
    tasks = [
        {**task, "options": {**task.get("options", {}), "direction": "backward"}} for task in SPEC["tasks"]
    ]
    ablation.write_text(
        yaml.safe_dump(
            {
                **SPEC,
                "tasks": tasks,
                "grid": {"n_layers": [2, 4]},
                "seeds": [0],
                "tracking": {"uri": "postgresql+psycopg://mlflow:hunter2@127.0.0.1/mlflow"},
            }
        )
    )
    path, lines = best.write_ablation(state, ablation)
    assert lines == [
        f"fwd__ndr: search {state.launch_id} ran it on ctl {{'direction': 'forward'}}, this file on ctl "
        "{'direction': 'backward'}; the file's values"
    ]
    assert "hunter2" not in path.read_text() and yaml.safe_load(path.read_text()).get("per_pair") == {}
    ablation.write_text(
        yaml.safe_dump(
            {**SPEC, "grid": {"n_layers": [2, 4]}, "seeds": [0], "per_pair": {"fwd__ndr": {"fixed": None}}}
        )
    )
    path, lines = best.write_ablation(state, ablation)
    assert lines == ["fwd__ndr: lr=0.002"] and yaml.safe_load(path.read_text())["per_pair"] == {
        "fwd__ndr": {"fixed": {"lr": 0.002}}
    }


@pytest.mark.long
def test_a_damaged_store_or_a_launch_folder_made_a_file_is_one_line(tmp_path):
    """A store cut short or overwritten gave SQLAlchemy's 50-line traceback; an emptied one was
    read as a store of no trials, MLflow writing its tables into it; `best` with its folder made a
    file gave a traceback; `resume` of such a launch, or of one whose kept file no longer loads,
    started Ray first."""
    runs = {((), k): ("completed", 0.5 + 0.1 * k, 0.4 + 0.1 * k) for k in range(3)}
    state = launch(tmp_path, {**SEARCH, "scheduler": {"name": "fifo"}}, runs)
    store = tmp_path / "mlflow.db"
    whole = store.read_bytes()

    def refused(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, (
            done.stderr[-3000:]
        )
        assert "ray" not in done.stdout.lower(), done.stdout
        return done.stderr

    # SQLite's header page kept, every page after it zeroed: tables the header promises are not there
    page = 4096
    for damaged, said in (
        (
            whole[:page] + bytes(len(whole) - page),
            "the tracking store's database is damaged: database disk image is malformed",
        ),
        (b"garbage" * 1000, "the tracking store's database is damaged: file is not a database"),
        (b"", "holds no MLflow store (an empty file, or another program's database)"),
    ):
        store.write_bytes(damaged)
        for command in ("status", "report", "resume"):
            assert said in refused(command, str(state.dir)), command
        assert store.read_bytes() == damaged  # nothing written into it
    store.write_bytes(whole)
    (state.dir / "best").write_text("not a folder")
    assert refused("best", str(state.dir)).endswith(
        f"{state.dir / 'best'}: File exists: a launch's folders and files are the service's to write\n"
    )
    data = json.loads((state.dir / "launch.json").read_text())
    (state.dir / "launch.json").write_text(
        json.dumps({**data, "snapshot_modules": 3, "storage": {"uri": str(tmp_path / "runs")}})
    )
    assert refused("resume", str(state.dir)).endswith(
        f"{state.dir / 'best'}: a file where a folder belongs: "
        "a launch's folders and files are the service's to write\n"
    )
    (state.dir / "best").unlink()
    (state.dir / "launch.json").write_text(
        json.dumps(
            {
                **data,
                "spec_text": "name: [unclosed\n",
                "snapshot_modules": 3,
                "storage": {"uri": str(tmp_path / "runs")},
            }
        )
    )
    assert f"{state.dir}/launch.json: spec_text: " in refused("resume", str(state.dir))


def test_a_second_driver_that_passed_the_check_leaves_the_first_ones_lock_whole(
    tmp_path, monkeypatch, capsys
):
    """Two resumes of one launch at once both passed the command's check; the one that lost the
    lock emptied driver.lock as it opened it (a reader elsewhere then saw no driver) and died with
    a BlockingIOError traceback. Now one line, exit 2, and the first driver's line kept."""
    from orchestrator.run import launch as launch_module

    state = launch(tmp_path, SEARCH, {})
    monkeypatch.setattr(launch_module, "start_ray", lambda address: False)
    monkeypatch.setattr(launch_module, "cluster_slots", lambda study, use_gpu, cells=None: 1)
    with open(state.dir / "driver.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("elsewhere 4242\n")
        held.flush()
        assert launch_module.Launch(state, None).run() == 2
        assert (state.dir / "driver.lock").read_text() == "elsewhere 4242\n"
    assert (
        capsys.readouterr().err
        == f"orchestrator: error: {state.dir}: a driver is running this launch now; `orchestrator status "
        f"{state.dir}` shows its progress\n"
    )


def test_status_read_by_a_pipe_closed_early_ends_quietly(tmp_path):
    """`orchestrator status | head -1`: the reader leaves after a line, and the command ended with
    a BrokenPipeError traceback. Its output now goes nowhere, and it exits as `yes | head` does."""
    state = launch(tmp_path, SEARCH, {((), k): ("completed", 0.5, 0.4) for k in range(3)})
    reader = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "status", str(state.dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reader.stdout.close()  # before its imports are done, so before it prints
    assert reader.wait(timeout=120) == 141 and reader.stderr.read() == ""
