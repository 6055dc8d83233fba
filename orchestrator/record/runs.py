"""MLflow's runs: one experiment per search-space file, a parent run per launch, a run per pair
nested under it, and a child run per trial; their tags, and what a trial's Tune result logs.

The store's side only, without Ray (`status` and reports import this alone); the Tune callback
that writes the trial runs from the driver is callbacks.TrialTracker.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import socket
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

from trainables.scores import SCORES

from .state import TrackedLaunch
from .stores import client, store_exists

STATUS_TAG = "trial_status"  # running | completed | early_stopped | diverged | failed | interrupted | lost


DIVERGED_AT_TAG = "diverged_at"  # the iteration by which a diverged run's loss was NaN or infinite


ERROR_TAG = "error"  # a failed run's traceback (its end: MLflow caps a tag's length); error_line reads it


ENDED = ("completed", "diverged", "failed")  # how a run ends on its own: what a cell's seeds came to


CONFIG_TAG = "trial_config"  # the full flat trial config as JSON, what `orchestrator best` writes out


# Task.data_hash: the data a run trained and was tested on, under this key in its trial's results
# (trainables.train.run's reports) and as its run's tag.
DATA_HASH_TAG = "data_hash"
# The CPU's vector units where the trial ran (trainables.devices.cpu_kernels: torch's capability and
# a hash of the CPU's vector flags): CPUs of other vector units round otherwise, and a run grows it
# (docs/troubleshooting.md#numbers)
KERNELS_TAG = "cpu_kernels"


MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch call


# In a restored trial's first result: the evaluations its checkpoint holds, as JSON.
REPLAY_KEY = "replayed_evaluations"


def error_line(traceback: str) -> str:
    """A traceback's last line, which names the error ("RuntimeError: ..."), cut to 300 characters."""
    lines = [line.strip() for line in traceback.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


@functools.lru_cache(maxsize=1)  # one git call per driver, not two per trial
def git_state() -> tuple[str, bool]:
    """(the full commit of this checkout, whether tracked files differ from it); ("", False) outside git."""
    root = Path(__file__).resolve().parents[2]  # the checkout: orchestrator/record/ is two below it
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "", False
    return sha, bool(dirty)


def code_tags() -> dict[str, str]:
    """`code_version` (short commit, -dirty when tracked files changed) and MLflow's own git tag,
    which its UI shows and links. A trial's data hash comes with its first result (DATA_HASH_TAG)."""
    sha, dirty = git_state()
    if not sha:
        return {"code_version": "unknown"}
    return {"code_version": sha[:7] + ("-dirty" if dirty else ""), "mlflow.source.git.commit": sha}


def artifact_root(uri: str, records: Path) -> str | None:
    """Where a new experiment keeps its artifacts (each launch's report): beside a SQLite store
    (`<folder>/mlartifacts`); for a database reached directly (PostgreSQL) beside the launch folders
    (`<records>/mlartifacts`), where MLflow's own default is ./mlruns of whatever folder the
    experiment's first launch ran in; a tracking server's own (`--artifacts-destination`)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).resolve().parent / "mlartifacts").as_uri()
    if urllib.parse.urlsplit(uri).scheme in ("http", "https"):
        return None
    return (records.resolve() / "mlartifacts").as_uri()


def open_launch(launch: TrackedLaunch, spec_file: str, spec_text: str, records: Path) -> str:
    """The launch's parent run: found by its launch_id tag when resuming, else created. Returns its
    id. `records`: the folder of the launch folders (the file's storage_path; see artifact_root)."""
    uri, experiment, launch_id = launch.uri, launch.experiment, launch.launch_id
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    mlflow = client(uri)
    exp = mlflow.get_experiment_by_name(experiment)
    exp_id = (
        exp.experiment_id
        if exp
        else mlflow.create_experiment(experiment, artifact_location=artifact_root(uri, records))
    )
    found = mlflow.search_runs(
        [exp_id], filter_string=f"tags.launch_id = '{launch_id}' and tags.kind = 'launch'"
    )
    if found:
        mlflow.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    run = mlflow.create_run(
        exp_id,
        run_name=launch_id,
        tags={
            "launch_id": launch_id,
            "kind": "launch",
            "spec_file": spec_file,
            **code_tags(),
            "driver_host": socket.gethostname(),
        },
    )
    try:
        mlflow.log_text(run.info.run_id, spec_text, "search_space.yaml")
    except BaseException:
        # An artifact store that cannot be written left a run RUNNING for good, and its retry one
        # without the file: this one goes to MLflow's deleted runs, and the retry makes a whole one.
        with contextlib.suppress(Exception):
            mlflow.delete_run(run.info.run_id)
        raise
    return run.info.run_id


def running_launch_runs(uri: str, experiment: str, driver_host: str) -> list:
    """The launch runs of `experiment` that MLflow shows running and whose driver was on `driver_host`."""
    mlflow = client(uri)
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return list(
        mlflow.search_runs(
            [exp.experiment_id],
            filter_string=f"tags.kind = 'launch' and attributes.status = 'RUNNING' and "
            f"tags.driver_host = '{driver_host}'",
            max_results=1000,
        )
    )


def pair_run(
    mlflow, exp_id: str, parent_run_id: str, launch_id: str, pair: str, tags: dict | None = None
) -> str:
    """The run of `pair` in a launch, nested under the launch's run, and the parent of the pair's
    trial runs (MLflow's table then groups launch > pair > trials): found by its tags, else created."""
    found = mlflow.search_runs(
        [exp_id],
        filter_string=f"tags.launch_id = '{launch_id}' and tags.kind = 'pair' and tags.pair = '{pair}'",
    )
    if found:
        return found[0].info.run_id
    return mlflow.create_run(
        exp_id,
        run_name=pair,
        tags={
            "mlflow.parentRunId": parent_run_id,
            "launch_id": launch_id,
            "kind": "pair",
            "pair": pair,
            **(tags or {}),
            **code_tags(),
        },
    ).info.run_id


def close_launch(
    uri: str, parent_run_id: str, status: str = "FINISHED", launch_status: str = "finished"
) -> None:
    """The launch's run and its pair runs ended with `status`."""
    mlflow = client(uri)
    mlflow.set_tag(parent_run_id, "launch_status", launch_status)
    launch = mlflow.get_run(parent_run_id)
    pairs = mlflow.search_runs(
        [launch.info.experiment_id],
        filter_string=f"tags.launch_id = '{launch.data.tags['launch_id']}' and tags.kind = 'pair'",
    )
    for run_id in [run.info.run_id for run in pairs] + [parent_run_id]:
        mlflow.set_terminated(run_id, status=status)


def end_running_runs(
    mlflow, experiment_id: str, launch_id: str, status_of, skip: set[str] = frozenset()
) -> None:
    """Every trial run of a launch still "running" (its trial not in `skip`) when the launch's
    driver stops: tagged status_of(its trial id) and KILLED."""
    stale = mlflow.search_runs(
        [experiment_id],
        filter_string=f"tags.launch_id = '{launch_id}' and tags.kind = 'trial' and "
        f"tags.{STATUS_TAG} = 'running'",
        max_results=10_000,
    )
    for run in stale:
        trial_id = run.data.tags.get("trial_id")
        if trial_id not in skip:
            mlflow.set_tag(run.info.run_id, STATUS_TAG, status_of(trial_id))
            mlflow.set_terminated(run.info.run_id, status="KILLED")


def interrupt_launch(launch: TrackedLaunch, parent_run_id: str) -> None:
    """The records of a launch whose driver was stopped: its running trial runs interrupted, its
    own run and its pairs' KILLED (resume marks them running again)."""
    mlflow = client(launch.uri)
    end_running_runs(
        mlflow,
        mlflow.get_experiment_by_name(launch.experiment).experiment_id,
        launch.launch_id,
        lambda _: "interrupted",
    )
    close_launch(launch.uri, parent_run_id, status="KILLED", launch_status="interrupted")


def launch_trial_runs(launch: TrackedLaunch) -> list:
    """Every trial run of a launch, all pages, in the order they started: where trials tie on the
    selection metric, the first best in this order answers (the earliest, as Optuna's
    study.best_trial takes the first of its tied trials), whatever order the store returns."""
    mlflow = client(launch.uri)
    exp = mlflow.get_experiment_by_name(launch.experiment)
    if exp is None:
        return []
    runs, token = [], None
    while True:
        page = mlflow.search_runs(
            [exp.experiment_id],
            filter_string=f"tags.launch_id = '{launch.launch_id}' and tags.kind = 'trial'",
            max_results=1000,
            order_by=["attributes.start_time ASC", "attributes.run_id ASC"],
            page_token=token,
        )
        runs += list(page)
        token = page.token
        if not token:
            return runs


def step_rates(uri: str, limit: int = 5000) -> list[dict]:
    """The training steps/s of the store's latest `limit` trial runs, each with its model, task and
    device kind (cpu, cuda): what a dry run without calibration estimates from. A stacked run's is
    its share of the stack's member-steps/s (the stack's steps/s, which each member logs, times its
    members), the cost of one run whether or not it stacks. A read only: a store that does not
    exist yet, or has no tables yet, stays so."""
    if not store_exists(uri):
        return []
    mlflow = client(uri)
    experiments = [e.experiment_id for e in mlflow.search_experiments()]
    if not experiments:
        return []
    runs = mlflow.search_runs(
        experiments,
        filter_string="tags.kind = 'trial' and metrics.steps_per_s > 0",
        order_by=["attributes.start_time DESC"],
        max_results=limit,
    )
    members: dict[str, int] = {}
    for r in runs:
        if "member" in r.data.tags:
            members[r.data.tags.get("trial_id", "")] = members.get(r.data.tags.get("trial_id", ""), 0) + 1
    return [
        {
            "model": r.data.tags.get("model"),
            "task": r.data.tags.get("task"),
            "device": r.data.tags.get("device", "").split(":")[0],
            "rate": r.data.metrics["steps_per_s"]
            * (members[r.data.tags.get("trial_id", "")] if "member" in r.data.tags else 1),
        }
        for r in runs
    ]


def member_key(member: int, key: str) -> str:
    """Where a trial of stacked members puts one member's metric in its Tune result."""
    return f"member{member}/{key}"


def member_result(result: dict[str, Any], member: int | None) -> dict[str, Any]:
    """One member's result within a trial's: its own `member<k>/` keys over the trial's shared ones
    (node, device, Tune's bookkeeping); a trial of one run's result as it is. A key that members
    report themselves is no shared one: the trial's value of it is the stack's (its best member's
    score, for ASHA), and a member that diverged before its first evaluation has no score, not that."""
    if member is None:
        return result
    prefix = member_key(member, "")
    per_member = {k: k.split("/", 1) for k in result if re.match(r"member\d+/", k)}
    members_own = {key for _, key in per_member.values()}
    return {
        **{k: v for k, v in result.items() if k not in per_member and k not in members_own},
        **{k[len(prefix) :]: v for k, v in result.items() if k.startswith(prefix)},
    }


# Every score of every task kind (a metric is "<split>_<score>" or ends in a checkpoint's suffix).
METRIC_SUFFIXES = (*(f"_{score}" for score in SCORES), "_at_best", "_final", "_early")


def numeric_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The training protocol's metrics in a Tune result (Tune adds bookkeeping keys we leave out)."""
    return {
        k: float(v)
        for k, v in result.items()
        if isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and (
            k.endswith(METRIC_SUFFIXES)
            or k in ("loss", "best_iteration", "steps_per_s", "gpu_memory_mib", "time_total_s")
        )
    }
