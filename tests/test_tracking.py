"""The MLflow side of a driver crash, on a real SQLite store: what a new driver does with the runs
the killed one left behind. (The whole kill-and-resume path runs in test_service.py; the moments
tested here are too brief to hit reliably by killing a process.)"""

import errno
import json
import os
import pickle
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.record import retries, stores, summaries
from orchestrator.record.optuna_store import search_storage
from orchestrator.record.ranking import STARTED_FIRST
from orchestrator.record.retries import RetryNotices, StoreUnavailable, first_line, retried
from orchestrator.record.runs import (
    CONFIG_TAG,
    DIVERGED_AT_TAG,
    REPLAY_KEY,
    STATUS_TAG,
    artifact_root,
    launch_trial_runs,
    open_launch,
)
from orchestrator.record.secrets import redact, redact_secrets, redact_text
from orchestrator.record.state import LaunchState, TrackedLaunch, driver
from orchestrator.record.stores import TrackingError, check_store, remember, reveal
from orchestrator.record.summaries import confirmed_text, ended_runs, pair_summaries
from orchestrator.run.callbacks import TrialTracker

LAUNCH = TrackedLaunch("uri", "exp", "launch")  # of the tests whose runs stand in for the store's


def tracker_with_parent(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    parent = open_launch(
        TrackedLaunch(uri, "exp", "launch-1"), "space.yaml", "name: exp\n", tmp_path / "runs"
    )
    return uri, TrialTracker(
        uri,
        parent,
        "launch-1",
        {"tiny__ndr": {"model": "ndr", "n_iters": 20}},
        {"tiny__ndr": {"model": "ndr"}},
    )


def trial(trial_id: str, status: str = "RUNNING"):
    """What the tracker reads of a Tune trial."""
    return SimpleNamespace(
        trial_id=trial_id,
        config={"lr": 1e-3, "pair": "tiny__ndr"},
        last_result={},
        error_file=None,
        status=status,
    )


def result(step: int, loss: float) -> dict:
    return {
        "iteration": step,
        "loss": loss,
        "ood_valid_acc": 0.5,
        "hostname": "h",
        "node_ip": "ip",
        "device": "cpu",
        "node_id": "n",
    }


def driver_died_after_logging(tmp_path, monkeypatch, steps):
    """A tracker that logged `steps` of trial "a", and the tracker a new driver restores from
    Tune's checkpoint of it: (uri, first, second, trial)."""
    uri, first_driver = tracker_with_parent(tmp_path, monkeypatch)
    a = trial("a")
    first_driver.on_trial_start(0, [], a)
    for step in steps:
        first_driver.on_trial_result(0, [], a, result(step, 1.0 / step))
    return uri, first_driver, pickle.loads(pickle.dumps(first_driver)), a


def test_a_driver_searches_the_store_for_its_trials_runs_once_not_per_trial(tmp_path, monkeypatch):
    """Twelve trials start, report and end: one search of the experiment for the launch's trial
    runs and one for the pair's run (per trial, a search would grow with the store), and the runs
    numbered #1 to #12."""
    uri, tracker = tracker_with_parent(tmp_path, monkeypatch)
    searches = []
    search = tracker.mlflow.search_runs
    monkeypatch.setattr(tracker.mlflow, "search_runs", lambda *a, **k: searches.append(k) or search(*a, **k))
    trials = [trial(str(k)) for k in range(12)]
    for k, t in enumerate(trials):
        tracker.on_trial_start(0, trials[: k + 1], t)
        tracker.on_trial_result(0, trials[: k + 1], t, result(10, 0.5))
        tracker.on_trial_complete(0, trials[: k + 1], t)
    assert ["kind = 'trial'" in k["filter_string"] for k in searches] == [True, False]
    names = sorted(MlflowClient(uri).get_run(r).info.run_name.split()[0] for r in tracker.runs.values())
    assert names == sorted(f"#{k}" for k in range(1, 13))


def test_a_trials_writes_to_the_store_are_one_per_event(tmp_path, monkeypatch):
    """The driver writes a trial's run one call after another, each a transaction: its start
    (the run, its params), each evaluation (its metrics, with the tags that say where it ran at
    the first) and its end (its status tags, then the end) are a fixed few calls, not one per tag."""
    uri, tracker = tracker_with_parent(tmp_path, monkeypatch)
    calls = []
    for name in ("create_run", "log_batch", "set_tag", "set_terminated", "log_metric", "log_param"):
        method = getattr(tracker.mlflow, name)
        monkeypatch.setattr(
            tracker.mlflow, name, lambda *a, _m=method, _n=name, **k: calls.append(_n) or _m(*a, **k)
        )
    tracker.run_ids(trial("warm"))  # the launch's pair run, made once for all its trials
    calls.clear()
    a = trial("a")
    tracker.on_trial_start(0, [a], a)
    assert calls == ["create_run", "log_batch"]
    for step in (10, 20):
        tracker.on_trial_result(0, [a], a, result(step, 0.5))
    assert calls[2:] == ["log_batch", "log_batch"]
    a.last_result = {**result(20, 0.5), "status": "diverged"}
    tracker.on_trial_complete(0, [a], a)
    assert calls[4:] == ["log_batch", "set_terminated"]
    run = MlflowClient(uri).get_run(tracker.runs["a"])
    assert (run.data.tags[STATUS_TAG], run.data.tags[DIVERGED_AT_TAG], run.data.tags["node"]) == (
        "diverged",
        "20",
        "h",
    )
    assert run.data.metrics["loss"] == 0.5


def test_an_evaluation_replayed_after_a_restart_is_logged_once(tmp_path, monkeypatch):
    # The driver dies; Tune's checkpoint held the tracker as it was, and the trial restarts from its
    # iteration-10 checkpoint, so iteration 20 is reported again (with the same values).
    uri, first_driver, second_driver, a = driver_died_after_logging(tmp_path, monkeypatch, (10, 20))
    for step in (20, 30):
        second_driver.on_trial_result(0, [], a, result(step, 1.0 / step))
    history = MlflowClient(uri).get_metric_history(first_driver.runs["a"], "loss")
    assert [m.step for m in history] == [10, 20, 30]


def test_a_divergence_is_no_evaluation_and_is_not_logged_again_after_a_restart(tmp_path, monkeypatch):
    """A trial whose loss went NaN by iteration 30 reports that (status diverged, its best so far)
    and nothing else: no scores were computed at 30. Restored from the checkpoint it stopped at,
    it reports the same again to the next driver. Every metric's steps are its evaluations', once;
    a tag says where it diverged."""
    uri, first_driver, second_driver, a = driver_died_after_logging(tmp_path, monkeypatch, (10, 20))
    diverged = {
        **result(30, float("nan")),
        "status": "diverged",
        "best_ood_valid_acc": 0.5,
        "best_iteration": 20,
    }
    first_driver.on_trial_result(0, [], a, diverged)
    second_driver.on_trial_result(0, [], a, diverged)
    client = MlflowClient(uri)
    run_id = first_driver.runs["a"]
    for key in client.get_run(run_id).data.metrics:
        assert [m.step for m in client.get_metric_history(run_id, key)] in ([10, 20], [20]), key
    a.last_result = diverged
    second_driver.on_trial_complete(0, [], a)
    tags = client.get_run(run_id).data.tags
    assert (tags[STATUS_TAG], tags[DIVERGED_AT_TAG]) == ("diverged", "30")


def test_a_runs_tags_say_how_and_where_its_trial_ran_last(tmp_path, monkeypatch):
    """Tags are written at a run's first evaluation, and again where they change: a stack whose
    compiled step failed later (a new batch width) goes on uncompiled, a recovered trial lands on
    another node."""
    uri, tracker = tracker_with_parent(tmp_path, monkeypatch)
    a = trial("a")
    tracker.on_trial_start(0, [], a)
    tracker.on_trial_result(0, [], a, {**result(10, 0.1), "compile": "default"})
    assert MlflowClient(uri).get_run(tracker.runs["a"]).data.tags["compile"] == "default"
    tracker.on_trial_result(
        0, [], a, {**result(20, 0.1), "compile": "off (the compiled step failed)", "hostname": "h2"}
    )
    tags = MlflowClient(uri).get_run(tracker.runs["a"]).data.tags
    assert (tags["compile"], tags["node"], tags["device"]) == ("off (the compiled step failed)", "h2", "cpu")


def test_a_forgotten_trial_is_marked_lost_and_its_params_are_complete(tmp_path, monkeypatch):
    uri, tracker = tracker_with_parent(tmp_path, monkeypatch)
    forgotten, replacement = trial("a"), trial("b")
    tracker.on_trial_start(0, [], forgotten)
    tracker.on_trial_start(0, [], replacement)
    replacement.status = "TERMINATED"
    tracker.on_trial_complete(0, [], replacement)
    tracker.on_experiment_end([replacement])  # Tune no longer knows trial "a"
    client = MlflowClient(uri)
    lost = client.get_run(tracker.runs["a"])
    assert lost.data.tags[STATUS_TAG] == "lost" and lost.info.status == "KILLED"
    assert client.get_run(tracker.runs["b"]).data.tags[STATUS_TAG] == "completed"
    assert lost.data.params == {"lr": "0.001", "model": "ndr", "n_iters": "20"}
    summaries = pair_summaries(TrackedLaunch(uri, "exp", "launch-1"), "ood_valid_acc", "acc")
    assert (
        summaries["tiny__ndr"]["running"] == 0 and summaries["tiny__ndr"]["done"] == 1
    )  # a lost run counts nowhere


def test_a_lost_trials_replacement_takes_its_number_in_mlflow_the_console_and_the_report(
    tmp_path, monkeypatch, capsys
):
    """Trials "a" and "b" start; the driver is killed after Tune's snapshot of "a" alone. The resumed
    search proposes "c" in "b"'s place: its run is "#2" (not "#3"), as the console's "trial 2/3"."""
    from orchestrator.run.callbacks import ProgressLines

    uri, first_driver = tracker_with_parent(tmp_path, monkeypatch)
    lines = ProgressLines("ood_valid_acc", "max", {"tiny__ndr": 3}, {"tiny__ndr": 20}, every_s=3600)
    a, b, c = trial("a"), trial("b"), trial("c")
    for callback in (first_driver, lines):
        callback.on_trial_start(0, [a], a)
    snapshot, console = (
        pickle.dumps(first_driver),
        pickle.dumps(lines.get_state()),
    )  # Tune writes both to its snapshot
    for callback in (first_driver, lines):
        callback.on_trial_start(0, [a, b], b)
    second_driver, resumed_lines = (
        pickle.loads(snapshot),
        ProgressLines("ood_valid_acc", "max", {"tiny__ndr": 3}, {"tiny__ndr": 20}, every_s=3600),
    )
    resumed_lines.set_state(pickle.loads(console))
    for callback in (second_driver, resumed_lines):
        callback.on_trial_start(0, [a, c], c)
    resumed_lines.on_trial_result(0, [a, c], c, result(10, 0.5))
    second_driver.on_experiment_end([a, c])
    client = MlflowClient(uri)
    names = {
        t: client.get_run(run_id).info.run_name.split(" ")[0]
        for t, run_id in {**first_driver.runs, **second_driver.runs}.items()
    }
    assert names == {"a": "#1", "b": "#2", "c": "#2"}
    assert client.get_run(first_driver.runs["b"]).data.tags[STATUS_TAG] == "lost"
    assert "[tiny__ndr trial 2/3] it 10/20" in capsys.readouterr().out


def test_an_interrupted_trial_is_marked_so_and_running_again_on_resume(tmp_path, monkeypatch):
    """Ctrl-C: Tune's clean-up marks the unfinished trial TERMINATED, as it does a finished one,
    before the experiment ends; only the finished one's end was reported. The unfinished trial's
    run says interrupted (KILLED), the launch counts one trial ended, and the resumed driver's
    tracker finds the same run and marks it running again."""
    uri, tracker = tracker_with_parent(tmp_path, monkeypatch)
    a, done = trial("a"), trial("done")
    for t in (a, done):
        tracker.on_trial_start(0, [], t)
    tracker.on_trial_complete(0, [], done)
    a.status = done.status = "TERMINATED"
    tracker.on_experiment_end([a, done])
    client = MlflowClient(uri)
    run = client.get_run(tracker.runs["a"])
    assert run.data.tags[STATUS_TAG] == "interrupted" and run.info.status == "KILLED"
    assert client.get_run(tracker.runs["done"]).data.tags[STATUS_TAG] == "completed"
    assert ended_runs(TrackedLaunch(uri, "exp", "launch-1"), "search") == (1, 0)
    resumed = pickle.loads(pickle.dumps(tracker))
    resumed.runs.clear()
    resumed.on_trial_start(0, [], a)
    run = client.get_run(resumed.runs["a"])
    assert resumed.runs["a"] == tracker.runs["a"]
    assert run.data.tags[STATUS_TAG] == "running" and run.info.status == "RUNNING"


def test_a_run_found_again_gets_its_missing_params(tmp_path, monkeypatch):
    """A driver killed between creating a trial's run and logging its params: the next driver finds
    the run by its tags and completes the params instead of creating a second run."""
    uri, tracker = tracker_with_parent(tmp_path, monkeypatch)
    client = MlflowClient(uri)
    parent = client.get_run(tracker.parent_run_id)
    half_made = client.create_run(
        parent.info.experiment_id,
        tags={
            "mlflow.parentRunId": tracker.parent_run_id,
            "launch_id": "launch-1",
            "kind": "trial",
            "trial_id": "a",
            "pair": "tiny__ndr",
            STATUS_TAG: "running",
        },
    )
    tracker.on_trial_start(0, [], trial("a"))
    assert tracker.runs["a"] == half_made.info.run_id
    assert client.get_run(half_made.info.run_id).data.params == {
        "lr": "0.001",
        "model": "ndr",
        "n_iters": "20",
    }


def test_evaluations_the_dead_driver_never_logged_are_replayed_from_the_checkpoint(tmp_path, monkeypatch):
    """The driver dies after the trial wrote the checkpoint of iteration 30 and before it logged
    that evaluation; the trial restores from it and its first result carries the checkpoint's
    history, so MLflow still gets every step once."""
    uri, first_driver, second_driver, a = driver_died_after_logging(tmp_path, monkeypatch, (10, 20))
    history = [{"iteration": step, "loss": 1.0 / step} for step in (10, 20, 30)]
    second_driver.on_trial_result(0, [], a, {**result(40, 1.0 / 40), REPLAY_KEY: json.dumps(history)})
    logged = MlflowClient(uri).get_metric_history(first_driver.runs["a"], "loss")
    assert [(m.step, m.value) for m in logged] == [(step, 1.0 / step) for step in (10, 20, 30, 40)]


def test_a_password_is_stored_redacted_and_revealed_only_from_memory_or_the_environment(monkeypatch):
    uri = "postgresql+psycopg://mlflow:s3cr3t@db:5432/runs"
    text = "tracking: {uri: 'postgresql+psycopg://mlflow:s3cr3t@db:5432/runs'}\n"
    assert redact_text(text, uri) == "tracking: {uri: 'postgresql+psycopg://mlflow:***@db:5432/runs'}\n"
    # SQLAlchemy reads a password up to the first @: one with / # ? (a generated one) is a password too.
    for password in ("ab/cd+e", "x#y?z", "a:b"):
        assert redact(f"postgresql://mlflow:{password}@db/runs") == "postgresql://mlflow:***@db/runs"
    assert redact("sqlite:////data/a@b/mlflow.db") == "sqlite:////data/a@b/mlflow.db"
    # A user name with @ (Azure's user@server): SQLAlchemy's user name runs to the first colon.
    from sqlalchemy.engine import make_url

    azure = "postgresql://mlflow@corp:s3cret@db/runs"
    assert make_url(azure).password == "s3cret" and redact(azure) == "postgresql://mlflow@corp:***@db/runs"
    assert (
        redact("postgresql://mlflow@db:5432/runs") == "postgresql://mlflow@db:5432/runs"
    )  # no password, a port
    common = "postgresql://mlflow:test@db/runs"  # a password that is also a word of the file
    assert (
        redact_text(f"tracking: {{uri: '{common}'}}\nname: test_x2\n", common)
        == "tracking: {uri: 'postgresql://mlflow:***@db/runs'}\nname: test_x2\n"
    )
    monkeypatch.setattr(stores, "_FULL_URIS", {})
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    stored = redact(uri)
    with pytest.raises(TrackingError, match="set MLFLOW_TRACKING_URI"):
        reveal(stored)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert reveal(stored) == uri
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert remember(uri) == stored and reveal(stored) == uri
    assert reveal("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    query = (
        "postgresql+psycopg://mlflow@db/runs?sslmode=require&password=s3cr3t"  # psycopg takes it there too
    )
    assert redact(query) == "postgresql+psycopg://mlflow@db/runs?sslmode=require&password=***"
    assert remember(query) == redact(query) and reveal(redact(query)) == query


def test_secrets_are_redacted_wherever_a_text_shows_them():
    """Messages, tracebacks and stored files: any URI's password (an unencoded @ in it included),
    a secret in a URI's query, a secret-named key's value, quoted or not; not a score that starts
    like one, nor a port before an @ further on; and a redacted file is still YAML."""
    text = (
        "got 'postgres://alice:p@ss@db/x' and https://bob:pw2@host:8443/api postgresql://mlflow@corp:s3@db/r "
        "sqlite:////a@b/m.db {'aws_secret_access_key': 'A,K;x', 'uri': 's3://b'} see "
        "http://host:8080/people/ann@example.com\n"
        "  password: hunter2\nendpoint?sslpassword=abc&x=1 (api_key = K); token_acc: "
        "0.95, best_iid_token_acc 1.0\n"
    )
    assert redact_secrets(text) == (
        "got 'postgres://alice:***@db/x' and https://bob:***@host:8443/api postgresql://mlflow@corp:***@db/r "
        "sqlite:////a@b/m.db {'aws_secret_access_key': '***', 'uri': 's3://b'} see "
        "http://host:8080/people/ann@example.com\n"
        "  password: '***'\nendpoint?sslpassword=***&x=1 (api_key = '***'); token_acc: "
        "0.95, best_iid_token_acc 1.0\n"
    )
    spec = (
        "tracking: {uri: 'postgresql://u:pw@db/x?password=pw'}\nstorage: {uri: s3://b/r, password: hunter2}\n"
    )
    assert yaml.safe_load(redact_secrets(spec)) == {
        "tracking": {"uri": "postgresql://u:***@db/x?password=***"},
        "storage": {"uri": "s3://b/r", "password": "***"},
    }


def test_a_traceback_the_command_lets_through_shows_no_password(monkeypatch, capsys):
    """A store's client names its URI in its errors (MLflow's HTTP client, password and all)."""
    import sys

    from orchestrator.cli.process import redact_tracebacks

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    redact_tracebacks()
    try:
        raise RuntimeError("API request to https://alice:HttpsPW@127.0.0.1:18443/api/2.0/mlflow failed")
    except RuntimeError as e:
        sys.excepthook(type(e), e, e.__traceback__)
    err = capsys.readouterr().err
    assert "Traceback" in err and "https://alice:***@127.0.0.1:18443" in err and "HttpsPW" not in err


def test_artifacts_live_beside_a_sqlite_store_not_in_the_working_folder(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "store").mkdir()
    parent = open_launch(
        TrackedLaunch(uri, "exp", "launch-1"), "space.yaml", "name: exp\n", tmp_path / "runs"
    )
    assert (tmp_path / "store" / "mlartifacts").is_dir() and list(elsewhere.iterdir()) == []
    assert MlflowClient(uri).download_artifacts(parent, "search_space.yaml", str(tmp_path))


def test_artifacts_of_a_postgresql_store_live_beside_the_launch_folders(
    tmp_path, monkeypatch, postgres_database
):
    """MLflow's default for a database it reaches directly is ./mlruns of the folder the
    experiment's first launch ran in (a repository checkout, a home folder), which every later
    launch of it then writes into, on whatever machine it runs."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    parent = open_launch(
        TrackedLaunch(postgres_database.uri, "exp", "launch-1"),
        "space.yaml",
        "name: exp\n",
        tmp_path / "runs",
    )
    assert (tmp_path / "runs" / "mlartifacts").is_dir() and list(elsewhere.iterdir()) == []
    assert MlflowClient(postgres_database.uri).download_artifacts(parent, "search_space.yaml", str(tmp_path))
    assert (
        artifact_root("https://mlflow.example:5000", tmp_path) is None
    )  # the server's --artifacts-destination


@pytest.mark.parametrize(
    "uri",
    ["postgresql+psycopg://alice:Hunter2@Secret@127.0.0.1:1/db", "https://bob:Hunter2@Secret@127.0.0.1:1"],
)
def test_a_password_holding_an_at_sign_is_refused_unseen(uri, monkeypatch):
    """The driver read the password to its first @ and printed the rest as the host it could not
    resolve ('Secret@127.0.0.1'), past our redaction; a user name holding @ (Azure's) is fine."""
    with pytest.raises(TrackingError) as refused:
        check_store(uri, timeout_s=1)
    assert "Hunter2" not in str(refused.value) and "Secret" not in str(refused.value)
    assert str(refused.value).endswith(
        "its password holds an @, which ends it where a driver reads it: write the @ as %40"
    )
    monkeypatch.setenv("SYSGEN_STORE_RETRY_S", "0")
    with pytest.raises(StoreUnavailable) as unreachable:
        check_store("postgresql+psycopg://mlflow@corp:Hunter2@127.0.0.1:1/db", timeout_s=1)
    assert "unreachable for" in str(unreachable.value) and "Hunter2" not in str(unreachable.value)


def test_a_retried_store_fault_is_one_line_of_ours(monkeypatch, capsys):
    """Three calls, each failing twice as a dropped connection does, then answering: one notice
    (the next would come only after `every_s`), counting in the one after it what it stood for."""
    import sqlalchemy.exc

    monkeypatch.setattr(retries, "RETRY_DELAYS_S", (0, 0, 0))
    monkeypatch.setattr(retries, "NOTICES", RetryNotices(every_s=3600))
    failures = iter([True, True, False] * 3)

    def query():
        if next(failures):
            raise sqlalchemy.exc.OperationalError(
                "SELECT 1", {}, Exception("terminating connection due to administrator command")
            )
        return "answer"

    call = retried(query, "tracking store x")
    assert [call() for _ in range(3)] == ["answer"] * 3
    assert (
        capsys.readouterr().out
        == "[store] tracking store x: terminating connection due to administrator command; retrying in 0 s\n"
    )
    retries.NOTICES.every_s = 0
    retries.NOTICES.retrying("tracking store x", "gone", 0.5)
    assert (
        capsys.readouterr().out
        == "[store] tracking store x: gone; retrying in 0.5 s (6 calls retried since the last notice)\n"
    )


def test_a_fault_that_says_nothing_is_named_by_its_type(monkeypatch, capsys):
    """A driver's error whose first line is SQLAlchemy's prefix alone gave the notice an empty
    reason ("[store] x: ; retrying"); a bare TimeoutError would have too."""
    import sqlalchemy.exc

    class AdminShutdown(ConnectionError):
        pass

    monkeypatch.setattr(retries, "RETRY_DELAYS_S", (0, 0))
    monkeypatch.setattr(retries, "NOTICES", RetryNotices(every_s=0))
    faults = iter([AdminShutdown("(psycopg.errors.AdminShutdown) \n[SQL: SELECT 1]"), TimeoutError()])

    def query():
        if (fault := next(faults, None)) is not None:
            raise fault
        return "answer"

    assert retried(query, "tracking store x")() == "answer"
    assert capsys.readouterr().out == (
        "[store] tracking store x: AdminShutdown; retrying in 0 s\n"
        "[store] tracking store x: TimeoutError; retrying in 0 s\n"
    )
    assert (
        first_line(sqlalchemy.exc.OperationalError("SELECT 1", {}, ConnectionResetError()))
        == "ConnectionResetError"
    )
    assert (
        first_line(sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("server closed")))
        == "server closed"
    )


def test_the_retried_optuna_methods_are_its_public_storage_api_by_name():
    """The storage calls retried are named public methods, not found in Optuna's source nor its
    private ones: an upgrade that renames or adds one fails here rather than leaving it unretried.
    Optuna puts no cache of its own around the wrapper (it would call RDBStorage's private methods)."""
    import inspect

    import optuna
    from optuna.storages import BaseStorage, RDBStorage

    from orchestrator.record.optuna_store import SESSION_METHODS, RetryingStorage

    assert all(
        not name.startswith("_") and inspect.isfunction(vars(RDBStorage).get(name))
        for name in SESSION_METHODS
    )
    assert BaseStorage.__abstractmethods__ <= set(SESSION_METHODS)  # the API every storage implements
    assert not RetryingStorage.__abstractmethods__
    storage = RetryingStorage("sqlite://")
    assert optuna.create_study(storage=storage)._storage is storage


def test_optuna_calls_while_connections_are_terminated_are_retried(
    tmp_path, monkeypatch, capsys, postgres_database
):
    """Optuna's reads and writes while every connection of its database is terminated five times a
    second (as test_cluster's launch meets them): each call that opens a session is retried in a
    fresh one and succeeds; none raises, and the console has our retry lines only. A helper that
    works on rows its caller read (`_build_frozen_trial_from_trial_model`) was once retried too,
    in a fresh session that had detached those rows: get_trial then failed for good."""
    import threading

    import optuna
    import psycopg

    monkeypatch.setattr(retries, "NOTICES", RetryNotices(every_s=0))
    database, uri = postgres_database.name, postgres_database.uri
    storage = search_storage(uri, tmp_path)
    study = optuna.create_study(storage=storage, study_name="cut")
    trial_ids = [study.ask()._trial_id for _ in range(3)]
    done = threading.Event()

    def terminate():
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as killer:
            while not done.is_set():
                killer.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,)
                )
                time.sleep(0.2)

    thread = threading.Thread(target=terminate)
    thread.start()
    calls, end = 0, time.monotonic() + 10
    try:
        while time.monotonic() < end:
            trial_id = trial_ids[calls % 3]
            storage.set_trial_intermediate_value(trial_id, calls, 0.5)
            assert storage.get_trial(trial_id).intermediate_values[calls] == 0.5
            calls += 1
    finally:
        done.set()
        thread.join()
    out = capsys.readouterr().out
    assert "[store] search store (Optuna): " in out  # the terminations did hit calls
    assert all(line.startswith("[store] ") for line in out.splitlines()), out


def test_opening_a_store_whose_connections_are_terminated_is_retried(
    tmp_path, monkeypatch, capsys, postgres_database
):
    """Opening the stores creates their tables (MLflow's dozens of migrations, Optuna's schema),
    statements on a fresh PostgreSQL database: its connections terminated meanwhile (as an
    administrator would), or refused for a while (as a restarting server does), are retried like any
    other call, not a traceback. Optuna's schema is created too quickly for terminations to hit it
    reliably (they hit idle pooled connections, which pre-ping replaces silently), so its fault is
    the refusal, which every first connection meets."""
    import threading

    monkeypatch.setattr(retries, "NOTICES", RetryNotices(every_s=0))
    database, uri, admin = postgres_database.name, postgres_database.uri, postgres_database.admin

    def connected() -> bool:
        found = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,))
        return found.fetchone()[0] > 0

    def in_background(seconds: float, fault) -> threading.Thread:
        def loop():  # from the client's first connection on: a loaded machine may take seconds to get there
            give_up = time.monotonic() + 60
            while not connected() and time.monotonic() < give_up:
                time.sleep(0.01)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                fault()
                time.sleep(0.05)

        thread = threading.Thread(target=loop)
        thread.start()
        return thread

    def terminate():
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,)
        )

    reopen = threading.Timer(1.5, admin.execute, (f"ALTER DATABASE {database} ALLOW_CONNECTIONS true",))
    try:
        faults = in_background(1.5, terminate)
        assert stores.client(uri).search_experiments(
            max_results=1
        )  # its migrations ran: the Default experiment
        faults.join()
        out = capsys.readouterr().out
        # A termination reads as the server's notice, or, where it lands mid-read, as the connection closing.
        assert re.match(
            rf"\[store\] tracking store {re.escape(uri)}: "
            r"(terminating connection due to administrator command"
            r"|consuming input failed: server closed the connection unexpectedly); retrying",
            out,
        ), out
        assert all(line.startswith("[store] ") for line in out.splitlines()), out

        admin.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
        terminate()
        reopen.start()
        assert search_storage(uri, tmp_path).get_all_studies() == []
        reopen.join()
        out = capsys.readouterr().out
        assert (
            out.startswith("[store] search store (Optuna): connection failed")
            and "not currently accepting connections; retrying" in out
        ), out
        assert all(line.startswith("[store] ") for line in out.splitlines()), out
    finally:
        reopen.cancel()


def test_of_trials_tied_on_the_metric_the_first_started_answers(tmp_path, monkeypatch):
    """The store returns runs newest first, so the last of three trials tied at the best value used
    to answer (make run's three PANM trials all reach OOD 1.000): its config, its test score,
    while Optuna's study.best_trial, the first of them, named another."""
    uri, tracker = tracker_with_parent(tmp_path, monkeypatch)
    trials = [trial(trial_id) for trial_id in "cab"]  # ids out of start order
    for t in trials:
        tracker.on_trial_start(0, [], t)
        time.sleep(0.01)  # start times a few milliseconds apart, as Tune's trials start
    for t in reversed(trials):
        tracker.on_trial_result(0, [], t, result(10, 0.1))
        t.status = "TERMINATED"
        tracker.on_trial_complete(0, [], t)
    started = [tracker.runs[trial_id] for trial_id in "cab"]
    assert [run.info.run_id for run in launch_trial_runs(TrackedLaunch(uri, "exp", "launch-1"))] == started
    assert (
        pair_summaries(TrackedLaunch(uri, "exp", "launch-1"), "ood_valid_acc", "acc")["tiny__ndr"]["best_run"]
        == started[0]
    )


def test_a_tie_on_the_metric_goes_to_the_in_distribution_score_then_the_training_loss(monkeypatch):
    """Three trials saturate OOD validation at 1.0 (make run's PANM trials did): the one with the
    higher in-distribution score answers, and says it was chosen so; with that tied too, the lower
    training loss; with everything tied, the first started; a strict winner needs no tie-break.
    The confirmation's top candidates are ranked by the same rule."""

    def run(run_id, value, iid, loss):
        tags = {
            "pair": "p",
            "phase": "search",
            STATUS_TAG: "completed",
            CONFIG_TAG: json.dumps({"lr": run_id}),
        }
        metrics = {"m": value, "iid_valid_acc_at_best": iid, "loss": loss, "test_x2_acc_at_best": iid / 2}
        return SimpleNamespace(
            info=SimpleNamespace(run_id=run_id), data=SimpleNamespace(tags=tags, metrics=metrics)
        )

    def best(*runs):
        monkeypatch.setattr(summaries, "launch_trial_runs", lambda *args: list(runs))
        s = pair_summaries(LAUNCH, "m", "acc", headline="test_x2_acc_at_best")["p"]
        return s["best_run"], s["decided_by"], s["test"]

    assert best(run("a", 1.0, 0.9, 0.2), run("b", 1.0, 0.95, 0.3), run("c", 0.9, 1.0, 0.1)) == (
        "b",
        "iid_valid_acc_at_best",
        0.475,
    )
    assert best(run("a", 1.0, 0.9, 0.2), run("b", 1.0, 0.9, 0.1))[:2] == ("b", "loss")
    assert best(run("a", 1.0, 0.9, 0.2), run("b", 1.0, 0.9, 0.2))[:2] == ("a", STARTED_FIRST)
    assert best(run("a", 0.8, 0.9, 0.2), run("b", 1.0, 0.5, 0.9))[:2] == ("b", None)
    monkeypatch.setattr(
        summaries,
        "launch_trial_runs",
        lambda *args: [run("a", 1.0, 0.9, 0.2), run("b", 1.0, 0.95, 0.3), run("c", 0.9, 1.0, 0.1)],
    )
    assert [c["lr"] for c in summaries.top_configs(LAUNCH, "m", "acc", 2)["p"]] == ["b", "a"]


def test_the_answer_is_a_trial_that_completed_and_a_candidate_whose_seeds_did(monkeypatch):
    """The best search trial is one that completed (or still runs), not one that scored well and then
    diverged or was stopped early; the confirmed candidate is the one with the most seeds completed,
    not one lucky seed beside two that diverged."""

    def run(run_id, status, value, phase="search", candidate=None):
        tags = {
            "pair": "p",
            "phase": phase,
            STATUS_TAG: status,
            CONFIG_TAG: json.dumps({"lr": run_id, "seed": 0}),
            **({"candidate": str(candidate)} if candidate is not None else {}),
        }
        return SimpleNamespace(
            info=SimpleNamespace(run_id=run_id),
            data=SimpleNamespace(tags=tags, metrics={"m": value, "test_acc_at_best": value}),
        )

    runs = [
        run("done", "completed", 0.8),
        run("diverged", "diverged", 0.95),
        run("stopped", "early_stopped", 0.9),
        *(run(f"c0-{k}", "completed", value, "confirm", 0) for k, value in enumerate((0.9, 0.92, 0.88))),
        run("c1-0", "completed", 0.97, "confirm", 1),
        run("c1-1", "diverged", 0.2, "confirm", 1),
        run("c1-2", "failed", 0.0, "confirm", 1),
    ]
    monkeypatch.setattr(summaries, "launch_trial_runs", lambda *args: runs)
    summary = pair_summaries(LAUNCH, "m", "acc")["p"]
    assert (summary["best_run"], summary["done"], summary["failed"], summary["stopped"]) == ("done", 1, 1, 1)
    assert summary["diverged"] == 1  # of the failed: the launch's summary line says so
    confirmed = summary["confirmed"]
    assert (confirmed["candidate"], confirmed["n"], confirmed["seeds"]) == (0, 3, 3) and confirmed[
        "test"
    ] == pytest.approx(0.9)
    assert confirmed["splits"] == {
        "test_acc_at_best": [0.9, 0.92, 0.88]
    }  # each seed's, for the launch's answer over seeds
    runs[3:6] = [
        run("c0-0", "completed", 0.9, "confirm", 0),
        run("c0-1", "diverged", 0.1, "confirm", 0),
        run("c0-2", "completed", 0.92, "confirm", 0),
    ]
    confirmed = pair_summaries(LAUNCH, "m", "acc")["p"]["confirmed"]
    assert (
        confirmed["candidate"] == 0
        and confirmed_text(confirmed) == "confirmed 0.910 ± 0.014 over 2 of 3 seeds (candidate 1)"
    )
    runs.append(
        run("c2-0", "running", 0.99, "confirm", 2)
    )  # a confirmation still under way: its answer may change
    confirmed = pair_summaries(LAUNCH, "m", "acc")["p"]["confirmed"]
    assert confirmed_text(confirmed).endswith("(candidate 1; so far: 1 confirmation run(s) still running)")


def test_a_role_that_can_only_read_opens_a_launchs_studies(tmp_path, postgres_database):
    """The dashboard and the report only read a launch's Optuna studies, and a team may give them a
    PostgreSQL role that can create nothing. Opened read-only, the search store creates no schema
    (and Optuna no tables: they exist); before, its CREATE SCHEMA failed for such a role."""
    import uuid

    import optuna
    import psycopg

    database, admin, role = postgres_database.name, postgres_database.admin, f"reader_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE ROLE {role} LOGIN")
    try:
        owner = postgres_database.uri
        optuna.create_study(study_name="launch/pair", storage=search_storage(owner, tmp_path))
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}", autocommit=True) as db:
            db.execute(f"GRANT USAGE ON SCHEMA optuna TO {role}")
            db.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA optuna TO {role}")
        reader = f"postgresql+psycopg://{role}@127.0.0.1:5432/{database}"
        with pytest.raises(Exception, match="permission denied"):
            search_storage(reader, tmp_path)
        storage = search_storage(reader, tmp_path, read_only=True)
        assert [s.study_name for s in storage.get_all_studies()] == ["launch/pair"]
        storage.rdb.engine.dispose()
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")  # before the role its grants name
        admin.execute(f"DROP ROLE IF EXISTS {role}")


def test_the_progress_lines_best_is_never_a_stack_that_diverged(capsys):
    """A stack whose members all diverged reports NaN (the mean of none): the console's best per
    pair skips it, so the trials after it can still be its best; its line says it diverged."""
    import math
    from types import SimpleNamespace

    from orchestrator.run.callbacks import ProgressLines

    lines = ProgressLines("best_ood_valid_acc", "max", {"p": 6}, {"p": 20}, every_s=0, stack_of="mean")
    stack = SimpleNamespace(trial_id="a", config={"pair": "p", "members": [{"seed": 0}, {"seed": 1}]})
    single = SimpleNamespace(trial_id="b", config={"pair": "p", "seed": 2})
    lines.on_trial_result(
        0, [], stack, {"iteration": 10, "best_ood_valid_acc": math.nan, "status": "diverged"}
    )
    assert "p" not in lines.best
    lines.on_trial_result(0, [], single, {"iteration": 10, "best_ood_valid_acc": 0.9, "status": "running"})
    assert lines.best == {"p": 0.9}
    lines.on_trial_result(
        0,
        [],
        SimpleNamespace(trial_id="c", config={"pair": "p", "seed": 3}),
        {"iteration": 20, "best_ood_valid_acc": math.nan, "status": "diverged", "loss": math.inf},
    )
    printed = [line for line in capsys.readouterr().out.splitlines() if " it " in line]
    assert printed[0].endswith("best_ood_valid_acc - (mean of 2 stacked members); every member diverged")
    assert printed[2].endswith("best_ood_valid_acc -; diverged (loss inf)")


def test_the_progress_lines_eta_comes_from_the_running_trials_iterations(monkeypatch, capsys):
    """A pair's 5 seeds stacked may be a launch's only trial for half an hour: the ETA comes from the
    pace of the runs' iterations since the first evaluation (after the start-up and the compile),
    not from trials ended."""
    import pickle
    from types import SimpleNamespace

    from orchestrator.run import callbacks

    clock = [100.0]
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    lines = callbacks.ProgressLines(
        "best_ood_valid_acc", "max", {"p": 10}, {"p": 1000}, every_s=0, stack_of="mean"
    )
    stack = SimpleNamespace(trial_id="a", config={"pair": "p", "members": [{"seed": s} for s in range(5)]})
    clock[0] = 280.0  # three minutes of compiling before the first evaluation
    lines.on_trial_result(0, [], stack, {"iteration": 100, "best_ood_valid_acc": 0.1})
    assert "runs ended 0/10, 3.0 min, ETA after the second evaluation" in capsys.readouterr().out
    clock[0] = 340.0  # 5 runs x 100 of 1,000 iterations in 60 s: half a run a minute, 9 runs left
    lines.on_trial_result(0, [], stack, {"iteration": 200, "best_ood_valid_acc": 0.2})
    assert "ETA 18 min" in capsys.readouterr().out
    clock[0] = 1360.0  # the stack ends: 4.5 runs in 18 min since the first evaluation, 5 left
    lines.on_trial_complete(0, [], stack)
    assert "runs ended 5/10, 21.0 min, ETA 20 min" in capsys.readouterr().out
    # Resumed: two trials restored half-way report their first evaluations here; what they did before
    # is no pace of this driver's (each does a tenth of a run a minute: 2.6 runs left, 13 min).
    clock[0] = 0.0
    resumed = pickle.loads(
        pickle.dumps(callbacks.ProgressLines("best_ood_valid_acc", "max", {"p": 4}, {"p": 1000}, every_s=0))
    )
    trials = [
        SimpleNamespace(trial_id=name, config={"pair": "p", "seed": seed}) for seed, name in enumerate("cd")
    ]
    for step, start in ((600, 0.0), (700, 60.0)):
        for k, trial in enumerate(trials):
            clock[0] = start + k
            resumed.on_trial_result(0, [], trial, {"iteration": step, "best_ood_valid_acc": 0.5})
    assert capsys.readouterr().out.rstrip().endswith("ETA 13 min; best best_ood_valid_acc: p 0.5000")


def test_a_servers_user_and_password_in_the_uri_are_sent_as_mlflows_client_sends_them():
    """http://user:password@host:port: urllib took `user:password@host` for the host name and the
    check said the server could not be reached while it answered."""
    import base64
    import http.server
    import threading

    seen = []

    class NoSuchExperiment(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    class Refused(NoSuchExperiment):
        def do_GET(self):
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b"bad credentials")

    servers = [http.server.HTTPServer(("127.0.0.1", 0), handler) for handler in (NoSuchExperiment, Refused)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        check_store(f"http://alice:s%40cret@127.0.0.1:{servers[0].server_port}")
        with pytest.raises(
            TrackingError, match=r"401 bad credentials \(the URI's user and password were refused\)"
        ):
            check_store(f"http://alice:wrong@127.0.0.1:{servers[1].server_port}")
    finally:
        for server in servers:
            server.shutdown()
    assert seen == [
        (
            "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default",
            "Basic " + base64.b64encode(b"alice:s@cret").decode(),
        )
    ]


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_launches_that_open_a_new_store_at_once_all_get_it_whole(tmp_path, request, store):
    """Two launches that opened a new store at the same moment both ran MLflow's migrations on it:
    on SQLite one failed, the other printed alembic's traceback, and the store refused every later
    launch ("table _alembic_tmp_latest_metrics already exists"); on PostgreSQL one failed with a
    duplicate key. Four processes here open a new store, MLflow's and Optuna's, at one moment
    (each waits for a file after its imports)."""
    import subprocess
    import sys

    uri = (
        f"sqlite:///{tmp_path}/runs/mlflow.db"
        if store == "sqlite"
        else request.getfixturevalue("postgres_database").uri
    )
    (tmp_path / "runs").mkdir()
    go = tmp_path / "go"
    code = (
        "import sys, time, pathlib; from orchestrator.record import optuna_store, stores\n"
        "pathlib.Path(sys.argv[2] + sys.argv[3]).touch()\n"
        "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.01)\n"
        "client = stores.client(sys.argv[1]); client.create_experiment('exp-' + sys.argv[3])\n"
        "optuna_store.search_storage(sys.argv[1], pathlib.Path(sys.argv[2]).parent)\n"
    )
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", code, uri, str(go), str(k)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for k in range(4)
    ]
    deadline = time.time() + 120
    while (
        not all(Path(f"{go}{k}").exists() for k in range(4)) and time.time() < deadline
    ):  # their imports done
        time.sleep(0.05)
    go.touch()
    outputs = [opener.communicate(timeout=300)[0] for opener in openers]
    assert [opener.returncode for opener in openers] == [0] * 4, "\n".join(outputs)[-3000:]
    assert sorted(e.name for e in MlflowClient(uri).search_experiments()) == [
        "Default",
        "exp-0",
        "exp-1",
        "exp-2",
        "exp-3",
    ]
    assert open_launch(
        TrackedLaunch(uri, "exp-0", "launch-1"), "space.yaml", "name: exp\n", tmp_path / "runs"
    )


def test_launches_of_one_file_begun_in_the_same_second_get_a_folder_and_parent_run_each(
    tmp_path, monkeypatch
):
    """A launch is named by its file and the second it began; two begun in the same second shared
    one folder and one MLflow parent run (and so each other's trials)."""
    from orchestrator.plan.load import load_study
    from orchestrator.run import registry

    path = tmp_path / "space.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "same",
                "seeds": [0],
                "tasks": ["copy"],
                "models": ["lstm_seq2seq"],
                "metric": "best_ood_valid_seq_acc",
                "tracking": {"uri": f"sqlite:///{tmp_path}/runs/mlflow.db"},
                "storage_path": str(tmp_path / "runs"),
            }
        )
    )
    monkeypatch.setattr(registry.time, "strftime", lambda fmt: "20261128-000000")
    states = [registry.register(load_study(path), path.read_text())[0] for _ in range(3)]
    assert [s.launch_id for s in states] == [
        "same-20261128-000000",
        "same-20261128-000000-2",
        "same-20261128-000000-3",
    ]
    assert len({s.dir for s in states}) == len({s.parent_run_id for s in states}) == 3
    night, _ = registry.register(load_study(path), path.read_text(), night=0)
    assert night.launch_id == "same-night-20261128-000000"
    # --launch-id: the command's check passed both, and they wrote one folder's launch.json in turn
    first, lock = registry.register(load_study(path), path.read_text(), "team-x")
    assert (
        first.launch_id == "team-x" and driver(first.dir)[0]
    )  # held from its registration on: status sees a driver
    with pytest.raises(registry.LaunchExists, match="launch team-x exists in"):
        registry.register(load_study(path), path.read_text(), "team-x")
    lock.close()
    with pytest.raises(
        registry.LaunchExists, match="launch team-x exists in"
    ):  # its driver gone, the launch stays
        registry.register(load_study(path), path.read_text(), "team-x")


def test_a_launch_id_whose_registration_did_not_finish_can_be_given_again(tmp_path, monkeypatch):
    """`--launch-id` claimed its id with an empty launch.json, which a driver killed while it
    registered left for good: `status` called the launch damaged, and a RayJob's retry (resume
    where launch.json exists) failed the same way. The claim is now the driver's lock, which dies
    with it; a registration that fails frees it too."""
    from orchestrator.plan.load import load_study
    from orchestrator.run import registry

    path = tmp_path / "space.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "team",
                "seeds": [0],
                "tasks": ["copy"],
                "models": ["lstm_seq2seq"],
                "metric": "best_ood_valid_seq_acc",
                "tracking": {"uri": f"sqlite:///{tmp_path}/runs/mlflow.db"},
                "storage_path": str(tmp_path / "runs"),
            }
        )
    )
    seen = []

    def store_down(*args):
        seen.append(((tmp_path / "runs/team-y/launch.json").exists(), driver(tmp_path / "runs/team-y")[0]))
        raise StoreUnavailable("the store did not answer")

    with monkeypatch.context() as patch:
        patch.setattr(registry, "open_launch", store_down)
        with pytest.raises(StoreUnavailable):
            registry.register(load_study(path), path.read_text(), "team-y")
    assert seen == [
        (False, True)
    ]  # while it registered: no launch.json for status to misread, a driver alive
    registry.hold_driver_lock(tmp_path / "runs/team-y").close()  # a driver killed as it registered
    state, lock = registry.register(load_study(path), path.read_text(), "team-y")
    assert state.launch_id == "team-y" and LaunchState.load(state.dir).parent_run_id == state.parent_run_id
    lock.close()


def test_a_launch_whose_launch_json_cannot_be_written_leaves_no_running_mlflow_run(tmp_path, monkeypatch):
    """The parent run is made before launch.json: a write that fails there (here its rename, as on
    a full disk; a kill) left MLflow a launch RUNNING for good, which no `status` or `resume` could
    reach. It ends KILLED and the id is free again."""
    from orchestrator.plan.load import load_study
    from orchestrator.run import registry

    uri = f"sqlite:///{tmp_path}/runs/mlflow.db"
    path = tmp_path / "space.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "team",
                "seeds": [0],
                "tasks": ["copy"],
                "models": ["lstm_seq2seq"],
                "metric": "best_ood_valid_seq_acc",
                "tracking": {"uri": uri},
                "storage_path": str(tmp_path / "runs"),
            }
        )
    )
    rename = os.replace

    def full_disk(source, target):
        if Path(target).name == "launch.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        rename(source, target)

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        registry.register(load_study(path), path.read_text(), "team-z")
    [run] = MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_experiment_by_name("team").experiment_id],
        filter_string="tags.launch_id = 'team-z' and tags.kind = 'launch'",
    )
    assert run.info.status == "KILLED" and run.data.tags["launch_status"] == "never registered"
    assert not driver(tmp_path / "runs/team-z")[0] and not (tmp_path / "runs/team-z/launch.json").exists()
    monkeypatch.setattr(os, "replace", rename)
    assert [p.name for p in (tmp_path / "runs/team-z").iterdir() if p.name.endswith(".tmp")] == []
    state, lock = registry.register(load_study(path), path.read_text(), "team-z")
    assert (
        state.parent_run_id == run.info.run_id
        and MlflowClient(uri).get_run(run.info.run_id).info.status == "RUNNING"
    )
    lock.close()


def test_a_driver_killed_before_launch_json_leaves_no_running_mlflow_run_once_the_experiment_launches_again(
    tmp_path,
):
    """SIGKILL between the parent run's creation and launch.json's write: no failed save ends the
    run, and its folder holds no launch.json for `status` or `resume` to find. The next launch of
    the experiment from this machine ends it, unless a driver holds the folder's lock (one that is
    registering it now)."""
    import signal
    import subprocess
    import sys

    from orchestrator.plan.load import load_study
    from orchestrator.run import registry

    uri = f"sqlite:///{tmp_path}/runs/mlflow.db"
    path = tmp_path / "space.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "team",
                "seeds": [0],
                "tasks": ["copy"],
                "models": ["lstm_seq2seq"],
                "metric": "best_ood_valid_seq_acc",
                "tracking": {"uri": uri},
                "storage_path": str(tmp_path / "runs"),
            }
        )
    )
    killed_as_it_saves = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from orchestrator.plan.load import load_study\n"
        "from orchestrator.record.state import LaunchState\n"
        "from orchestrator.run import registry\n"
        "LaunchState.save = lambda self: os.kill(os.getpid(), signal.SIGKILL)\n"
        "path = Path(sys.argv[1])\n"
        "registry.register(load_study(path), path.read_text())\n"
    )
    killed = subprocess.run(
        [sys.executable, "-c", killed_as_it_saves, str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    mlflow = MlflowClient(uri)
    [orphan] = mlflow.search_runs(
        [mlflow.get_experiment_by_name("team").experiment_id], filter_string="tags.kind = 'launch'"
    )
    folder = tmp_path / "runs" / orphan.data.tags["launch_id"]
    assert orphan.info.status == "RUNNING" and folder.is_dir() and not (folder / "launch.json").exists()

    registering = registry.hold_driver_lock(folder)
    _, lock = registry.register(load_study(path), path.read_text(), "team-a")
    lock.close()
    assert mlflow.get_run(orphan.info.run_id).info.status == "RUNNING"
    registering.close()
    state, lock = registry.register(load_study(path), path.read_text(), "team-b")
    lock.close()
    ended = mlflow.get_run(orphan.info.run_id)
    assert ended.info.status == "KILLED" and ended.data.tags["launch_status"] == "never registered"
    # Launches with a launch.json are theirs to end (status says "driver gone"; resume continues them).
    assert [
        mlflow.get_run(LaunchState.load(tmp_path / "runs" / id).parent_run_id).info.status
        for id in ("team-a", "team-b")
    ] == ["RUNNING"] * 2


def test_a_launch_whose_search_space_cannot_be_stored_leaves_no_running_mlflow_run(tmp_path):
    """The parent run is made, then the launch's file is stored beside it: an artifact store that
    refuses the file (here a plain file where its folder goes; a full disk, a bucket without write
    access) left a run RUNNING for good, and the retry found it and went on without the file."""
    from mlflow.entities import ViewType

    uri = f"sqlite:///{tmp_path}/runs/mlflow.db"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs/mlartifacts").write_text("not a folder")
    with pytest.raises(OSError):
        open_launch(TrackedLaunch(uri, "exp", "launch-1"), "space.yaml", "name: exp\n", tmp_path / "runs")
    mlflow = MlflowClient(uri)
    exp_id = mlflow.get_experiment_by_name("exp").experiment_id
    assert mlflow.search_runs([exp_id]) == []
    [failed] = mlflow.search_runs([exp_id], run_view_type=ViewType.DELETED_ONLY)
    (tmp_path / "runs/mlartifacts").unlink()
    parent = open_launch(
        TrackedLaunch(uri, "exp", "launch-1"), "space.yaml", "name: exp\n", tmp_path / "runs"
    )
    assert parent != failed.info.run_id and mlflow.get_run(parent).info.status == "RUNNING"
    assert [a.path for a in mlflow.list_artifacts(parent)] == ["search_space.yaml"]


def test_a_full_disk_is_not_retried_and_a_retry_window_is_the_environments(monkeypatch, tmp_path):
    """A store whose disk is full (SQLite's own FULL, an ENOSPC) stops at once as DiskFull, which the
    driver reports as a resumable stop (exit 4); SYSGEN_STORE_RETRY_S sets the window of the others."""
    import errno
    import sqlite3

    import sqlalchemy
    import sqlalchemy.exc

    database = tmp_path / "tiny.db"
    with sqlite3.connect(database) as conn:
        conn.execute("PRAGMA max_page_count = 2")  # a disk holding two pages: SQLite says it is full
        conn.execute("CREATE TABLE t (x BLOB)")
    engine = sqlalchemy.create_engine(f"sqlite:///{database}")
    calls = []

    def insert():
        calls.append(1)
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("PRAGMA max_page_count = 2"))
            conn.execute(sqlalchemy.text("INSERT INTO t VALUES (zeroblob(100000))"))

    with pytest.raises(
        retries.DiskFull, match=r"^tracking store x: its disk is full \(database or disk is full\)"
    ):
        retried(insert, "tracking store x")()
    assert len(calls) == 1
    assert retries.disk_full(sqlalchemy.exc.OperationalError("", {}, OSError(errno.ENOSPC, "No space")))
    assert not retries.disk_full(sqlalchemy.exc.OperationalError("", {}, OSError(errno.ECONNRESET, "reset")))
    monkeypatch.setenv("SYSGEN_STORE_RETRY_S", "5")
    assert retries.retry_delays() == (0.5, 1, 2, 1.5)
    monkeypatch.setenv("SYSGEN_STORE_RETRY_S", "0")
    assert retries.retry_delays() == ()
    monkeypatch.setenv("SYSGEN_STORE_RETRY_S", "-1")
    with pytest.raises(ValueError, match="expected a number of seconds, 0 or more"):
        retries.retry_delays()
