"""The pieces that put every pair of a launch in one Tune experiment, and the checkpoint fallback,
without Ray running (the whole path runs in test_service.py and test_cluster.py)."""

import math
import pickle
from types import SimpleNamespace

import pyarrow.fs
import pytest
from ray.train._internal.session import _TrainingResult
from ray.tune import Checkpoint
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher

from orchestrator.plan.load import load_study
from orchestrator.plan.source import SpecError
from orchestrator.run.search import PAIR_KEY, CellSearch, PairScheduler, PairSearch
from orchestrator.run.trial import newest_existing_checkpoint


class Counting(Searcher):
    """A stand-in for a pair's TPE searcher: suggests {"k": n} and remembers what it was told."""

    def __init__(self):
        super().__init__(metric="m", mode="max")
        self.n, self.completed = 0, []

    def suggest(self, trial_id):
        self.n += 1
        return {"k": self.n}

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed.append(trial_id)


def test_pairs_take_turns_within_their_own_limits_and_budgets():
    a, b = Counting(), Counting()
    search = PairSearch({"a": a, "b": b}, {"a": 3, "b": 1}, max_concurrent=2, metric="m", mode="max")
    got = [search.suggest(f"t{k}") for k in range(4)]
    assert [g[PAIR_KEY] for g in got[:3]] == ["a", "b", "a"]
    assert got[3] is None  # a has 2 live (its limit), b has used its budget of 1: wait
    search.on_trial_complete("t0")
    assert a.completed == ["t0"] and b.completed == []
    assert search.suggest("t4") == {"k": 3, PAIR_KEY: "a"}  # a's third and last
    assert search.suggest("t5") == Searcher.FINISHED


def test_pair_search_state_survives_a_save_and_restore(tmp_path):
    def fresh():
        return PairSearch(
            {"a": Counting(), "b": Counting()}, {"a": 2, "b": 2}, max_concurrent=1, metric="m", mode="max"
        )

    search = fresh()
    search.suggest("t0"), search.suggest("t1")
    search.save(str(tmp_path / "s.pkl"))
    restored = fresh()
    restored.restore(str(tmp_path / "s.pkl"))
    assert restored.live == {"t0": "a", "t1": "b"} and restored.started == {"a": 1, "b": 1}
    restored.on_trial_complete("t1")
    assert restored.suggest("t2") == {"k": 2, PAIR_KEY: "b"}  # b's searcher went on from its own state


def test_cell_search_gives_each_cell_once():
    cells = [{"n_layers": 1, "seed": 0}, {"n_layers": 1, "seed": 1}]
    search = CellSearch(cells, "m", "max")
    assert [search.suggest(t) for t in "abc"] == [*cells, Searcher.FINISHED]


def test_each_pair_has_its_own_scheduler():
    calls = []

    class Recording(TrialScheduler):
        def __init__(self, name):
            self.name = name

        def on_trial_result(self, controller, trial, result):
            calls.append((self.name, trial.trial_id))
            return TrialScheduler.STOP if self.name == "b" else TrialScheduler.CONTINUE

    scheduler = PairScheduler({"a": Recording("a"), "b": Recording("b")})
    trial = SimpleNamespace(trial_id="x", config={PAIR_KEY: "b"})
    assert scheduler.on_trial_result(None, trial, {}) == TrialScheduler.STOP and calls == [("b", "x")]


def test_a_pruned_checkpoint_falls_back_to_the_newest_that_exists(tmp_path):
    fs = pyarrow.fs.LocalFileSystem()
    for name in ("checkpoint_000003", "checkpoint_000004"):
        (tmp_path / name).mkdir()
    named = _TrainingResult(
        checkpoint=Checkpoint(str(tmp_path / "checkpoint_000002"), filesystem=fs),
        metrics={"training_iteration": 3},
    )
    found = newest_existing_checkpoint(named)
    assert found.checkpoint.path == str(tmp_path / "checkpoint_000004") and found.metrics == named.metrics
    present = _TrainingResult(
        checkpoint=Checkpoint(str(tmp_path / "checkpoint_000003"), filesystem=fs), metrics={}
    )
    assert newest_existing_checkpoint(present) is present
    for name in ("checkpoint_000003", "checkpoint_000004"):
        (tmp_path / name).rmdir()
    assert newest_existing_checkpoint(named) is None  # nothing left: the trial starts over


SPACE = "tasks: [ctl]\nmodels: [ndr]\nspace: {lr: {loguniform: [1.0e-4, 1.0e-3]}}\n"


@pytest.mark.parametrize(
    "extra, key",
    [
        ("storage_path: s3://bucket/runs\n", "storage_path"),
        ("storage: ftp://host/x\n", "storage"),
        ("storage: s3://KEY:hunter2@bucket/x\n", "storage"),
        ("storage: {uri: /mnt/x, endpoint: http://minio:9000}\n", "storage"),
        ("storage: {uri: s3://bucket/x, endpoint: minio:9000}\n", "storage"),
        ("storage: {uri: s3://bucket/x, region: eu}\n", "storage.region"),
        ("budget: {max_failures: -1}\n", "budget.max_failures"),
        ("budget: {cluster_concurrent: 0}\n", "budget.cluster_concurrent"),
    ],
)
def test_bad_storage_and_fault_settings_are_one_line_errors(tmp_path, extra, key):
    path = tmp_path / "space.yaml"
    path.write_text(SPACE + extra)
    with pytest.raises(SpecError) as error:
        load_study(path)
    assert str(error.value).startswith(f"{path}: {key}: ")
    assert "hunter2" not in str(error.value)


def test_storage_defaults_to_the_launch_folders_and_accepts_an_object_store(tmp_path, monkeypatch):
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    assert load_study(path).storage.uri == "runs"
    path.write_text(SPACE + "storage: {uri: s3://bucket/sweeps, endpoint: http://127.0.0.1:9000}\n")
    storage = load_study(path).storage
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "PlantedKeyId")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "PlantedSecretValue")
    fs, root = storage.filesystem()
    assert root == "bucket/sweeps" and fs.type_name == "s3"
    pickled = pickle.dumps(fs)  # what Tune ships to the nodes: keys are resolved on each node, never pickled
    assert b"PlantedKeyId" not in pickled and b"PlantedSecretValue" not in pickled


def test_a_proposal_a_killed_driver_left_is_adopted_not_duplicated(tmp_path):
    """Optuna stored a proposal that Tune's snapshot never saw (the driver died in between): the
    resumed searcher's next trial takes it over, and the study ends with one trial per Tune trial."""
    import optuna

    from orchestrator.run.search import TruncationAwareOptunaSearch

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    space = {"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}

    def searcher():
        return TruncationAwareOptunaSearch(
            space=space,
            storage=storage,
            study_name="s",
            metric="acc",
            mode="max",
            sampler=optuna.samplers.TPESampler(seed=0),
        )

    dead = searcher()
    orphan = dead.suggest("a")  # asked, then the driver died before Tune's snapshot
    resumed = searcher()
    assert resumed.suggest("b") == orphan
    resumed.on_trial_complete("b", {"acc": 0.5, "status": "completed"})
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] and trials[0].params == orphan


def test_a_driver_reads_what_killed_drivers_left_in_its_study_once(tmp_path, monkeypatch):
    """Proposals no trial took and trials told of their end come only from drivers before this
    one (the launch's driver lock keeps others out): one read of the study, however many trials."""
    import optuna

    from orchestrator.run.search import TruncationAwareOptunaSearch

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    searcher = TruncationAwareOptunaSearch(
        space={"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)},
        storage=storage,
        study_name="s",
        metric="acc",
        mode="max",
        sampler=optuna.samplers.TPESampler(seed=0),
    )
    reads = []
    monkeypatch.setattr(optuna.Study, "get_trials", lambda study, *a, **k: reads.append(1) or [])
    for k in range(5):
        searcher.suggest(f"t{k}")
        searcher.on_trial_complete(f"t{k}", {"acc": 0.5, "status": "completed"})
    assert len(reads) == 1
    monkeypatch.undo()
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 5


def test_a_searcher_an_earlier_version_pickled_ends_its_trials(tmp_path):
    """Tune unpickles the searcher of a launch begun by an earlier version (tuner.pkl) without
    calling __init__: attributes added since must not fail its resume."""
    import optuna

    from orchestrator.run.search import TruncationAwareOptunaSearch

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    searcher = TruncationAwareOptunaSearch(
        space={"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)},
        storage=storage,
        study_name="s",
        metric="acc",
        mode="max",
    )
    searcher.suggest("t0")
    older = object.__new__(TruncationAwareOptunaSearch)
    older.__dict__.update({k: v for k, v in searcher.__dict__.items() if k not in ("found", "told")})
    older.on_trial_complete("t0", {"acc": 0.5, "status": "completed"})
    assert [t.state.name for t in optuna.load_study(study_name="s", storage=storage).trials] == ["COMPLETE"]


def stacked_searcher(storage, stack: int, runs: int, space=None, base=None):
    import optuna

    from orchestrator.run.search import TruncationAwareOptunaSearch

    space = space or {
        "lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
        "n_layers": optuna.distributions.IntDistribution(2, 8),
    }
    return TruncationAwareOptunaSearch(
        space=space,
        storage=storage,
        study_name="s",
        metric="acc",
        mode="max",
        sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=2),
        stack=stack,
        runs=runs,
        base=base or {"model": "ndr"},
    )


def test_a_stacked_search_asks_tpe_once_per_member_and_tells_each_member_its_own_end(tmp_path):
    """budget.stack_size 3 over 7 runs: Tune trials of 3, 2 and 2 members (no member left to train
    alone, uncompiled where the stacks are compiled), then the search is done.
    A stack's members share every value but those a member may have of its own (here the layer
    count, from the stack's first suggestion), and each is an Optuna trial told its own score."""
    import optuna

    from orchestrator.record.runs import member_key
    from orchestrator.run.search import MEMBERS_KEY

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    search = stacked_searcher(storage, stack=3, runs=7)
    configs = [search.suggest(t) for t in "abc"]
    assert [len(c[MEMBERS_KEY]) for c in configs] == [3, 2, 2]
    assert search.suggest("d") == Searcher.FINISHED
    for config in configs:
        assert set(config) == {"n_layers", MEMBERS_KEY} and all(set(m) == {"lr"} for m in config[MEMBERS_KEY])
        assert len({m["lr"] for m in config[MEMBERS_KEY]}) == len(
            config[MEMBERS_KEY]
        )  # TPE's own proposals, not one copied
    study = optuna.load_study(study_name="s", storage=storage)
    trials = study.get_trials()
    assert len(trials) == 7
    stacked = [
        {**{k: v for k, v in configs[0].items() if k != MEMBERS_KEY}, **m} for m in configs[0][MEMBERS_KEY]
    ]
    assert [t.params for t in trials[:3]] == stacked

    # Trial a: member 0 completes, member 1 diverged at iteration 40 (and keeps reporting its last
    # metrics while the others train on), member 2 completes. Trial b: ASHA stops it.
    def result_at(iteration, status):
        members = [(0.9, status, iteration), (0.2, "diverged", 40), (0.5, status, iteration)]
        return {
            "iteration": iteration,
            "training_iteration": 1,
            "acc": 0.9,
            "status": status,
            **{
                member_key(k, key): v
                for k, m in enumerate(members)
                for key, v in zip(("acc", "status", "iteration"), m)
            },
        }

    search.on_trial_result("a", result_at(60, "running"))
    result = result_at(100, "completed")
    search.on_trial_result("a", result)
    search.on_trial_complete("a", result)
    stopped = {
        "iteration": 50,
        "training_iteration": 1,
        "acc": 0.4,
        "status": "running",
        **{member_key(k, key): v for k in range(2) for key, v in (("acc", 0.1 * k), ("status", "running"))},
    }
    search.on_trial_complete("b", stopped)
    search.on_trial_complete(
        "c",
        {
            "iteration": 100,
            "training_iteration": 1,
            "acc": 0.7,
            "status": "completed",
            **{
                member_key(k, key): v
                for k in range(2)
                for key, v in (("acc", 0.7 - 0.1 * k), ("status", "completed"))
            },
        },
    )
    trials = study.get_trials()
    assert [t.state.name for t in trials] == [
        "COMPLETE",
        "PRUNED",
        "COMPLETE",
        "PRUNED",
        "PRUNED",
        "COMPLETE",
        "COMPLETE",
    ]
    assert [t.value for t in trials if t.state.name == "COMPLETE"] == [0.9, 0.5, 0.7, 0.6]
    assert trials[1].intermediate_values == {
        40: 0.2
    }  # where it diverged, as its own trial would have stopped
    assert [t.intermediate_values for t in trials[3:5]] == [
        {50: 0.0},
        {50: 0.1},
    ]  # each its own, at the iteration


def test_a_stack_a_killed_driver_proposed_is_adopted_whole(tmp_path):
    """The driver died after asking TPE for a stack and before Tune's snapshot: the resumed
    searcher's next trial takes those proposals over, members and all, and asks for no more."""
    import optuna

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    lost = stacked_searcher(storage, stack=3, runs=6).suggest("a")
    resumed = stacked_searcher(storage, stack=3, runs=6)
    assert resumed.suggest("b") == lost
    assert len(optuna.load_study(study_name="s", storage=storage).get_trials()) == 3


def test_a_resumed_search_proposes_no_trial_it_tried_already(tmp_path):
    """A resume restores the searcher's snapshot, the sampler's random state with it: the trial a
    killed driver proposed after the snapshot is adopted, and the next proposal must not draw it
    again. Nor may a new searcher on the killed driver's study (no snapshot yet) enqueue the warm
    start twice or replay that driver's draws."""
    import optuna

    from orchestrator.run.search import PairSearch, TruncationAwareOptunaSearch

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    space = {
        "lr": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True),
        "d_model": optuna.distributions.CategoricalDistribution([64, 128, 256]),
    }

    def searcher(name, warm_start=None):
        pair = TruncationAwareOptunaSearch(
            space=space,
            storage=storage,
            study_name=name,
            metric="acc",
            mode="max",
            points_to_evaluate=warm_start,
            sampler=optuna.samplers.TPESampler(seed=0),
            stack=2,
            runs=8,
            base={"model": "transformer"},
        )
        return PairSearch({"p": pair}, {"p": 4}, 4, "acc", "max")

    def lrs(name):
        return [t.params["lr"] for t in optuna.load_study(study_name=name, storage=storage).trials]

    killed = searcher("snapshot")
    killed.suggest("t1")
    killed.save(tmp_path / "searcher.pkl")  # Tune's snapshot
    lost = killed.suggest("t2")
    resumed = searcher("snapshot")
    resumed.restore(tmp_path / "searcher.pkl")
    assert resumed.suggest("u2") == lost
    resumed.suggest("u3")
    assert len(lrs("snapshot")) == 6 and len(set(lrs("snapshot"))) == 6

    warm = [{"lr": 1e-4, "d_model": 128}]
    lost = searcher("no_snapshot", warm).suggest("t1")
    again = searcher("no_snapshot", warm)
    assert again.suggest("u1") == lost
    again.suggest("u2")
    assert (
        len(lrs("no_snapshot")) == 4
        and len(set(lrs("no_snapshot"))) == 4
        and lrs("no_snapshot").count(1e-4) == 1
    )


@pytest.mark.parametrize("stack", [1, 2])
def test_a_trial_that_failed_for_good_and_runs_again_after_a_resume_is_told_to_optuna(tmp_path, stack):
    """`orchestrator resume` runs a failed trial again (Tune's resume_errored) without asking the
    searcher: its Optuna trials stay FAIL, and each run gets a new one with its values and its
    evaluations so far, told how the run ends this time."""
    import optuna

    from orchestrator.record.runs import member_key
    from orchestrator.run.search import PairSearch

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")

    def search():
        return PairSearch(
            {"p": stacked_searcher(storage, stack=stack, runs=stack)}, {"p": 1}, 1, "acc", "max"
        )

    def result(iteration, acc, status):
        own = {"iteration": iteration, "acc": acc, "status": status}
        return {
            "training_iteration": 1,
            **({member_key(k, key): v for k in range(stack) for key, v in own.items()} if stack > 1 else own),
        }

    first = search()
    first.suggest("a")
    first.on_trial_result("a", result(50, 0.4, "running"))
    first.on_trial_complete("a", error=True)  # its retries spent
    first.save(tmp_path / "searcher.pkl")
    resumed = search()
    resumed.restore(tmp_path / "searcher.pkl")
    resumed.on_trial_result("a", result(100, 0.8, "running"))  # from its last checkpoint
    resumed.on_trial_complete("a", result(150, 0.9, "completed"))
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.state.name for t in trials] == ["FAIL"] * stack + ["COMPLETE"] * stack
    assert [t.params for t in trials[stack:]] == [t.params for t in trials[:stack]]
    assert [(t.value, t.intermediate_values) for t in trials[stack:]] == [
        (0.9, {50: 0.4, 100: 0.8, 150: 0.9})
    ] * stack
    assert resumed.suggest("b") == Searcher.FINISHED and not resumed.live


def test_a_member_that_diverged_before_its_first_evaluation_has_no_score_of_its_stack(tmp_path):
    """The stack's own score (its best member's, for ASHA) is no member's: a member whose loss
    went NaN before it was evaluated (its best NaN: trainables.evaluation.Selection) reports no value to
    Optuna and logs none to MLflow; nor does a lone trial that did so."""
    import optuna

    from orchestrator.record.runs import member_key, member_result, numeric_metrics

    members = [
        {"status": "running", "iteration": 100, "acc": 0.9, "best_acc": 0.9},
        {"status": "diverged", "iteration": 20, "best_acc": math.nan},
    ]
    result = {
        "iteration": 100,
        "training_iteration": 1,
        "acc": 0.9,
        "status": "running",
        "node_id": "n1",
        **{member_key(k, key): v for k, m in enumerate(members) for key, v in m.items()},
    }
    assert member_result(result, 0)["acc"] == 0.9
    own = member_result(result, 1)
    assert own["status"] == "diverged" and own["node_id"] == "n1" and "acc" not in own
    assert numeric_metrics(own) == {}
    assert numeric_metrics({**own, "gpu_memory_mib": 812.5}) == {
        "gpu_memory_mib": 812.5
    }  # a CUDA trial's peak
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    search = stacked_searcher(storage, stack=2, runs=2)
    search.suggest("a")
    search.on_trial_result("a", result)
    search.on_trial_complete("a", {**result, "status": "completed", member_key(0, "status"): "completed"})
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [(t.state.name, t.intermediate_values) for t in trials] == [
        ("COMPLETE", {100: 0.9}),
        ("PRUNED", {}),
    ]
    alone = stacked_searcher(storage, stack=1, runs=1)
    alone.suggest("b")
    diverged = {"iteration": 20, "training_iteration": 1, "acc": math.nan, "status": "diverged"}
    alone.on_trial_result("b", diverged)
    alone.on_trial_complete("b", diverged)
    last = optuna.load_study(study_name="s", storage=storage).trials[-1]
    assert (last.state.name, last.intermediate_values) == ("PRUNED", {})


def test_a_waiting_proposal_a_killed_driver_enqueued_is_no_member_of_another_shape(tmp_path):
    """A killed driver left enqueued proposals (Optuna hands them out first): the next stack's
    first member takes one, one of another layer count is failed rather than stacked, and the
    stack's members all share the first member's layer count."""
    import optuna

    from orchestrator.run.search import MEMBERS_KEY

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    search = stacked_searcher(storage, stack=3, runs=3)
    study = optuna.load_study(study_name="s", storage=storage)
    for n_layers in (7, 3):
        study.enqueue_trial({"n_layers": n_layers}, skip_if_exists=False)
    config = search.suggest("a")
    assert config["n_layers"] == 7 and len(config[MEMBERS_KEY]) == 3
    states = [(t.state.name, t.params["n_layers"]) for t in study.get_trials()]
    assert sorted(states) == [("FAIL", 3), ("RUNNING", 7), ("RUNNING", 7), ("RUNNING", 7)]


def test_a_suggestion_whose_model_cannot_stack_trains_alone(tmp_path):
    """ACT's halting loop cannot be vmapped: a stack whose first suggestion turns it on is a stack of one."""
    import optuna

    from orchestrator.run.search import MEMBERS_KEY

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    space = {
        "lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
        "act": optuna.distributions.CategoricalDistribution(["none", "act"]),
    }
    search = stacked_searcher(storage, stack=4, runs=12, space=space)
    configs = [search.suggest(str(k)) for k in range(12)]
    configs = [c for c in configs if c != Searcher.FINISHED]
    assert all(MEMBERS_KEY not in c for c in configs if c.get("act") == "act")
    assert all(c["act"] == "none" for c in configs if MEMBERS_KEY in c)
    assert sum(len(c.get(MEMBERS_KEY, [None])) for c in configs) == 12


def test_an_upload_that_lost_a_renamed_temporary_file_stays_off_the_console():
    """Tune's race between writing a snapshot and uploading the previous one (seen in CI): its
    FileNotFoundError on a '-tmp-' staging file is dropped; any other failed upload is shown."""
    import logging
    import sys

    from orchestrator.run.ray_start import superseded_sync

    def record(error):
        try:
            raise error
        except Exception:
            return logging.LogRecord(
                "ray.tune.execution.experiment_state",
                logging.ERROR,
                __file__,
                1,
                "Saving experiment state to storage at '/x/tune' failed with exception: ",
                None,
                sys.exc_info(),
            )

    lost = FileNotFoundError(
        "Failed to open local file "
        "'/tmp/ray/artifacts/tune/driver_artifacts/.1d57-tmp-searcher-state-2026.pkl'"
    )
    assert not superseded_sync(record(lost))
    assert superseded_sync(
        record(FileNotFoundError("Failed to open local file '/x/experiment_state-2026.json'"))
    )
    assert superseded_sync(record(PermissionError("denied: /x/.1d57-tmp-searcher-state.pkl")))


def test_an_optuna_trial_whose_end_was_never_told_is_settled_from_its_mlflow_run(tmp_path):
    """A store outage outlasted a tell, or the driver died before it: at the search's end Optuna
    still has the trial RUNNING. Its MLflow run (named in the trial's user attributes, a stack's
    member by its index) says how it ended; a proposal no trial took fails."""
    import optuna

    from orchestrator.record.runs import STATUS_TAG
    from orchestrator.run.search import RUN_ATTR
    from orchestrator.run.tuner import settle_proposals

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    search = stacked_searcher(storage, stack=2, runs=5)
    for trial_id in ("a", "b", "c"):
        search.suggest(trial_id)
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.user_attrs[RUN_ATTR] for t in study.trials] == ["a/0", "a/1", "b/0", "b/1", "c"]

    def run(trial_id, status, acc, member=None):
        tags = {
            "trial_id": trial_id,
            STATUS_TAG: status,
            **({"member": str(member)} if member is not None else {}),
        }
        return SimpleNamespace(data=SimpleNamespace(tags=tags, metrics={"acc": acc}))

    runs = [
        run("a", "completed", 0.7, 0),
        run("a", "diverged", 0.3, 1),
        run("b", "completed", 0.8, 0),
        run("b", "early_stopped", 0.4, 1),
    ]
    settle_proposals(storage, "s", runs, "acc")  # "c" has no run: a proposal no trial took
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [(t.state.name, t.value) for t in trials] == [
        ("COMPLETE", 0.7),
        ("PRUNED", None),
        ("COMPLETE", 0.8),
        ("PRUNED", None),
        ("FAIL", None),
    ]


def test_a_stack_optuna_was_told_the_end_of_reports_it_again_after_a_resume_without_failing(tmp_path):
    """The driver told Optuna a stack's end and was killed before Tune's snapshot recorded it: the
    resumed trial, restored at its final checkpoint, reports that evaluation again. That raised
    UpdateFinishedTrialError, and Tune failed a finished trial (for good with max_failures: 0)."""
    import optuna
    from optuna.trial import TrialState

    from orchestrator.record.runs import member_key

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")

    def search():
        return PairSearch({"p": stacked_searcher(storage, stack=2, runs=4)}, {"p": 4}, 1, "acc", "max")

    def result(iteration, status):
        own = {"iteration": iteration, "acc": iteration / 100, "status": status}
        return {
            "training_iteration": 1,
            **own,
            **{member_key(k, key): v for k in range(2) for key, v in own.items()},
        }

    first = search()
    first.suggest("a")
    first.on_trial_result("a", result(50, "running"))
    first.save(tmp_path / "searcher.pkl")
    first.on_trial_complete("a", result(60, "completed"))
    resumed = search()
    resumed.restore(tmp_path / "searcher.pkl")
    resumed.on_trial_result("a", result(60, "completed"))
    resumed.on_trial_complete("a", result(60, "completed"))
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [(t.state, t.value) for t in trials] == [(TrialState.COMPLETE, 0.6)] * 2
