"""A launch's phases as Tune runs them: the searchers (Optuna TPE per pair, or a list of cells),
the schedulers (ASHA per pair), the trainable with its resources, where each phase's experiment
lives and which callbacks watch it. A phase is SEARCH (the search, or an ablation's cells over
seeds) or CONFIRM (a search's best trials again over new seeds), each its own Tune experiment in
the launch's storage.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

import optuna
import pyarrow.fs
import ray
from ray import tune
from ray.tune import PlacementGroupFactory
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.trainable.function_trainable import wrap_function

from ..plan.study import Pair, Study
from ..record.optuna_store import search_storage
from ..record.runs import STATUS_TAG
from ..record.state import DamagedLaunch, LaunchState
from .callbacks import ProgressLines, TrialTracker
from .disk import DiskWatch, put_back_whole
from .failures import FailureLog
from .search import (
    CANDIDATE_KEY,
    PAIR_KEY,
    RUN_ATTR,
    CellSearch,
    PairScheduler,
    PairSearch,
    TruncationAwareOptunaSearch,
    run_key,
    trial_members,
)
from .stacking import Stacking, slots_in
from .trial import newest_existing_checkpoint, run_trial

SEARCH, CONFIRM = "tune", "confirm"  # a launch's phases, each its own Tune experiment in the launch's storage
MAX_PENDING = "TUNE_MAX_PENDING_TRIALS_PG"  # Tune reads it as its controller starts


def stack_of(study: Study, phase: str) -> str:
    """What a stacked trial's `metric` is of its members' (run_trial): a search's best, else the mean."""
    return "best" if phase == SEARCH and not study.is_ablation else "mean"


def make_trainable(study: Study, use_gpu: bool, phase: str, failures: FailureLog | None = None):
    bases = {pair.name: pair.base for pair in study.pairs}
    function_trainable = wrap_function(
        tune.with_parameters(
            run_trial,
            bases=bases,
            metric=study.metric,
            mode=study.mode,
            stack_of=stack_of(study, phase),
            failures=failures,
        ),
        name="trial",
    )

    class CheckpointFallbackTrial(function_trainable):
        def restore(self, checkpoint_path):
            logging.getLogger("ray.tune.trainable.trainable").setLevel(
                logging.WARNING
            )  # "Restored on <ip> ...": the driver says it
            found = (
                newest_existing_checkpoint(checkpoint_path)
                if hasattr(checkpoint_path, "checkpoint")
                else checkpoint_path
            )
            if found is not None:
                return super().restore(found)

    # Each trial asks for its pair's resources (per_model may give small models a share of a GPU).
    bundles = {pair.name: PlacementGroupFactory([pair.resources.asks(use_gpu)]) for pair in study.pairs}
    return tune.with_resources(CheckpointFallbackTrial, lambda config: bundles[config[PAIR_KEY]])


def make_searcher(study: Study, pair: Pair, storage, study_name: str, stack: int = 1):
    """The pair's TPE searcher; `stack`: the suggestions one trial trains (Stacking.search_stack)."""
    return TruncationAwareOptunaSearch(
        space={k: d.to_optuna() for k, d in pair.space.items()},
        storage=storage,
        study_name=study_name,
        metric=study.metric,
        mode=study.mode,
        points_to_evaluate=[pair.warm_start] if study.warm_start and pair.warm_start else None,
        sampler=optuna.samplers.TPESampler(seed=study.seed),
        stack=stack,
        runs=study.trial_count(pair),
        base=pair.base,
    )


def phase_cells(stacking: Stacking, state: LaunchState, phase: str) -> dict[str, list[dict]] | None:
    """Each pair's list of trials where the phase has one (an ablation's cells, a confirmation's
    candidates, over their seeds), None for a search (TPE proposes its trials)."""
    study = stacking.study
    if phase == CONFIRM:
        return {
            p.name: stacking.trials(
                p,
                [{**config, CANDIDATE_KEY: k} for k, config in enumerate(state.candidates.get(p.name, []))],
                study.confirm.seeds,
            )
            for p in study.pairs
        }
    if study.is_ablation:
        return {p.name: stacking.trials(p, study.grid_cells(p), study.seeds) for p in study.pairs}
    return None


def optuna_storage(state: LaunchState):
    return search_storage(state.tracking_uri, state.dir)


def optuna_study_name(state: LaunchState, pair: Pair) -> str:
    return state.optuna_study_name(pair.name)


def settle_proposals(storage, study_name: str, runs: list, metric: str) -> None:
    """Once the search has ended no trial runs, yet Optuna trials may stay RUNNING: a proposal a
    killed driver made after the searcher's last checkpoint, which no trial took (FAIL), or one
    whose end Optuna never heard (a store outage outlasted its tell, or the driver died before
    it): MLflow's run of it (`runs`, the pair's search runs; search.RUN_ATTR) says how it ended."""
    State = optuna.trial.TrialState
    ended = {run_key(run.data.tags.get("trial_id", ""), run.data.tags.get("member")): run for run in runs}
    study = optuna.load_study(study_name=study_name, storage=storage)
    for trial in study.get_trials(deepcopy=False, states=(State.RUNNING,)):
        run = ended.get(trial.user_attrs.get(RUN_ATTR))
        status, value = (run.data.tags.get(STATUS_TAG), run.data.metrics.get(metric)) if run else (None, None)
        if status == "completed" and value is not None:
            study.tell(trial.number, value)
        else:
            study.tell(
                trial.number, state=State.PRUNED if status in ("early_stopped", "diverged") else State.FAIL
            )


def cluster_slots(stacking: Stacking, use_gpu: bool, cells: dict[str, list[dict]] | None = None) -> int:
    """How many trials the cluster runs at once (stacking.slots_in) in a phase of `cells` (phase_cells)."""
    return slots_in(
        stacking, ray.cluster_resources(), use_gpu, cells and {name: len(c) for name, c in cells.items()}
    )


def phase_plan(stacking: Stacking, state: LaunchState, phase: str) -> tuple[dict, dict, dict]:
    """-> (searchers, schedulers, budgets) per pair of a phase: the search (TPE and ASHA), an
    ablation's cells x seeds, or the confirmation of a search's best trials over new seeds. A
    budget counts runs (a stacked trial's members each): the Tune trials are as many or fewer,
    and a pair's searcher says when it has proposed its last."""
    study, cells = stacking.study, phase_cells(stacking, state, phase)
    runs = phase_runs(study, cells)
    if cells is not None:
        # Every cell for every seed: no TPE, no early stopping (it would bias the table).
        return (
            {name: CellSearch(c, study.metric, study.mode) for name, c in cells.items()},
            {name: FIFOScheduler() for name in cells},
            runs,
        )
    storage = optuna_storage(state)
    return (
        {
            p.name: make_searcher(study, p, storage, optuna_study_name(state, p), stacking.search_stack(p))
            for p in study.pairs
        },
        {p.name: pair_scheduler(study, p) for p in study.pairs},
        runs,
    )


def phase_runs(study: Study, cells: dict[str, list[dict]] | None) -> dict[str, int]:
    """Each pair's runs in a phase of `cells` (phase_cells): a stacked trial's members count one each."""
    if cells is None:
        return {p.name: study.trial_count(p) for p in study.pairs}
    return {name: sum(len(trial_members(trial)) for trial in c) for name, c in cells.items()}


def build_tuner(stacking: Stacking, state: LaunchState, use_gpu: bool, slots: int, phase: str = SEARCH):
    study, (searchers, schedulers, budgets) = stacking.study, phase_plan(stacking, state, phase)
    search = PairSearch(searchers, budgets, study.budget.max_concurrent, study.metric, study.mode)
    return tune.Tuner(
        make_trainable(study, use_gpu, phase, failure_log(state, phase)),
        tune_config=tune.TuneConfig(
            metric=study.metric,
            mode=study.mode,
            search_alg=search,
            scheduler=PairScheduler(schedulers),
            num_samples=sum(budgets.values()),
            max_concurrent_trials=slots,
            trial_dirname_creator=trial_dirname,
            reuse_actors=True,  # a finished trial's process takes the next trial: no restart, no re-import
        ),
        run_config=run_config(study, state, phase, budgets),
    )


def phase_tuner(stacking: Stacking, state: LaunchState, use_gpu: bool, slots: int, phase: str):
    """The phase's Tuner: restored from its Tune experiment where one can be continued, else new."""
    fs, storage_path, name = experiment_location(state, phase)
    experiment = f"{storage_path}/{name}"
    if not has_snapshot(experiment, fs):
        return build_tuner(stacking, state, use_gpu, slots, phase)
    print(f"[launch] resuming from {state.trial_storage().join(state.launch_id, name)}", flush=True)
    return tune.Tuner.restore(
        experiment,
        trainable=make_trainable(stacking.study, use_gpu, phase, failure_log(state, phase)),
        resume_unfinished=True,
        resume_errored=True,
        storage_filesystem=fs,
    )


def trial_dirname(trial) -> str:
    return f"{trial.config[PAIR_KEY]}_{trial.trial_id}"


def pair_scheduler(study: Study, pair: Pair):
    if study.scheduler.name != "asha":
        return FIFOScheduler()
    n_iters = int(pair.base["n_iters"])
    return ASHAScheduler(
        time_attr="iteration",
        max_t=n_iters,
        grace_period=min(study.scheduler.grace_period, n_iters),
        reduction_factor=study.scheduler.reduction_factor,
    )


def experiment_location(state: LaunchState, phase: str = SEARCH) -> tuple:
    """(pyarrow filesystem or None, storage path, experiment name) of a phase's Tune experiment."""
    fs, root = state.trial_storage().filesystem()
    return fs, f"{root}/{state.launch_id}", phase


def failure_log(state: LaunchState, phase: str) -> FailureLog:
    """Where a phase's trials keep their last failure: in the launch's trial storage, beside its
    Tune experiment."""
    fs, storage_path, name = experiment_location(state, phase)
    return FailureLog(fs or pyarrow.fs.LocalFileSystem(), f"{storage_path}/failures/{name}")


def watched_places(state: LaunchState, fs, storage_path: str) -> dict[str, Path]:
    """The local folders a launch writes to, for DiskWatch: its trial storage (not an object
    store), its SQLite store's folder, its launch folder."""
    places = {} if fs else {"trial storage": Path(storage_path)}
    if state.tracking_uri.startswith("sqlite:///"):
        places["the tracking store's folder"] = Path(state.tracking_uri[len("sqlite:///") :]).parent
    return {**places, "the launch folder": state.dir}


def run_config(study: Study, state: LaunchState, phase: str, budgets: dict[str, int]):
    fs, storage_path, name = experiment_location(state, phase)
    tags = {
        p.name: {
            "model": p.model,
            "task": p.task.task,
            "variant": p.task.variant,
            "phase": "confirm" if phase == CONFIRM else "search",
        }
        for p in study.pairs
    }
    return tune.RunConfig(
        name=name,
        storage_path=storage_path,
        storage_filesystem=fs,
        callbacks=[
            DiskWatch(watched_places(state, fs, storage_path), None if fs else f"{storage_path}/{name}"),
            TrialTracker(
                state.tracking_uri,
                state.parent_run_id,
                state.launch_id,
                {p.name: p.base for p in study.pairs},
                tags,
            ),
            ProgressLines(
                study.metric,
                study.mode,
                budgets,
                {p.name: int(p.base.get("n_iters", 0)) for p in study.pairs},
                phase="confirmation" if phase == CONFIRM else "",
                stack_of=stack_of(study, phase),
            ),
        ],
        # Two a trial, not one: Tune rewrites its whole experiment snapshot (linear in the trials)
        # each time a trial has checkpointed num_to_keep times since the last one, so with one kept
        # every checkpoint forced a rewrite (docs/performance.md#orchestration-many-trials). Tune
        # deletes the oldest as it registers a new one; a resume that finds the named one gone falls
        # back to the newest that exists (newest_existing_checkpoint).
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        # A trial whose node dies (or whose process fails) starts again from its last checkpoint; one
        # that raised as on its try before ends instead (failures.FailureLog).
        failure_config=tune.FailureConfig(max_failures=study.budget.max_failures),
        verbose=0,  # callbacks.ProgressLines prints instead of Tune's tables
    )


@contextlib.contextmanager
def pending_limit(slots: int):
    """Tune's cap on pending placement groups for the phase's Tune run: its slots, or the user's own
    TUNE_MAX_PENDING_TRIALS_PG. Ray otherwise caps them independently of our concurrency limit
    (ray#63770). Put back after: a second launch in the same process (a notebook, the tests' in-process
    launches) would otherwise start only as many trials at once as the first's phase."""
    given = os.environ.get(MAX_PENDING)
    os.environ[MAX_PENDING] = given or str(slots)
    try:
        yield
    finally:
        if given is None:
            del os.environ[MAX_PENDING]


def has_snapshot(experiment: str, fs) -> bool:
    """Whether a phase's Tune experiment can be continued. Tune writes tuner.pkl (all that
    Tuner.can_restore looks for) as the run starts and its first snapshot, experiment_state-*.json,
    a moment later; restored from a driver killed in between, Tune "restarts" with a searcher that
    ends after one trial. Without a snapshot no trial has reported, so the phase starts afresh: the
    Optuna study adopts what the killed driver proposed (search.TruncationAwareOptunaSearch.suggest),
    and runs it started are marked lost (callbacks.TrialTracker.on_experiment_end). A file of a
    local snapshot that a full disk cut short is put back from its last whole copy
    (disk.put_back_whole); DamagedLaunch where the newest snapshot still does not parse."""
    if fs is None:
        for name in put_back_whole(Path(experiment)):
            print(
                f"[launch] {experiment}/{name} was cut short by a full disk: resuming from its whole copy",
                flush=True,
            )
    fs = fs or pyarrow.fs.LocalFileSystem()
    found = fs.get_file_info(pyarrow.fs.FileSelector(experiment, allow_not_found=True))
    snapshots = sorted(
        f.path for f in found if f.base_name.startswith("experiment_state-") and f.base_name.endswith(".json")
    )
    if snapshots:  # Tune reads the newest; one cut short it drops, restarting the phase
        try:
            with fs.open_input_stream(snapshots[-1]) as f:
                json.loads(f.read())
        except (ValueError, OSError) as e:
            raise DamagedLaunch(
                f"{snapshots[-1]}: Tune's snapshot of the launch is unreadable ({e}), as a write cut short "
                "by a full disk leaves it; the launch's MLflow runs and Optuna trials stand: launch its file "
                "again to run its plan afresh"
            ) from None
    return bool(snapshots)
