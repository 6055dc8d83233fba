"""`orchestrator export` and `orchestrator dashboard` on a real SQLite store: the exported table
equals the runs as written (one row each, typed config, the last value of each metric), and the
dashboard serves the launch's Optuna studies."""

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from nodes import free_port

from orchestrator.cli.process import main
from orchestrator.record import export
from orchestrator.record.optuna_store import READ_ONLY
from orchestrator.record.state import LaunchState

IDENTITY = [
    "run_id",
    "run_name",
    "start_time",
    "end_time",
    "trial_id",
    "pair",
    "model",
    "task",
    "variant",
    "phase",
    "trial_status",
]
RAN_AS = (
    "code_version",
    "data_hash",
    "device",
    "cpu_kernels",
    "compile",
    "bf16",
)  # tags after the identity: the code, and how the trial ran


def search_launch(tmp_path, uri: str, launch_id: str = "search-1") -> tuple[LaunchState, dict[str, dict]]:
    """A confirmed search of two pairs in the store, beside runs that are not its trials; -> the
    launch, and per trial run the row the export should hold (without times)."""
    client = MlflowClient(uri)
    exp_id = client.create_experiment("search_test")
    parent = client.create_run(exp_id, tags={"launch_id": launch_id, "kind": "launch"})
    client.create_run(
        exp_id, tags={"launch_id": launch_id, "kind": "pair", "pair": "ctl__ndr"}
    )  # a summary, no trial
    client.create_run(
        exp_id, tags={"launch_id": "another", "kind": "trial", "pair": "ctl__ndr", "trial_config": "{}"}
    )
    expected = {}

    def trial(
        pair: str,
        model: str,
        config: dict,
        status: str,
        curves: dict[str, list[float]],
        phase="search",
        **cell,
    ):
        name = f"{pair} #{len(expected) + 1}"
        config = {
            "task": "ctl",
            "model": model,
            "task_options": {"direction": "backward", "max_depth": 6},
            **config,
        }
        tags = {
            "mlflow.parentRunId": parent.info.run_id,
            "launch_id": launch_id,
            "kind": "trial",
            "trial_id": f"t{len(expected)}",
            "pair": pair,
            "model": model,
            "task": "ctl",
            "variant": "ctl_backward",
            "phase": phase,
            "trial_status": status,
            "trial_config": json.dumps(config),
            "code_version": "abc1234",
            "data_hash": "3fa85f6457174562",
            "device": "cuda:0",
            "cpu_kernels": "AVX2",
            "compile": "default",
            "bf16": "true",
            **cell,
        }
        run = client.create_run(exp_id, run_name=name, tags=tags)
        for metric, values in curves.items():
            for step, value in enumerate(values):
                client.log_metric(run.info.run_id, metric, value, step=100 * (step + 1))
        client.set_terminated(run.info.run_id, "FAILED" if status == "failed" else "FINISHED")
        flat = {f"params.{k}": v for k, v in config.items() if k != "task_options"}
        flat |= {f"params.task_options.{k}": v for k, v in config["task_options"].items()}
        expected[run.info.run_id] = {
            "run_name": name,
            **{k: v for k, v in tags.items() if k in IDENTITY or k in RAN_AS},
            "bf16": True,
            **flat,
            **{f"metrics.{m}": values[-1] for m, values in curves.items()},
            **{k: int(v) for k, v in cell.items() if k in ("candidate", "seed", "member", "diverged_at")},
            **({"cell": cell["cell"]} if "cell" in cell else {}),
        }

    ndr = {"lr": 3e-4, "n_layers": 8, "dropout": 0.1, "seed": 0}
    trial(
        "ctl__ndr",
        "ndr",
        ndr,
        "completed",
        {"loss": [2.0, 0.5], "best_ood_valid_acc": [0.4, 0.9], "test_acc_at_best": [0.88]},
    )
    trial(
        "ctl__ndr",
        "ndr",
        {**ndr, "lr": 1e-3, "n_layers": 4},
        "early_stopped",
        {"loss": [2.5], "best_ood_valid_acc": [0.3]},
    )
    trial("ctl__ndr", "ndr", {**ndr, "lr": 5e-3}, "failed", {})
    trial(
        "ctl__ndr",
        "ndr",
        {**ndr, "lr": 5e-2},
        "diverged",
        {"loss": [2.0], "best_ood_valid_acc": [0.2]},
        diverged_at="200",
    )
    trial(
        "ctl__lstm",
        "lstm",
        {"lr": 1e-3, "hidden": 256, "seed": 0},
        "completed",
        {"loss": [1.0, 0.2, 0.1], "best_ood_valid_acc": [0.7, 1.0, 1.0]},
    )
    for seed in (1000, 1001):  # the candidate's seeds stacked in one trial: its members 0 and 1
        trial(
            "ctl__ndr",
            "ndr",
            {**ndr, "seed": seed},
            "completed",
            {"best_ood_valid_acc": [0.8 + seed % 2 / 10], "test_acc_at_best": [0.7]},
            phase="confirm",
            cell="candidate 1",
            candidate="0",
            seed=str(seed),
            member=str(seed - 1000),
        )
    return bare_launch(tmp_path, uri, launch_id, parent.info.run_id), expected


def bare_launch(tmp_path, uri: str, launch_id: str = "search-1", parent_run_id: str = "") -> LaunchState:
    """The launch folder of a search of two pairs (its runs, if any, are the caller's), beside its store."""
    MlflowClient(uri).search_experiments()  # the store a launch leaves, even one without runs
    (tmp_path / launch_id).mkdir()
    state = LaunchState(
        launch_id,
        tmp_path / launch_id,
        "search_test",
        "search_spaces/x.yaml",
        "",
        uri,
        parent_run_id,
        state="finished",
        plan={
            "metric": "best_ood_valid_acc",
            "mode": "max",
            "score": "acc",
            "ablation": False,
            "pairs": [
                {"name": "ctl__ndr", "trials": 3, "chance": "-"},
                {"name": "ctl__lstm", "trials": 1, "chance": "-"},
            ],
        },
    )
    state.save()
    return state


def same(found, wanted) -> bool:
    if isinstance(wanted, float):
        return found == pytest.approx(wanted, rel=1e-12)
    return found == wanted


def check_table(frame: pd.DataFrame, expected: dict[str, dict]) -> None:
    assert sorted(frame["run_id"]) == sorted(expected)  # one row per trial run of this launch, no other run
    columns = (
        set(IDENTITY) | {"cell", "candidate", "seed", *RAN_AS} | {k for row in expected.values() for k in row}
    )
    assert set(frame.columns) == columns
    assert list(frame.columns[: len(IDENTITY)]) == IDENTITY
    assert frame["start_time"].is_monotonic_increasing
    for _, row in frame.iterrows():
        wanted = expected[row["run_id"]]
        for column in columns - {"run_id", "start_time", "end_time"}:
            if column in wanted:
                assert same(row[column], wanted[column]), (column, row[column], wanted[column])
            else:  # a key of another pair's config, a metric this run never logged, no cell in a search
                assert pd.isna(row[column]), (column, row[column])


def test_export_writes_every_trial_run_as_csv_and_parquet(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    state, expected = search_launch(tmp_path, uri)
    # As fast as `status`: neither Ray nor torch is imported.
    probe = (
        "import sys; from orchestrator.cli.process import main; code = main(sys.argv[1:]); "
        "print(sorted(m for m in ('ray', 'torch') if m in sys.modules)); sys.exit(code)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, "export", "--storage-path", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    path, shape, imported = out.stdout.splitlines()
    assert path == str(state.dir / "export" / "runs.csv") and imported == "[]"
    csv = pd.read_csv(path)
    check_table(csv, expected)
    assert shape == f"{len(expected)} runs x {len(csv.columns)} columns"

    target = tmp_path / "elsewhere" / "table.parquet"  # the format from the extension, the folder made
    assert main(["export", "search-1", "--storage-path", str(tmp_path), "--output", str(target)]) == 0
    parquet = pd.read_parquet(target)
    check_table(parquet, expected)
    # Whole numbers stay whole where another pair's runs lack the key (the LSTM has no n_layers here).
    assert str(parquet["seed"].dtype) == "Int64" and str(parquet["member"].dtype) == "Int64"
    assert str(parquet["params.n_layers"].dtype) == "Int64" and str(parquet["params.lr"].dtype) == "float64"
    mixed = [{"n_layers": 4, "task_options": {"depth": 2, "p": 1}}, {"task_options": {"depth": 3, "p": 0.5}}]
    assert export.whole_number_keys(mixed) == {
        "params.n_layers",
        "params.task_options.depth",
    }  # p is a float in one run
    assert (parquet["end_time"] >= parquet["start_time"]).all()

    packed = tmp_path / "runs.csv.gz"  # a CSV compressed as its name says, as pandas reads it back
    assert main(["export", "search-1", "--storage-path", str(tmp_path), "--output", str(packed)]) == 0
    assert packed.read_bytes()[:2] == b"\x1f\x8b"
    check_table(pd.read_csv(packed), expected)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--format", "xlsx"],
            "orchestrator: error: --format: unknown format 'xlsx'; expected csv or parquet",
        ),
        (
            ["--output", "{tmp}/a-file/runs.csv"],
            "orchestrator: error: --output: cannot write {tmp}/a-file/runs.csv ({tmp}/a-file "
            "is not a writable folder)",
        ),
        (["--output", "{tmp}"], "orchestrator: error: --output: cannot write {tmp} ({tmp} is a folder)"),
    ],
)
def test_export_refuses_bad_input_in_one_line(tmp_path, capsys, flags, message):
    bare_launch(tmp_path, f"sqlite:///{tmp_path}/mlflow.db")
    (tmp_path / "a-file").write_text("")
    flags = [f.format(tmp=tmp_path) for f in flags]
    assert main(["export", "--storage-path", str(tmp_path), *flags]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [message.format(tmp=tmp_path)] and out.out == ""


def request(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, dict | str | None]:
    """(status, the answer's JSON; or where refused, its text)."""
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=data, method=method), timeout=10
        ) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_dashboard_serves_the_launchs_optuna_studies_and_changes_nothing(tmp_path):
    """The search store holds every launch's studies; the dashboard shows this launch's, and its
    buttons that would create, rename, delete or tell are refused (403, one line, no traceback in
    its log), with the store unchanged."""
    pytest.importorskip("optuna_dashboard", reason="the `dashboard` extra: pip install -e '.[dashboard]'")
    import optuna

    state = bare_launch(tmp_path, f"sqlite:///{tmp_path}/mlflow.db")
    # Where a launch keeps its studies: beside a SQLite store, mlflow.optuna.db (optuna_store.search_store).
    store = f"sqlite:///{tmp_path}/mlflow.optuna.db"
    optuna.create_study(study_name="search_test/another-launch/ctl__ndr", storage=store)
    for pair, best in (("ctl__ndr", 0.9), ("ctl__lstm", 1.0)):
        study = optuna.create_study(
            study_name=state.optuna_study_name(pair), storage=store, direction="maximize"
        )
        study.add_trial(
            optuna.trial.create_trial(
                params={"lr": 1e-3},
                distributions={"lr": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)},
                value=best,
            )
        )
    optuna.load_study(
        study_name=state.optuna_study_name("ctl__ndr"), storage=store
    ).ask()  # a trial running, for "tell"
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "dashboard",
            "--storage-path",
            str(tmp_path),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline, answer = time.monotonic() + 300, None
        while answer is None and time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as response:
                    assert response.status == 200
                    answer = json.loads(response.read())
            except OSError:
                time.sleep(0.3)
        assert answer is not None, f"no answer on port {port}; exit status {server.poll()}"
        assert sorted(s["study_name"] for s in answer["study_summaries"]) == [
            "search_test/search-1/ctl__lstm",
            "search_test/search-1/ctl__ndr",
        ]
        api = f"http://127.0.0.1:{port}/api"
        ids = {s.study_name: s._study_id for s in optuna.get_all_study_summaries(store)}
        own, other = ids["search_test/search-1/ctl__ndr"], ids["search_test/another-launch/ctl__ndr"]
        status, detail = request(f"{api}/studies/{own}")
        assert status == 200 and len(detail["trials"]) == 2
        assert request(f"{api}/studies/{other}")[0] == 404
        done, running = (t["trial_id"] for t in sorted(detail["trials"], key=lambda t: t["number"]))
        for method, path, body in [
            ("POST", "/studies", {"study_name": "new", "directions": ["minimize"]}),
            ("POST", f"/studies/{own}/rename", {"study_name": "renamed"}),
            ("DELETE", f"/studies/{own}", None),
            ("PUT", f"/studies/{own}/note", {"version": 1, "body": "x"}),
            ("POST", f"/trials/{done}/user-attrs", {"user_attrs": {"a": 1}}),
            ("POST", f"/trials/{running}/tell", {"state": "Complete", "values": [0.5]}),
        ]:
            assert request(api + path, method, body) == (403, READ_ONLY + "\n"), (method, path)
        after = optuna.get_all_study_summaries(store)
        assert sorted(s.study_name for s in after) == sorted(ids) and {
            s.study_name: s.n_trials for s in after
        } == {
            "search_test/another-launch/ctl__ndr": 0,
            "search_test/search-1/ctl__lstm": 1,
            "search_test/search-1/ctl__ndr": 2,
        }
        trials = optuna.load_study(study_name="search_test/search-1/ctl__ndr", storage=store).trials
        assert trials[0].user_attrs == {} and trials[1].state == optuna.trial.TrialState.RUNNING
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
    assert "  search_test/search-1/ctl__ndr\n  search_test/search-1/ctl__lstm\n" in output, output
    assert "Traceback" not in output and "Exception" not in output, output


def test_dashboard_without_the_extra_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # import fails as when the extra is missing
    assert main(["dashboard", "--storage-path", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "orchestrator: error: dashboard: optuna-dashboard is not installed; pip install -e '.[dashboard]'"
    ]


def test_dashboard_refuses_an_ablation_and_a_taken_port(tmp_path, capsys):
    pytest.importorskip("optuna_dashboard", reason="the `dashboard` extra: pip install -e '.[dashboard]'")
    import optuna

    state = bare_launch(tmp_path, f"sqlite:///{tmp_path}/mlflow.db")
    optuna.create_study(
        study_name=state.optuna_study_name("ctl__ndr"), storage=f"sqlite:///{tmp_path}/mlflow.optuna.db"
    )  # its search store
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["dashboard", "--storage-path", str(tmp_path), "--port", str(port)]) == 2
    # Bottle says where it would listen before it binds; the last line is ours.
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == f"orchestrator: error: --port: cannot listen on 127.0.0.1:{port} (Address already in use)"
    )
    state.plan["ablation"] = True
    state.save()
    assert main(["dashboard", "--storage-path", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "orchestrator: error: dashboard: launch search-1 is an ablation, whose grid runs without Optuna; "
        "`orchestrator report` or `orchestrator export` show its runs"
    ]


def test_dashboard_of_a_launch_whose_search_store_is_gone_is_one_line(tmp_path, capsys):
    """Opening the missing SQLite file made an empty one, and the dashboard served no studies."""
    pytest.importorskip("optuna_dashboard", reason="the `dashboard` extra: pip install -e '.[dashboard]'")
    bare_launch(tmp_path, f"sqlite:///{tmp_path}/mlflow.db")
    assert main(["dashboard", "--storage-path", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        f"orchestrator: error: dashboard: no search store (Optuna) at {tmp_path}/mlflow.optuna.db: the "
        "launch's studies were kept there"
    ]
    assert not (tmp_path / "mlflow.optuna.db").exists()
