"""The Tune trainable a Ray worker runs: one trial of the paper's protocol, or a stack of members
at once, each evaluation reported to Tune with a checkpoint of the trial's state and history.

A worker imports this module (Tune names the trainable by it), so it imports what a trial needs
and nothing of the driver's: no report, no MLflow reading, no Tune wiring.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path

import pyarrow.fs
import ray
import torch
from ray import tune
from ray.tune import Checkpoint

from trainables.batched import train_members
from trainables.config import parse_trial_config
from trainables.devices import cpu_kernels, pick_device
from trainables.fields import yaml_word
from trainables.train import train

from ..record.runs import ERROR_TAG, KERNELS_TAG, REPLAY_KEY, member_key
from .failures import FailureLog, error_text
from .search import PAIR_KEY, own_config
from .stacking import MEMBERS_KEY


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
        # the CPU's vector units, which decide how its kernels round (docs/troubleshooting.md#numbers)
        KERNELS_TAG: cpu_kernels(),
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
