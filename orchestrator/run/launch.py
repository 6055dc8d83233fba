"""Run a Study on Ray Tune: every model/task pair in one experiment, Optuna TPE proposing per pair,
ASHA stopping per pair, every trial checkpointed to storage the whole cluster sees; then, for a
search with `confirm`, its best trials again over new seeds, as a second experiment.

A launch lives in `<storage_path>/<launch_id>/` on the driver: `launch.json` and `driver.lock`
(state.py reads both without Ray), `best/<pair>.yaml` (the answer's config per pair, accepted by
`orchestrator train`) and `report/`. Tune's experiments (`tune`, and `confirm`) and the trial
checkpoints live in `<storage>/<launch_id>/`, where `storage` defaults to `storage_path` (one
machine) and is a shared folder or an object store on a real cluster.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import fcntl
import itertools
import json
import logging
import math
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import optuna
import pyarrow.fs
import ray
import torch
from ray import tune
from ray.tune import Checkpoint, PlacementGroupFactory
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.trainable.function_trainable import wrap_function

from trainables.batched import train_members
from trainables.config import parse_trial_config, yaml_word
from trainables.train import pick_device, train

from ..plan.storage import TrialStorage, check_cluster_sees, last_line
from ..plan.study import Pair, Study
from ..record.best import summaries_of, write_best
from ..record.optuna_store import search_storage
from ..record.retries import DiskFull, StoreUnavailable, store_outage
from ..record.runs import (
    ERROR_TAG,
    REPLAY_KEY,
    STATUS_TAG,
    close_launch,
    interrupt_launch,
    launch_trial_runs,
    member_key,
    open_launch,
    running_launch_runs,
)
from ..record.secrets import redact, redact_text
from ..record.state import SNAPSHOT_MODULES, DamagedLaunch, Heartbeat, LaunchState, plan_of
from ..record.stores import normalize_store, remember, warm_up
from ..record.summaries import (
    ended_runs,
    fallen_pairs,
    pair_summaries,
    summarize_pairs,
    top_configs,
)
from ..record.tables import launch_table
from ..report.answer import answer_lines
from ..report.report import verdict_lines, write_launch_report, write_report
from .callbacks import ProgressLines, TrialTracker
from .cluster import join, measurement, one_gpu
from .cost import calibration_config, stack_curve, stack_sizes_to_try
from .disk import DiskWatch, least_free
from .exits import (
    EXIT_INTERRUPTED,
    EXIT_REGRESSION,
    EXIT_STORE_UNREACHABLE,
    EXIT_TRIALS_FAILED,
    EXIT_USAGE,
)
from .failures import FailureLog, error_text
from .search import (
    CANDIDATE_KEY,
    PAIR_KEY,
    RUN_ATTR,
    CellSearch,
    PairScheduler,
    PairSearch,
    ResumeFailed,
    TruncationAwareOptunaSearch,
    own_config,
    run_key,
    trial_members,
)
from .stacking import MEMBERS_KEY, Stacking, decide, knee, launched, misfits, slots_in

try:  # Ray's forwarder of its processes' output (quiet_ray): private, so not in every Ray
    from ray._private.worker import global_worker_stdstream_dispatcher
except ImportError:
    global_worker_stdstream_dispatcher = None

MAX_PENDING = "TUNE_MAX_PENDING_TRIALS_PG"  # Tune reads it as its controller starts


def run_trial(
    config: dict,
    bases: dict,
    metric: str,
    mode: str,
    stack_of: str,
    failures: FailureLog | None = None,
) -> None:
    """The Tune trainable: one trial of the paper's protocol, checkpointed at every evaluation; or,
    for a config of stacked members, every member at once (trainables.batched), each member's
    metrics under `member<k>/` (callbacks.TrialTracker gives each its MLflow run) and `metric`
    their `stack_of`: "mean" (the seeds of a cell) or "best" (a search's suggestions: ASHA keeps
    a stack while its best member is among the best). A trial that raises as it did on its try
    before ends with that error as its result (`failures`; None: every error is raised for Tune)."""
    # A line per checkpoint drowns the progress lines.
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    cfg = parse_trial_config({**bases[config[PAIR_KEY]], **own_config(config)})
    device, members = pick_device(cfg.device), config.get(MEMBERS_KEY)
    ran_as = cfg.settled(device.type, len(members) if members else 1)
    reporter = TrialReport(metric, mode, stack_of, ran_as, where_it_runs(device, ran_as))
    resume_state = reporter.restore()
    try:
        if members:
            train_members(cfg, members, report=reporter.members, resume_state=resume_state, log=None)
        else:  # the driver prints progress (callbacks.ProgressLines)
            train(cfg, report=reporter.report, resume_state=resume_state, log=None)
    except Exception as error:
        if failures is None or not failures.repeated(error, reporter.last_iteration()):
            raise
        reporter.failed(error)


def where_it_runs(device, ran_as) -> dict:
    """The tags that say where and how a trial runs. Two Ray nodes on one machine share a hostname;
    the node id tells them apart. compile and bf16 as the trial runs them: the recorded config keeps
    `auto`, which depends on the device and the stack."""
    return {
        "device": str(device),
        "node_id": ray.get_runtime_context().get_node_id(),
        "compile": ran_as.compile_mode or "off",
        "bf16": yaml_word(ran_as.bf16),
    }


class TrialReport:
    """run_trial's report to Tune: each evaluation's metrics, with a checkpoint of the trial's state
    and of its history (every evaluation so far, which a restored trial replays first)."""

    def __init__(self, metric: str, mode: str, stack_of: str, ran_as, where: dict):
        self.metric, self.mode, self.stack_of, self.ran_as, self.where = metric, mode, stack_of, ran_as, where
        self.history: list[dict] = []
        self.replay: list[dict] | None = None

    def restore(self):
        """The state of the checkpoint Tune restores the trial from (None where it starts afresh),
        and the history the checkpoint holds."""
        checkpoint = tune.get_checkpoint()
        if not checkpoint:
            return None
        with checkpoint.as_directory() as d:
            # Onto the CPU: the trial copies it into its own tensors, and a copy on the GPU would
            # stay for the whole trial (resume_state is held here) and count in its gpu_memory_mib.
            resume_state = torch.load(Path(d) / "state.pt", weights_only=False, map_location="cpu")
            if (Path(d) / "history.json").exists():
                self.history = json.loads((Path(d) / "history.json").read_text())
        self.replay = list(self.history)
        return resume_state

    def report(self, metrics: dict, state) -> None:
        # Tune fails a result without the metric it optimises: a run that diverged has none of its
        # scores (NaN: no score), nor has an evaluation before the last a final one (`test_*_final`).
        metrics = {self.metric: math.nan, **metrics}
        numbers = {
            k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        # A trial restored from the checkpoint it ended at reports that evaluation again.
        if not self.history or self.history[-1].get("iteration") != numbers.get("iteration"):
            self.history.append(numbers)
        # A string: Tune's loggers skip it quietly.
        extra = {REPLAY_KEY: json.dumps(self.replay)} if self.replay else {}
        self.replay = None
        with tempfile.TemporaryDirectory() as d:
            torch.save(state(), Path(d) / "state.pt")
            (Path(d) / "history.json").write_text(json.dumps(self.history))
            tune.report({**metrics, **self.where, **extra}, checkpoint=tune.Checkpoint.from_directory(d))

    def last_iteration(self) -> int:
        """The iteration of the trial's last evaluation (its checkpoint's), 0 before its first."""
        return int(self.history[-1].get("iteration", 0)) if self.history else 0

    def failed(self, error: BaseException) -> None:
        """The trial's last result where it failed as on its try before: the error, no checkpoint."""
        tune.report(
            {
                self.metric: math.nan,
                "status": "failed",
                "iteration": self.last_iteration(),
                ERROR_TAG: error_text(error)[-4000:],
                **self.where,
            }
        )

    def members(self, per_member: list[dict], state, compiled: bool) -> None:
        """A stack's evaluation: each member's metrics, and `metric` as their `stack_of`."""
        if self.ran_as.compile and not compiled:  # the tag says how the trial ran, from here on
            self.where["compile"] = "off (the compiled step failed)"
        metric, statuses = self.metric, {m["status"] for m in per_member}
        live = [m[metric] for m in per_member if m["status"] != "diverged" and metric in m] or [math.nan]
        overall = (
            sum(live) / len(live) if self.stack_of == "mean" else (min if self.mode == "min" else max)(live)
        )
        self.report(
            {
                **{member_key(k, key): v for k, m in enumerate(per_member) for key, v in m.items()},
                "iteration": max(m.get("iteration", 0) for m in per_member),
                metric: overall,
                "status": "diverged"
                if statuses == {"diverged"}
                else "running"
                if "running" in statuses
                else "completed",
            },
            state,
        )


def newest_existing_checkpoint(result):
    """Tune restores a trial from the checkpoint its experiment snapshot names. That one may be
    gone: Tune deletes the previous checkpoint when it registers a new one, before the snapshot is
    rewritten, so a driver killed in between (or a snapshot older than the last few evaluations)
    names a deleted folder. Then the newest checkpoint of the trial that does exist is as good (the
    tracker skips evaluations MLflow already has); with none left the trial starts over."""
    checkpoint = result.checkpoint
    fs = checkpoint.filesystem if checkpoint else None
    if checkpoint is None or fs.get_file_info(checkpoint.path).type != pyarrow.fs.FileType.NotFound:
        return result
    trial_dir = os.path.dirname(checkpoint.path)
    names = sorted(
        info.base_name
        for info in fs.get_file_info(pyarrow.fs.FileSelector(trial_dir, allow_not_found=True))
        if info.base_name.startswith("checkpoint_")
    )
    if not names:
        print(f"[trial] {checkpoint.path} is gone and no other checkpoint exists: starting over", flush=True)
        return None
    newest = f"{trial_dir}/{names[-1]}"
    print(f"[trial] {checkpoint.path} is gone: restoring from {newest}", flush=True)
    return type(result)(checkpoint=Checkpoint(newest, filesystem=fs), metrics=result.metrics)


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


SEARCH, CONFIRM = "tune", "confirm"  # a launch's phases, each its own Tune experiment in the launch's storage


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
        # Tune deletes the previous checkpoint as it registers a new one; a resume that finds the
        # named one gone falls back to the newest that exists (newest_existing_checkpoint).
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        # A trial whose node dies (or whose process fails) starts again from its last checkpoint; one
        # that raised as on its try before ends instead (failures.FailureLog).
        failure_config=tune.FailureConfig(max_failures=study.budget.max_failures),
        verbose=0,  # callbacks.ProgressLines prints instead of Tune's tables
    )


def start_ray(address: str | None) -> bool:
    """Join `address` or start a local instance; returns whether the cluster has GPUs."""
    if not ray.is_initialized():
        # Ray's start-up lines (its token-authentication notice among them) say nothing a user acts on.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        if address:
            join(address, log_to_driver=True, logging_level=logging.WARNING)
            print(f"[launch] joined the Ray cluster at {address}", flush=True)
        else:
            # "local", not None: with no address Ray attaches to the last cluster `ray start` made
            # on this machine (/tmp/ray/ray_current_cluster), and waits for ever if that one died.
            join("local", include_dashboard=False, log_to_driver=True, logging_level=logging.WARNING)
            print("[launch] started a local Ray instance", flush=True)
        quiet_ray()
    return ray.cluster_resources().get("GPU", 0) > 0


def restated(record: logging.LogRecord) -> bool:
    """False for Tune's log records that restate what our lines say: a failed trial's traceback, the
    list of trials that failed for good at the run's end, and the previous checkpoint already gone
    when Tune deletes it (a driver killed as Tune pruned it; newest_existing_checkpoint copes)."""
    message = record.getMessage()
    if message.startswith(("Trial task failed", "Trials did not complete")):
        return False
    error = record.exc_info[1] if record.exc_info else None
    return not (
        "Error handling checkpoint" in message
        and isinstance(error, FileNotFoundError)
        and "checkpoint_" in str(error)
    )


def superseded_sync(record: logging.LogRecord) -> bool:
    """False for Tune's report of an upload of its experiment state that lost a file it was
    copying: Tune writes the next snapshot into its staging folder while the previous upload may
    still run (ray/tune/execution/experiment_state.py), and a temporary file of that write
    ("-tmp-searcher-state-...") is renamed under the upload. The snapshot after it is uploaded in
    full (the last one waits for its upload), so the lost copy costs nothing."""
    error = record.exc_info[1] if record.exc_info else None
    return not (
        record.getMessage().startswith("Saving experiment state to storage")
        and isinstance(error, FileNotFoundError)
        and "-tmp-" in str(error)
    )


def uncollected(record: logging.LogRecord) -> bool:
    """False for Ray's "Unhandled error" of a trial's step that Tune, stopping (a full disk, an
    outage), no longer collected: the launch's stop line says why, and resume runs the step again."""
    message = record.getMessage()
    return not (message.startswith("Unhandled error") and "Trainable" in message)


def quiet_ray() -> None:
    """The console shows our lines, not Ray's restatement of a fault they already report: Tune's
    traceback of a failed trial (callbacks.error_words gives its last line; the whole one is in
    its MLflow run's error tag), and of what trial processes and Ray's own processes print (a
    dying node's "Failed to remove bundle", an interrupted worker's shutdown traceback), only
    our "[trial] ..." lines; the rest stays in Ray's log folder (<ray tmp>/session_latest/logs).
    Ray has no switch for its forwarding: its handlers are wrapped, where the installed Ray has them."""
    logging.getLogger("ray.tune.execution.tune_controller").addFilter(restated)
    logging.getLogger("ray.tune.tune").addFilter(restated)
    logging.getLogger("ray.tune.execution.experiment_state").addFilter(superseded_sync)
    logging.getLogger("ray._private.worker").addFilter(uncollected)
    dispatcher = global_worker_stdstream_dispatcher
    if dispatcher is None:
        return

    def only_ours(forward):
        def handle(data):
            lines = [line for line in data.get("lines", []) if line.startswith("[trial]")]
            if lines:
                forward({**data, "lines": lines})

        return handle

    dispatcher.handlers = [
        (name, only_ours(handler)) for name, handler in getattr(dispatcher, "handlers", [])
    ]


class ClusterMismatch(RuntimeError):
    """The launch asks for what the cluster cannot give; refused before anything is written."""


class LaunchExists(RuntimeError):
    """--launch-id names a launch another command registered after this one's check."""


def check_fits(study: Study, use_gpu: bool) -> None:
    """A trial that no node can hold would wait for ever (Ray queues it silently), and one told to
    train on CUDA where the cluster has no GPU would fail at its first step: refused, with the key
    at fault, before anything of the launch is written."""
    problems = misfits(study, use_gpu, [node["Resources"] for node in ray.nodes() if node.get("Alive")])
    if problems:
        raise ClusterMismatch(problems[0])


CUDA_CHECK_S = 120  # a worker's start and torch's import take seconds; the task waits for a free GPU


def torch_cuda() -> dict:
    """What torch on this node makes of its GPU (a Ray task's body)."""
    return {
        "available": torch.cuda.is_available(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "node": socket.gethostname(),
    }


def without_cuda(seen: dict) -> str | None:
    """A warning where a GPU node's torch finds no CUDA: its trials would hold a GPU and train on the
    CPU (device auto), many times slower, with nothing but their runs' `device` tag to say so."""
    if seen["available"]:
        return None
    why = (
        "a CPU-only build"
        if seen["cuda"] is None
        else f"built for CUDA {seen['cuda']}; the driver or the GPU does not answer"
    )
    return (
        f"[launch] warning: on {seen['node']}, a node with GPUs, torch {seen['torch']} finds no CUDA "
        f"({why}): trials that "
        "hold a GPU there train on its CPU; install a CUDA build of torch on the GPU nodes"
    )


def check_cuda(study: Study) -> None:
    """Asks one GPU of the cluster, with a trial's CPUs, whether torch there finds CUDA (a few
    seconds) and says so where it does not; the launch goes on (a GPU declared to Ray, as tests
    do, is no error)."""
    if not any(p.resources.gpu > 0 for p in study.pairs):
        return
    cpus = min(p.resources.cpu for p in study.pairs if p.resources.gpu > 0)
    asked = measurement(torch_cuda, num_cpus=cpus, num_gpus=one_gpu()).remote()
    try:  # a GPU that other work holds for minutes is no reason to wait for the answer
        seen = ray.get(asked, timeout=CUDA_CHECK_S)
    except Exception as e:  # noqa: BLE001 - a check that cannot be made is no reason to refuse the launch
        ray.cancel(asked)
        print(
            f"[launch] could not ask a GPU node whether torch there finds CUDA: {last_line(e)[:200]}",
            flush=True,
        )
        return
    if warning := without_cuda(seen):
        print(warning, flush=True)


def measure_stack_sizes(stacking: Stacking) -> dict[str, int]:
    """budget.stack_size auto, where trials get a GPU: for each pair whose trials would stack on one, the
    knee of its throughput curve (stacking.knee), measured on a whole GPU of the cluster
    with a trial's CPUs, on a small copy of the pair's task (cost.calibration_config). A whole one
    even where trials share a GPU: curves timed side by side on one GPU timed each other (four pairs
    at a quarter of an H100 each: one curve gave 234.4 member-steps/s at 4 members, 156.0 at 5)."""

    most = {
        p.name: stacking.most_stacked(p)
        for p in stacking.study.pairs
        if stacking.measures_stack_size(p, use_gpu=True)
    }
    pairs = [p for p in stacking.study.pairs if p.name in most]
    if not pairs:
        return {}
    gpu = one_gpu()
    pending = [
        measurement(
            stack_curve,
            num_cpus=p.resources.cpu,
            num_gpus=max(p.resources.gpu, gpu),
            resources=p.resources.custom or None,
        ).remote(calibration_config(stacking, p, stacked=True), stack_sizes_to_try(most[p.name]))
        for p in pairs
    ]
    sizes = {}
    for pair, job in zip(pairs, pending):
        try:
            curve, why = ray.get(job), "not even one member fits the device"
        except Exception as e:  # noqa: BLE001 - a measurement that failed is no reason to refuse the launch
            curve, why = [], last_line(e)[:200]
        if not curve:  # the trials train one run each; where that fails too, the trial says why
            sizes[pair.name] = 1
            print(
                f"[launch] stack size of {pair.name}: 1, its throughput could not be measured ({why})",
                flush=True,
            )
            continue
        sizes[pair.name] = knee(curve, members=most[pair.name])
        shown = ", ".join(f"{n}: {rate:.1f}" for n, rate in curve)
        print(
            f"[launch] stack size of {pair.name}: {sizes[pair.name]}, where the member-steps/s of its "
            f"{most[pair.name]} members (a stack of "
            f"the rest included) level off ({shown})",
            flush=True,
        )
    return sizes


def check_storage(storage: TrialStorage, key: str) -> None:
    """On a cluster of several nodes, every node must see the trial storage: checked by reading a
    marker back on each node, before anything of the launch is written."""
    n_nodes = check_cluster_sees(storage, key)
    if n_nodes > 1:
        print(f"[launch] trial storage {storage.uri}: seen by all {n_nodes} nodes", flush=True)


def start(
    study: Study, spec_text: str, launch_id: str | None, address: str | None, night: int | None = None
) -> int:
    """Join (or start) Ray, check the trial storage, register the launch (as the nightly job's
    night `night`, if given), then run it."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # Seconds of MLflow's imports while Ray starts; nothing is written (a new store gets its
        # tables) until the cluster has been checked and has seen the storage.
        warming = pool.submit(warm_up, normalize_store(study.tracking.uri))
        use_gpu = start_ray(address)
        check_fits(study, use_gpu)
        stacking = decide(study, use_gpu)
        check_storage(study.storage, "storage")
        if use_gpu:
            check_cuda(study)
            stacking = dataclasses.replace(stacking, stack_sizes=measure_stack_sizes(stacking))
        warming.result()
    state, lock = new_launch(study, spec_text, launch_id, night, stacking)
    print(f"[launch] id {state.launch_id}; resume with: orchestrator resume {state.dir}", flush=True)
    return execute(state, address, lock=lock)


def execute(
    state: LaunchState, address: str | None, study: Study | None = None, lock: IO | None = None
) -> int:
    """Run (or continue) a launch until every trial has ended, its confirmation phase included;
    then write the best configs (or the ablation report). Returns the exit status: 0,
    EXIT_STORE_UNREACHABLE after a store outage, EXIT_INTERRUPTED after Ctrl-C / SIGTERM,
    EXIT_REGRESSION where a night of the nightly job regressed from the night before, else
    EXIT_TRIALS_FAILED where trials failed for good (a script must not take such a launch's
    answer for a whole one). `study`: state.study(), where the caller has read it already; `lock`:
    driver.lock as new_launch took it (else taken here). Its trials stack as launch.json says: a
    resume repeats the launch's."""
    stacking = launched(study or state.study(), state)
    study, use_gpu = stacking.study, start_ray(address)
    slots = cluster_slots(stacking, use_gpu)
    # A snapshot after every checkpoint is what keeps resume exact; Tune warns about it each time.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Tune's console (its boxes, tables and TensorBoard hint) off: callbacks.ProgressLines prints.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    logging.getLogger("ray.tune").setLevel(logging.WARNING)
    # A restored experiment's trial that never reported has no result files; we read MLflow, not those.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    # "The `process_trial_result` operation took 31 s": a store being retried, which [store] lines say.
    logging.getLogger("ray.tune.utils.util").setLevel(logging.ERROR)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # "Falling back to a slower alternative" with the SQL of a dropped connection: it recovered.
    logging.getLogger("optuna.storages._rdb.storage").setLevel(logging.ERROR)
    print(
        f"[launch] {state.launch_id}: {len(study.pairs)} pairs, up to {slots} trials at once on "
        f"{'GPU' if use_gpu else 'CPU'}; "
        f"MLflow {redact(state.tracking_uri)} experiment {study.experiment!r}",
        flush=True,
    )
    lock = lock or hold_driver_lock(state.dir)
    if lock is None:  # another driver took it after the command's check
        print(
            f"orchestrator: error: {state.dir}: a driver is running this launch now; "
            f"`orchestrator status {state.dir}` shows its progress",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_USAGE
    with lock, Heartbeat(state.dir / "driver.lock"):
        try:
            return run_launch(state, stacking, use_gpu)
        except StoreUnavailable as e:  # outside Tune's run: registering, summarizing, reporting
            return stopped_by_outage(state, e)
        except KeyboardInterrupt:  # Ctrl-C outside Tune's run (which stops calmly by itself)
            if state.state != "finished":  # else only the closing lines were cut short
                previous = signal.signal(
                    signal.SIGINT, signal.SIG_IGN
                )  # a further one would cut the record short
                try:
                    mark_interrupted(state)
                finally:
                    signal.signal(signal.SIGINT, previous)
            return EXIT_INTERRUPTED


def stopped_by_outage(state: LaunchState, error: StoreUnavailable) -> int:
    """One line for a store that stayed unreachable through every retry, or a disk that filled up
    (the launch and its running pairs then recorded interrupted, where the store takes it).
    -> EXIT_STORE_UNREACHABLE."""
    state.state = "interrupted" if isinstance(error, DiskFull) else "failed"
    with contextlib.suppress(OSError):  # its disk may be the full one: it then says "running", driver gone
        state.save()
    reason = str(error)
    if isinstance(error, DiskFull):
        with contextlib.suppress(StoreUnavailable):  # the store's own disk may be the full one
            interrupt_launch(state.tracking_uri, state.experiment, state.parent_run_id, state.launch_id)
        if " MiB free" not in reason:  # a store's write that failed: where, and how much is left
            fs, storage_path, _ = experiment_location(state)
            reason += f"; {least_free(watched_places(state, fs, storage_path))}"
    print(
        f"orchestrator: error: {reason}; every trial is checkpointed: "
        f"{'free space, then ' if isinstance(error, DiskFull) else ''}continue with "
        f"`orchestrator resume {state.dir}`",
        flush=True,
    )
    return EXIT_STORE_UNREACHABLE


def run_launch(state: LaunchState, stacking: Stacking, use_gpu: bool) -> int:
    """execute's work, under the driver's lock: every phase, then the answer."""
    study = stacking.study
    state.state = "running"
    state.save()
    code, errors = run_phase(state, stacking, SEARCH, use_gpu)
    confirming = study.confirm.top_k and not study.is_ablation
    if code == 0 and confirming:
        code, more_errors = run_confirmation(state, stacking, use_gpu)
        errors += more_errors
    if code:
        return code
    written, regressions, summaries = write_answer(state, study)
    fallen = fallen_pairs(launch_trial_runs(state.tracking_uri, state.experiment, state.launch_id))
    close_launch(state.tracking_uri, state.parent_run_id, launch_status="finished")
    state.state = "finished"
    # A first night compared with none: no verdict.
    if state.night is not None and getattr(regressions, "compared", None):
        state.regressed = bool(regressions)
    state.save()
    for path in written:
        print(f"[launch] wrote {path}", flush=True)
    print_summary(state, study, summaries)
    if errors:
        print(
            f"[launch] {errors} run(s) failed: each one's error is in the report's trial table and "
            "`orchestrator export` (its last line), its traceback in its MLflow run's error tag",
            flush=True,
        )
    if fallen:
        print(f"[launch] every run of {', '.join(fallen)} diverged or failed", flush=True)
    for line in verdict_lines(regressions):
        print(f"[launch] {line}", flush=True)
    return EXIT_REGRESSION if regressions else EXIT_TRIALS_FAILED if errors or fallen else 0


def run_confirmation(state: LaunchState, stacking: Stacking, use_gpu: bool) -> tuple[int, int]:
    """A search's confirmation phase: its best trials again over new seeds. -> as run_phase."""
    study = stacking.study
    if state.candidates is None:  # chosen once: a resumed confirmation repeats the same trials
        state.candidates = top_configs(
            state.tracking_uri,
            state.experiment,
            state.launch_id,
            study.metric,
            study.score,
            study.confirm.top_k,
        )
        state.save()
    print(
        f"[launch] confirming: the {study.confirm.top_k} best trials of each pair again with seeds "
        f"{', '.join(map(str, study.confirm.seeds))}",
        flush=True,
    )
    return run_phase(state, stacking, CONFIRM, use_gpu)


def write_answer(state: LaunchState, study: Study) -> tuple[list, list, dict | None]:
    """The files of a launch whose phases have ended: an ablation's report (a night's, compared with
    the nights before), or a search's best configs and report once Optuna knows how every proposal
    ended. -> (the files written, the regressions found, a search's summaries per pair)."""
    if study.is_ablation:
        written, regressions = write_launch_report(state)
        return written, regressions, None
    storage = optuna_storage(state)
    trial_runs = launch_trial_runs(state.tracking_uri, state.experiment, state.launch_id)
    for pair in study.pairs:
        searched = [
            r
            for r in trial_runs
            if r.data.tags.get("pair") == pair.name and r.data.tags.get("phase", "search") == "search"
        ]
        settle_proposals(storage, optuna_study_name(state, pair), searched, study.metric)
    summaries = pair_summaries(
        state.tracking_uri,
        state.experiment,
        state.launch_id,
        study.metric,
        study.score,
        trial_runs,
        headline=study.headline,
    )
    written = write_best(state, summaries)
    summarize_pairs(
        state.tracking_uri, state.parent_run_id, state.launch_id, study.metric, study.headline, summaries
    )
    written += write_report(state)[0]
    return written, [], summaries


def run_phase(state: LaunchState, stacking: Stacking, phase: str, use_gpu: bool) -> tuple[int, int]:
    """Run (or continue, from its Tune experiment) one phase until its trials have ended.
    -> (exit status: 0, EXIT_STORE_UNREACHABLE, EXIT_INTERRUPTED; trials that failed for good)."""
    # A phase's own concurrency: a stacked search may be a trial or two per pair, its confirmation many.
    slots = cluster_slots(
        stacking, use_gpu, phase_cells(stacking, state, phase) if phase == CONFIRM else None
    )
    fs, storage_path, name = experiment_location(state, phase)
    experiment = f"{storage_path}/{name}"
    if has_snapshot(experiment, fs):
        print(f"[launch] resuming from {state.trial_storage().join(state.launch_id, name)}", flush=True)
        tuner = tune.Tuner.restore(
            experiment,
            trainable=make_trainable(stacking.study, use_gpu, phase, failure_log(state, phase)),
            resume_unfinished=True,
            resume_errored=True,
            storage_filesystem=fs,
        )
    else:
        tuner = build_tuner(stacking, state, use_gpu, slots, phase)
    with CalmStop(), pending_limit(slots):
        try:
            tuner.fit()
        except (ResumeFailed, Exception) as e:
            unavailable = store_outage(e)
            if unavailable is None:
                raise
            return stopped_by_outage(state, unavailable), 0
        return phase_outcome(state, stacking, phase)


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
    and runs it started are marked lost (callbacks.TrialTracker.on_experiment_end). DamagedLaunch
    where the newest snapshot does not parse."""
    fs = fs or pyarrow.fs.LocalFileSystem()
    found = fs.get_file_info(pyarrow.fs.FileSelector(experiment, allow_not_found=True))
    snapshots = sorted(
        f.path for f in found if f.base_name.startswith("experiment_state-") and f.base_name.endswith(".json")
    )
    if snapshots:  # Tune reads the newest; one cut short (a full disk) it drops, restarting the phase
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


def phase_outcome(state: LaunchState, stacking: Stacking, phase: str) -> tuple[int, int]:
    """-> (0 or EXIT_INTERRUPTED, runs failed for good) once a phase's Tune run has returned."""
    total = sum(phase_runs(stacking.study, phase_cells(stacking, state, phase)).values())
    # Counted from our records: Tune's clean-up after Ctrl-C marks unfinished trials TERMINATED.
    ended, failed = ended_runs(
        state.tracking_uri, state.experiment, state.launch_id, "confirm" if phase == CONFIRM else "search"
    )
    if ended < total:
        mark_interrupted(
            state, f"with {ended} of {total} {'confirmation ' if phase == CONFIRM else ''}runs ended"
        )
        return EXIT_INTERRUPTED, failed
    return 0, failed


def mark_interrupted(state: LaunchState, how: str = "") -> None:
    """The launch stopped before its end (Ctrl-C, SIGTERM): say so in launch.json and MLflow."""
    state.state = "interrupted"
    state.save()
    interrupt_launch(state.tracking_uri, state.experiment, state.parent_run_id, state.launch_id)
    print(
        f"[launch] interrupted{' ' + how if how else ''}; nothing is lost: orchestrator resume {state.dir}",
        flush=True,
    )


class CalmStop(logging.Filter):
    """Ctrl-C as a user sees it, for the span of a phase. Tune stops at the first SIGINT, saving
    its state, then puts back the SIGINT handler it found: this one, which answers further Ctrl-Cs
    with a line instead of a KeyboardInterrupt in the middle of that save. Tune's own lines about
    the stop (they invite a second Ctrl-C and name Tuner.restore, not `orchestrator resume`) become
    ours. SIGTERM (a scheduler's stop) is taken as SIGINT."""

    def __init__(self):
        super().__init__()
        self.stopping = False
        self.tune_log = logging.getLogger("ray.tune.tune")

    def __enter__(self):
        self.previous = {
            sig: signal.signal(sig, handler)
            for sig, handler in (
                (signal.SIGINT, self.on_sigint),
                (signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT)),
            )
        }
        self.tune_log.addFilter(self)
        return self

    def __exit__(self, *exc):
        self.tune_log.removeFilter(self)
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Stop signal received"):
            self.stopping = True
            print("[launch] stopping: saving every trial's state (a few seconds)", flush=True)
            return False
        return not message.startswith("Experiment has been interrupted")

    def on_sigint(self, signum, frame) -> None:
        if not self.stopping:
            raise KeyboardInterrupt
        print("[launch] still saving the launch's state; it stops by itself in a moment", flush=True)


def hold_driver_lock(launch_dir: Path) -> IO | None:
    """driver.lock, locked and holding this driver's line, or None where another driver holds it.
    The lock tells a second driver on this machine that this one runs; the heartbeat tells a
    reader on another machine (state.driver). Opened without truncating: a driver that holds it
    keeps its line (two resumes at once)."""
    lock = open(launch_dir / "driver.lock", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    lock.truncate(0)
    lock.write(f"{socket.gethostname()} {os.getpid()}\n")
    lock.flush()
    return lock


def claim_launch_id(storage_path: Path, stamped: str) -> tuple[str, Path]:
    """`stamped` (the file's name and the second), or `stamped-2`, ...: the first whose folder this
    launch makes itself. Two launches of one file begun in the same second shared one folder and
    one MLflow parent run."""
    storage_path.mkdir(parents=True, exist_ok=True)
    for k in itertools.count(1):
        launch_id = stamped if k == 1 else f"{stamped}-{k}"
        try:
            (storage_path / launch_id).mkdir()
        except FileExistsError:
            continue
        return launch_id, (storage_path / launch_id).resolve()


def end_unregistered_launches(uri: str, study: Study, launch_id: str) -> None:
    """A driver of this machine killed between creating its launch's run and writing launch.json
    left the run RUNNING in MLflow for good, beside a folder that no command reads (without
    launch.json there is nothing to resume): the next launch of the experiment ends such a run as
    a failed save would have, where no driver holds the folder's lock. (`launch_id`'s own run, left
    so, is the one a launch given that id again with --launch-id takes over.)"""
    for run in running_launch_runs(uri, study.experiment, socket.gethostname()):
        folder = Path(study.storage_path) / run.data.tags["launch_id"]
        if (
            run.data.tags["launch_id"] == launch_id
            or not folder.is_dir()
            or (folder / "launch.json").exists()
        ):
            continue
        lock = hold_driver_lock(folder)
        if lock is None:  # a driver registering this launch now
            continue
        with lock:
            close_launch(uri, run.info.run_id, status="KILLED", launch_status="never registered")


def new_launch(
    study: Study,
    spec_text: str,
    launch_id: str | None = None,
    night: int | None = None,
    stacking: Stacking | None = None,
) -> tuple[LaunchState, IO]:
    """Register a launch: its folder, its driver.lock (held: status sees a driver from the moment
    launch.json is there) and its MLflow parent run. Call only after the spec validated, the store
    answered and the cluster saw the trial storage. `stacking`: as start decided it (launch.json
    keeps it); by default the file's alone."""
    launch_id, launch_dir, lock = claim_launch(study, launch_id, night)
    uri = normalize_store(study.tracking.uri)
    # The password stays in this process's memory (stores.reveal); every record of the launch
    # (launch.json, Tune's pickles, MLflow) holds the redacted URI and the redacted file.
    stored_uri = remember(uri)
    spec_text = redact_text(spec_text, uri)
    try:
        end_unregistered_launches(stored_uri, study, launch_id)
        parent = open_launch(
            stored_uri, study.experiment, launch_id, str(study.path), spec_text, Path(study.storage_path)
        )
    except BaseException:  # nothing registered: the id's claim goes, so it can be given again
        lock.close()
        raise
    state = LaunchState(
        launch_id,
        launch_dir,
        study.experiment,
        str(study.path),
        spec_text,
        stored_uri,
        parent,
        storage=dataclasses.asdict(study.storage.resolved()),
        plan=plan_of(study),
        night=night,
        created=time.time(),
        **(stacking or decide(study, use_gpu=None)).record(),
        snapshot_modules=SNAPSHOT_MODULES,
    )
    try:
        state.save()
    except BaseException:
        # No launch.json, no launch to resume: its run ends (MLflow showed it RUNNING for good) and
        # the id's claim goes.
        with contextlib.suppress(Exception):
            close_launch(stored_uri, parent, status="KILLED", launch_status="never registered")
        lock.close()
        raise
    return state, lock


def claim_launch(study: Study, launch_id: str | None, night: int | None) -> tuple[str, Path, IO]:
    """(id, folder, its driver.lock held) of a new launch: `launch_id` (--launch-id, which the
    command refused where it named a launch), else the file's name and the second."""
    if launch_id:
        launch_dir = (Path(study.storage_path) / launch_id).resolve()
        launch_dir.mkdir(parents=True, exist_ok=True)
        # Claimed by its lock, which a killed driver leaves free (an empty launch.json claiming the
        # id was left for good, and a RayJob's retry then resumed a "damaged" launch): two launches
        # of one id both passed the check.
        lock = hold_driver_lock(launch_dir)
        if lock is None or (launch_dir / "launch.json").exists():
            if lock:
                lock.close()
            raise LaunchExists(f"launch {launch_id} exists in {study.storage_path}, begun a moment ago")
        return launch_id, launch_dir, lock
    stamped = f"{study.name}-{'' if night is None else 'night-'}{time.strftime('%Y%m%d-%H%M%S')}"
    launch_id, launch_dir = claim_launch_id(Path(study.storage_path), stamped)
    return launch_id, launch_dir, hold_driver_lock(launch_dir)


def print_summary(state: LaunchState, study: Study, summaries: dict | None = None) -> None:
    """The launch's table (record.tables: as `status` shows it), a search's answer, and what to run
    next. `summaries`: a search's pair_summaries, where already read."""
    print(f"[launch] summary ({study.metric}, {study.mode}):", flush=True)
    for line in launch_table(state, state.the_plan(), "running", summaries):
        print(f"  {line}", flush=True)
    if not study.is_ablation:
        summaries = summaries or summaries_of(state)
        for line in answer_lines(study, summaries):
            print(f"[launch] {line}", flush=True)
    # A pair's best config is written where one of its trials may answer: none where all diverged or failed.
    best_files = (
        []
        if study.is_ablation
        else [path for path in (state.dir / "best" / f"{p.name}.yaml" for p in study.pairs) if path.exists()]
    )
    later = f"{state.dir / 'report' / 'report.html'}" + (
        f"; orchestrator train {best_files[0]}" if best_files else ""
    )
    print(
        f"[launch] next: orchestrator status {state.dir}; {later}; MLflow's UI: orchestrator ui {state.dir}",
        flush=True,
    )
