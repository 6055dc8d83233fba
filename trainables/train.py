"""The papers' training protocol, framework-free, for every task kind.

An optimizer (AdamW by default; RMSprop for PANM's tasks) with gradient clipping (by norm or by
value) for a fixed number of iterations, on batches drawn from a fixed training set or, for tasks
that generate online, drawn fresh every step from the training seed's generator; every `eval_every`
iterations the model is evaluated on the IID and OOD validation sets; the checkpoint with the best
OOD validation score is the one whose test score is reported (NDR App. C.3), the latest among equal
scores (the authors' `cross_validate_stats.py`). The final iteration's scores are reported too
(`*_final`: the paper's IID columns and Table 4), and, with `early_budget`, the best checkpoint
within the first `early_budget` iterations (`*_early`: Table 2's 50K column). Scores are those of
the task's kind (kinds.py); the first selects checkpoints. Ray and MLflow attach through the
`report` callback, never by import.

One protocol (`run`) trains a lone trial (`Single`) and a stack of members (batched.Stack) alike.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from tqdm import tqdm

from .checkpoints import resume, snapshot
from .config import TrainConfig
from .devices import free_what_finished_trials_left, setup_device
from .evaluation import Selection, add_sums, ratios
from .learners import Learner, Single
from .steps import lr_factor

# report(metrics, state): called after every evaluation; `state()` returns a resumable snapshot.
Reporter = Callable[[dict[str, Any], Callable[[], dict]], None]
# The same for each member of a run at once (run, batched.train_members), and `compiled`: whether
# its step still runs compiled (a stack's compile: auto falls back).
MembersReporter = Callable[[list[dict[str, Any]], Callable[[], dict], bool], None]


def train(
    cfg: TrainConfig,
    report: Reporter | None = None,
    resume_state: dict | None = None,
    log: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """Train one trial; returns the final metrics, with status "completed" or "diverged", and the
    hash of the data it trained and was tested on (`data_hash`)."""
    device = setup_device(cfg)
    free_what_finished_trials_left(device)
    members_report = (lambda metrics, snapshot, compiled: report(metrics[0], snapshot)) if report else None
    return run(Single(cfg, device, log), members_report, resume_state, log)[0]


def run(
    learner: Learner,
    report: MembersReporter | None = None,
    resume_state: dict | None = None,
    log: Callable[[str], None] | None = print,
) -> list[dict[str, Any]]:
    """The protocol, once for a lone trial (Single) and a stack (batched.Stack): resume, the
    evaluation window, each member's Selection, snapshots and the diverged check. -> each member's
    final metrics. A member that diverged keeps its last metrics while the others train on, as its
    own run would have stopped; the run stops when every member has."""
    cfg, device = learner.cfg, learner.device
    # A bar with an ETA on a terminal; elsewhere (cron, CI, Ray workers) only the plain evaluation lines.
    bar = tqdm(total=cfg.n_iters, unit="it", disable=not (log and sys.stderr.isatty()), dynamic_ncols=True)
    say = learner.log = log and (bar.write if not bar.disable else log)
    labelled = zip(learner.configs, learner.labels)
    selections = [Selection(c, learner.task, device, say, label) for c, label in labelled]
    start = resume(learner, selections, resume_state) if resume_state else 0
    bar.update(start)

    def reported(iteration: int) -> list[dict[str, Any]]:
        metrics = finals(learner, selections)
        if report:
            report(metrics, functools.partial(snapshot, learner, selections, iteration), learner.compiled)
        return metrics

    if all(selection.ended(start) for selection in selections):
        # Restored from the checkpoint the run ended at: it reports that evaluation again, as its
        # driver may have died before logging it (the tracker logs an evaluation once).
        bar.close()
        return reported(start)
    # The losses and training scores are summed on the device and read once per evaluation: a step
    # never waits for the host (on a GPU, a read per step stalls the queue of small kernels).
    window = Window(len(selections), device)
    for iteration in range(start + 1, cfg.n_iters + 1):
        if cfg.lr_schedule != "constant":
            learner.schedule(lr_factor(cfg, iteration))
        window.add(*learner.step())
        bar.update()
        if iteration % cfg.eval_every == 0 or iteration == cfg.n_iters:
            evaluate_members(learner, selections, iteration, window)
            reported(iteration)
            if all(selection.diverged for selection in selections):
                break
            window = Window(len(selections), device)
    bar.close()
    return finals(learner, selections)


def finals(learner: Learner, selections: list[Selection]) -> list[dict[str, Any]]:
    """Each member's metrics so far, with the hash of the data it trains and is tested on (its run's
    data_hash tag)."""
    return [{**selection.metrics, "data_hash": learner.task.data_hash} for selection in selections]


def evaluate_members(learner: Learner, selections: list[Selection], iteration: int, window: Window) -> None:
    """Each member's evaluation at `iteration`, but a diverged member's: it keeps its last metrics."""
    mean_losses, train_scores, rate = (
        window.close()
    )  # waits for its last step: the rate times the device's work
    for k, selection in enumerate(selections):
        if not selection.diverged:
            selection(learner.member_model(k), iteration, mean_losses[k], train_scores[k], rate)


class Window:
    """The members' training losses and score sums since the last evaluation, on the device."""

    def __init__(self, members: int, device: torch.device):
        self.losses, self.sums, self.steps = (
            torch.zeros(members, device=device),
            [{} for _ in range(members)],
            0,
        )
        self.since = time.perf_counter()

    def add(self, losses: torch.Tensor, sums: list[dict[str, torch.Tensor]]) -> None:
        self.losses = self.losses + losses
        self.sums = [add_sums(into, more) for into, more in zip(self.sums, sums)]
        self.steps += 1

    def close(self) -> tuple[list[float], list[dict[str, float]], float]:
        """-> (each member's mean loss, its training scores, steps/s over the window)."""
        mean_losses = [total / self.steps for total in self.losses.tolist()]
        rate = self.steps / max(time.perf_counter() - self.since, 1e-9)
        return mean_losses, [ratios(sums) for sums in self.sums], rate
