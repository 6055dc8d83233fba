"""Run a Study on Ray Tune: one Tuner per model/task pair, Optuna TPE proposing, ASHA stopping.

A launch lives in `<storage_path>/<launch_id>/`: `launch.json` (the spec text, tracking store,
parent run, finished pairs), `tune/<pair>/` (Tune's experiment state and trial checkpoints) and
`best/<pair>.yaml` (the best config per pair, accepted by `orchestrator train`).
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import tracking
from .spec import Pair, Study, load_study


@dataclass
class LaunchState:
    launch_id: str
    dir: Path
    experiment: str  # the MLflow experiment, also what makes launches of one file comparable
    spec_file: str
    spec_text: str
    tracking_uri: str
    parent_run_id: str
    finished_pairs: list[str]

    def save(self) -> None:
        data = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}
        tmp = self.dir / "launch.json.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.dir / "launch.json")

    @classmethod
    def load(cls, launch_dir: Path) -> "LaunchState":
        data = json.loads((launch_dir / "launch.json").read_text())
        data["dir"] = Path(data["dir"])
        return cls(**data)

    def study(self) -> Study:
        return load_study(self.spec_file, text=self.spec_text)


def previous_launch(state: LaunchState) -> "LaunchState | None":
    """The most recent other launch of the same search-space file under the same folder."""
    others = []
    for path in state.dir.parent.glob("*/launch.json"):
        other = LaunchState.load(path.parent)
        if other.launch_id != state.launch_id and other.experiment == state.experiment:
            others.append((path.stat().st_mtime, other))
    return max(others, key=lambda o: o[0])[1] if others else None


def find_launch(storage_path: str, launch_id: str | None) -> Path:
    """A launch folder by id or path; without one, the most recent launch under storage_path."""
    if launch_id:
        for candidate in (Path(launch_id), Path(storage_path) / launch_id):
            if (candidate / "launch.json").exists():
                return candidate.resolve()
        raise FileNotFoundError(f"no launch {launch_id!r} (looked for {launch_id}/launch.json and {storage_path}/{launch_id}/launch.json)")
    launches = sorted(Path(storage_path).glob("*/launch.json"), key=lambda p: p.stat().st_mtime)
    if not launches:
        raise FileNotFoundError(f"no launches under {storage_path}/")
    return launches[-1].parent.resolve()


def run_trial(config: dict, base: dict, cpus: float) -> None:
    """The Tune trainable: one trial of the paper's protocol, checkpointed at every evaluation."""
    import ray
    import torch
    from ray import tune

    from trainables.config import parse_trial_config
    from trainables.train import pick_device, train

    cfg = parse_trial_config({**base, **config})
    cfg.threads = max(1, int(cpus))
    # Two Ray nodes on one machine share a hostname; the node id tells them apart.
    where = {"device": str(pick_device(cfg.device)), "node_id": ray.get_runtime_context().get_node_id()}
    resume_state = None
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            resume_state = torch.load(Path(d) / "state.pt", weights_only=False)

    def report(metrics: dict, state) -> None:
        with tempfile.TemporaryDirectory() as d:
            torch.save(state(), Path(d) / "state.pt")
            tune.report({**metrics, **where}, checkpoint=tune.Checkpoint.from_directory(d))

    train(cfg, report=report, resume_state=resume_state)


def make_searcher(study: Study, pair: Pair, storage, study_name: str):
    import optuna
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    class TruncationAwareOptunaSearch(OptunaSearch):
        """Ray tells Optuna a trial that ASHA stopped is COMPLETE with its truncated score, so TPE
        would learn from scores of unequal budgets. We tell it PRUNED instead (and the same for a
        diverged trial): TPE then ranks it below every completed trial, ordered by the intermediate
        values it reported, so the search learns "worse than finished ones" and no more."""

        def on_trial_complete(self, trial_id, result=None, error=False):
            if result and result.get("status") != "completed":
                result = None
            super().on_trial_complete(trial_id, result=result, error=error)

    searcher = TruncationAwareOptunaSearch(
        space={k: d.to_optuna() for k, d in pair.space.items()},
        storage=storage, study_name=study_name,
        metric=study.metric, mode=study.mode,
        points_to_evaluate=[pair.warm_start] if study.warm_start and pair.warm_start else None,
        sampler=optuna.samplers.TPESampler(seed=study.seed),
    )
    return ConcurrencyLimiter(searcher, max_concurrent=study.budget.max_concurrent)


def optuna_storage(state: LaunchState):
    import optuna

    url, engine_kwargs = tracking.search_store(state.tracking_uri, state.dir)
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)


def optuna_study_name(state: LaunchState, pair: Pair) -> str:
    return f"{state.experiment}/{state.launch_id}/{pair.name}"


def fail_stale_proposals(storage, study_name: str) -> None:
    """Once a pair's search has ended no trial runs, yet proposals made after the searcher's last
    checkpoint before a driver crash stay RUNNING in the Optuna study; say they failed."""
    import optuna

    study = optuna.load_study(study_name=study_name, storage=storage)
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)


def make_trainable(study: Study, pair: Pair, use_gpu: bool):
    from ray import tune

    resources = {"cpu": study.resources.cpu, "gpu": study.resources.gpu if use_gpu else 0, **study.resources.custom}
    return tune.with_resources(tune.with_parameters(run_trial, base=pair.base, cpus=study.resources.cpu), resources)


def run_pair(study: Study, pair: Pair, state: LaunchState, use_gpu: bool) -> None:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    tune_dir = (state.dir / "tune").resolve()
    trainable = make_trainable(study, pair, use_gpu)
    # One connection to the search's SQL store per pair (a restored searcher brings its own).
    storage = None if study.is_ablation else optuna_storage(state)
    study_name = optuna_study_name(state, pair)
    if tune.Tuner.can_restore(tune_dir / pair.name):
        print(f"[launch] {pair.name}: resuming from {tune_dir / pair.name}", flush=True)
        tuner = tune.Tuner.restore(str(tune_dir / pair.name), trainable=trainable, resume_unfinished=True, resume_errored=True)
    elif study.is_ablation:
        # Every grid combination for every seed: no searcher, no early stopping (it would bias the table).
        grid = {k: tune.grid_search(v) for k, v in pair.grid.items()}
        tuner = tune.Tuner(
            trainable,
            param_space={**grid, "seed": tune.grid_search(study.seeds)},
            tune_config=tune.TuneConfig(metric=study.metric, mode=study.mode, max_concurrent_trials=study.budget.max_concurrent, reuse_actors=True),
            run_config=run_config(study, pair, state, tune_dir),
        )
    else:
        n_iters = int(pair.base["n_iters"])
        if study.scheduler.name == "asha":
            scheduler = ASHAScheduler(
                time_attr="iteration", max_t=n_iters, grace_period=min(study.scheduler.grace_period, n_iters),
                reduction_factor=study.scheduler.reduction_factor,
            )
        else:
            scheduler = FIFOScheduler()
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                metric=study.metric, mode=study.mode, search_alg=make_searcher(study, pair, storage, study_name),
                scheduler=scheduler, num_samples=study.budget.trials,
                reuse_actors=True,  # a finished trial's process takes the next trial: no restart, no re-import
            ),
            run_config=run_config(study, pair, state, tune_dir),
        )
    tuner.fit()
    if storage is not None:
        fail_stale_proposals(storage, study_name)


def run_config(study: Study, pair: Pair, state: "LaunchState", tune_dir: Path):
    from ray import tune

    tags = {"model": pair.model, "task": pair.task.task, "variant": pair.task.variant}
    return tune.RunConfig(
        name=pair.name, storage_path=str(tune_dir),
        callbacks=[tracking.TrialTracker(state.tracking_uri, state.parent_run_id, state.launch_id, pair.name, pair.base, tags)],
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        failure_config=tune.FailureConfig(max_failures=0),
        verbose=1,
    )


def start_ray(address: str | None) -> bool:
    """Join `address` or start a local instance; returns whether the cluster has GPUs."""
    import ray

    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=True)
        else:
            # "local", not None: with no address Ray attaches to the last cluster `ray start` made
            # on this machine (/tmp/ray/ray_current_cluster), and waits for ever if that one died.
            ray.init(address="local", include_dashboard=False, log_to_driver=True)
    return ray.cluster_resources().get("GPU", 0) > 0


def start(study: Study, spec_text: str, launch_id: str | None, address: str | None) -> LaunchState:
    """Register a new launch in MLflow while Ray starts (the two take seconds each), then run it."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        registering = pool.submit(new_launch, study, spec_text, launch_id)
        try:
            start_ray(address)
        except BaseException:
            state = registering.result()
            tracking.close_launch(state.tracking_uri, state.parent_run_id, status="FAILED")
            raise
        state = registering.result()
    print(f"[launch] id {state.launch_id}; resume with: orchestrator resume {state.dir}", flush=True)
    return execute(state, address)


def execute(state: LaunchState, address: str | None) -> LaunchState:
    """Run (or continue) every pair of a launch that has not finished, then write the best configs."""
    study = state.study()
    # Ray otherwise caps pending placement groups independently of our concurrency limit (ray#63770).
    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", str(study.budget.max_concurrent))
    use_gpu = start_ray(address)
    print(f"[launch] {state.launch_id}: {len(study.pairs)} pairs on {'GPU' if use_gpu else 'CPU'}; MLflow {state.tracking_uri} "
          f"experiment {study.experiment!r}", flush=True)
    for pair in study.pairs:
        if pair.name in state.finished_pairs:
            print(f"[launch] {pair.name}: finished earlier, skipping", flush=True)
            continue
        run_pair(study, pair, state, use_gpu)
        state.finished_pairs.append(pair.name)
        state.save()
    if study.is_ablation:
        from .report import write_report

        written, _ = write_report(state)
    else:
        written = write_best(state)
    tracking.close_launch(state.tracking_uri, state.parent_run_id)
    for path in written:
        print(f"[launch] wrote {path}", flush=True)
    return state


def new_launch(study: Study, spec_text: str, launch_id: str | None = None) -> LaunchState:
    """Register a launch: its folder and its MLflow parent run. Call only after the spec validated
    and the store answered."""
    launch_id = launch_id or f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    launch_dir = (Path(study.storage_path) / launch_id).resolve()
    launch_dir.mkdir(parents=True, exist_ok=True)
    uri = tracking.normalize_store(study.tracking.uri)
    parent = tracking.open_launch(uri, study.experiment, launch_id, str(study.path), spec_text)
    state = LaunchState(launch_id, launch_dir, study.experiment, str(study.path), spec_text, uri, parent, [])
    state.save()
    return state


def write_best(state: LaunchState) -> list[Path]:
    study = state.study()
    summaries = tracking.pair_summaries(state.tracking_uri, state.experiment, state.launch_id, study.metric, study.score)
    out = []
    for pair_name, summary in sorted(summaries.items()):
        if not summary["best_config"]:
            continue
        path = state.dir / "best" / f"{pair_name}.yaml"
        path.parent.mkdir(exist_ok=True)
        header = (f"# Best trial of {pair_name} in launch {state.launch_id}: {study.metric} = {summary['best']:.4f}, "
                  f"test_{study.score}_at_best = {summary['test']}\n# MLflow run {summary['best_run']}. "
                  f"Run it again with: orchestrator train {path}\n")
        path.write_text(header + yaml.safe_dump({"config": summary["best_config"]}, sort_keys=True))
        out.append(path)
    return out
