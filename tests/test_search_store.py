"""The search store's cache of finished trials (orchestrator.record.optuna_store.RetryingStorage):
right when several drivers and a resume share a study, and reading a few trials per suggestion, not
the whole study (docs/design/architecture.md#the-search-store)."""

from __future__ import annotations

import optuna
from optuna.distributions import FloatDistribution
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from orchestrator.record.optuna_store import READ_ONE_BY_ONE, RetryingStorage

SPACE = {"x": FloatDistribution(0, 1), "lr": FloatDistribution(1e-5, 1e-2, log=True)}


def seen(storage, study_id: int) -> list[tuple]:
    return [
        (t.number, t.state, t.params, t.values, t.user_attrs, t.intermediate_values)
        for t in storage.get_all_trials(study_id)
    ]


def sampler() -> optuna.samplers.TPESampler:
    return optuna.samplers.TPESampler(seed=0, n_startup_trials=4)


def test_two_drivers_and_a_resume_see_every_trial_as_the_database_holds_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    plain = RDBStorage(url)
    one, two = RetryingStorage(url), RetryingStorage(url)
    first = optuna.create_study(storage=one, study_name="s", sampler=sampler())
    second = optuna.load_study(storage=two, study_name="s", sampler=sampler())
    study_id = plain.get_study_id_from_name("s")
    running = []
    for step in range(12):
        for study in (first, second):
            trial = study.ask(SPACE)
            trial.report(trial.params["x"], 1)
            trial.set_user_attr("step", step)
            running.append((study, trial))
        if step % 3:  # some stay running a while, finishing after newer trials
            study, trial = running.pop(0)
            state = [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL][step % 4 % 3]
            study.tell(trial, trial.params["x"] if state == TrialState.COMPLETE else None, state=state)
        truth = seen(plain, study_id)
        assert seen(one, study_id) == truth
        assert seen(two, study_id) == truth
    resumed = RetryingStorage(url)
    assert seen(resumed, study_id) == seen(plain, study_id)
    assert [t.number for t in resumed.get_all_trials(study_id, states=(TrialState.RUNNING,))] == [
        t.number for study, t in running
    ]


def reads_of_five_suggestions(url: str, stored: int, monkeypatch) -> dict[str, int]:
    """How often five asks and tells read the whole study, its unfinished trials (one query) and one
    trial, after `stored` trials and with 3 trials that other workers still train."""
    storage = RetryingStorage(url)
    study = optuna.create_study(storage=storage, study_name=f"s{stored}", sampler=sampler())
    for _ in range(stored):
        trial = study.ask(SPACE)
        study.tell(trial, trial.params["x"])
    for _ in range(3):
        study.ask(SPACE)
    reads = {"whole study": 0, "unfinished trials": 0, "one trial": 0}
    all_trials, one_trial = storage.rdb.get_all_trials, storage.rdb.get_trial

    def some_trials(*args, **kwargs):
        reads["whole study" if kwargs.get("states") is None else "unfinished trials"] += 1
        return all_trials(*args, **kwargs)

    def a_trial(*args, **kwargs):
        reads["one trial"] += 1
        return one_trial(*args, **kwargs)

    monkeypatch.setattr(storage.rdb, "get_all_trials", some_trials)
    monkeypatch.setattr(storage.rdb, "get_trial", a_trial)
    for _ in range(5):
        trial = study.ask(SPACE)
        study.tell(trial, trial.params["x"])
    return reads


def test_a_suggestion_reads_the_same_few_trials_in_a_small_study_and_a_large_one(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    small, large = (reads_of_five_suggestions(url, stored, monkeypatch) for stored in (10, 100))
    assert small == large
    assert small["whole study"] == 0


def test_more_trials_to_read_than_one_by_one_pays_are_read_in_one_query(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    storage, other = RetryingStorage(url), RetryingStorage(url)
    optuna.create_study(storage=storage, study_name="s")
    study_id = RDBStorage(url).get_study_id_from_name("s")
    storage.get_all_trials(study_id)
    elsewhere = optuna.load_study(storage=other, study_name="s")
    for _ in range(READ_ONE_BY_ONE + 5):  # another driver's trials, all new to `storage`
        trial = elsewhere.ask(SPACE)
        elsewhere.tell(trial, 0.5)
    whole = storage.rdb.get_all_trials
    reads = []
    monkeypatch.setattr(storage.rdb, "get_all_trials", lambda *a, **k: reads.append(a) or whole(*a, **k))
    assert len(storage.get_all_trials(study_id)) == READ_ONE_BY_ONE + 5
    assert len(reads) == 1
