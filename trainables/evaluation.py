"""Scores and checkpoint selection: a split's scores (`evaluate`), and one seed's evaluations
(`Selection`): the best OOD validation checkpoint, the early-budget one, per-depth bests, and
the test scores at them and at the final one."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .batches import batch_tensors
from .config import TrainConfig
from .scores import LOWER_IS_BETTER
from .tasks.base import Split, Task


def ratios(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """Each score's sum over its count; perplexity is e to its ratio, the mean negative log-likelihood."""
    out = {name: float(total[0] / total[1]) if total[1] else math.nan for name, total in sums.items()}
    if "perplexity" in out:
        out["perplexity"] = math.exp(min(out["perplexity"], 700.0))  # a diverged model's, finite
    return out


def add_sums(into: dict[str, torch.Tensor], more: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: into.get(name, 0) + value for name, value in more.items()}


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    task: Task,
    split: Split,
    batch_size: int,
    device: torch.device,
    bf16: bool = False,
    by_depth: bool = False,
) -> dict[str, float]:
    """Every score of the task on one split; with `by_depth`, for a classification task, also the
    accuracy at each depth of the split (`depth<d>_acc`: the generalization curve over depths)."""
    was_training = model.training
    model.eval()
    sums: dict[str, torch.Tensor] = {}
    correct_by_depth: dict[int, list[int]] = {}
    # In length order, so that each batch is trimmed to little padding; scores are sums.
    order = np.argsort(split.lengths, kind="stable") if "lengths" in split.arrays else np.arange(len(split))
    for start in range(0, len(split), batch_size):
        rows = order[start : start + batch_size]
        batch = batch_tensors(split, rows, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = task.kind.predict(model, batch)
        sums = add_sums(sums, task.kind.score_sums(out, batch))
        if by_depth and task.kind.per_depth:
            for depth, right in zip(split.depths[rows].tolist(), task.kind.correct(out, batch).tolist()):
                correct_by_depth.setdefault(int(depth), []).append(right)
    model.train(was_training)
    return {
        **ratios(sums),
        **{f"depth{d}_acc": float(np.mean(v)) for d, v in sorted(correct_by_depth.items())},
    }


class Selection:
    """One seed's evaluations: checkpoint selection on OOD validation (best, and best within
    `early_budget`), the test scores at those checkpoints and at the final one, and the metrics of
    each evaluation. `train` keeps one; `batched.train_members` one per member."""

    def __init__(
        self,
        cfg: TrainConfig,
        task: Task,
        device: torch.device,
        log: Callable[[str], None] | None,
        label: str,
    ):
        self.cfg, self.task, self.device, self.log, self.label = cfg, task, device, log, label
        m = self.m = task.metric
        self.at_least_as_good = (lambda a, b: a <= b) if m in LOWER_IS_BETTER else (lambda a, b: a >= b)
        worst = math.inf if m in LOWER_IS_BETTER else -1.0
        self.best: dict[str, Any] = {f"best_ood_valid_{m}": worst, "best_iteration": 0}
        self.early: dict[str, Any] = {f"best_ood_valid_{m}_early": worst, "best_iteration_early": 0}
        self.metrics: dict[str, Any] = {"status": "completed", **self.best}
        # Per depth (a question type), where the task selects so: its best validation accuracy and
        # the test accuracy then (`test_depth<d>_acc_at_best` over the pooled best's).
        self.per_depth, self.depth_best = task.kind.selected_per_depth, {}

    def state(self) -> dict:
        # The last evaluation's metrics: a stack trains on past a member that diverged, and its resume
        # must not train that member again; a trial restored from the checkpoint it ended at reports
        # them again.
        return {"best": self.best, "early": self.early, "depth_best": self.depth_best, "last": self.metrics}

    def restore(self, state: dict) -> None:
        self.best, self.early, self.depth_best = (
            state["best"],
            state.get("early", self.early),
            state.get("depth_best", {}),
        )
        # (A checkpoint from before "last" was kept holds "diverged", the metrics of a diverged member.)
        self.metrics = state.get("last") or state.get("diverged") or {"status": "completed", **self.best}

    def ended(self, iteration: int) -> bool:
        """Whether a run restored at `iteration` has nothing left to train: it diverged, or its
        checkpoint is its last evaluation's."""
        return self.diverged or iteration >= self.cfg.n_iters

    @property
    def diverged(self) -> bool:
        return self.metrics["status"] == "diverged"

    def best_so_far(self) -> dict[str, Any]:
        """The best checkpoints' scores: none before an evaluation made one (the starting worst, -1
        accuracy, is no score), nor an early one where no evaluation came within `early_budget`."""
        early = self.early if self.cfg.early_budget and self.early["best_iteration_early"] else {}
        return {**self.best, **self.depth_best, **early} if self.best["best_iteration"] else {}

    def evaluate_split(self, model: torch.nn.Module, name: str, by_depth: bool = False) -> dict[str, float]:
        return evaluate(
            model,
            self.task,
            self.task.splits[name],
            self.cfg.eval_batch_size,
            self.device,
            self.cfg.bf16,
            by_depth,
        )

    def test_scores(self, tests: dict[str, dict[str, float]], suffix: str) -> dict[str, float]:
        """Each score's mean over the test splits (PANM's Table 1 averages its five test lengths),
        where there are several each split's own, and a classification task's accuracy per depth
        (`test_depth<d>_acc`)."""
        scores = self.task.scores
        out = {f"test_{s}{suffix}": float(np.mean([t[s] for t in tests.values()])) for s in scores}
        for name, split_scores in tests.items():
            out.update(
                named(
                    name, {k: v for k, v in split_scores.items() if len(tests) > 1 or k not in scores}, suffix
                )
            )
        return out

    def __call__(
        self,
        model: torch.nn.Module,
        iteration: int,
        mean_loss: float,
        train_scores: dict[str, float],
        steps_per_s: float,
    ) -> dict:
        """The metrics of the evaluation at `iteration`, given the mean training loss and scores since
        the last one; status "diverged" (and no evaluation) where that loss is not finite."""
        if not math.isfinite(mean_loss):
            return self.diverge(iteration, mean_loss)
        final = iteration == self.cfg.n_iters
        iid, ood, tests = self.select(model, iteration, final)
        metrics = {
            "status": "completed" if final else "running",
            "iteration": iteration,
            "loss": mean_loss,
            **named("train", train_scores),
            **named("iid_valid", iid),
            **named("ood_valid", ood),
            **self.best_so_far(),
            "steps_per_s": steps_per_s,
        }
        if self.device.type == "cuda":
            # The most this process's allocator held since the trial began (its cache included; the
            # CUDA context's few hundred MiB not), a stack's for each of its members: what a trial
            # needs of a GPU it shares (resources.gpu) is read off it.
            metrics["gpu_memory_mib"] = torch.cuda.max_memory_reserved(self.device) / 2**20
        if final:  # the NDR paper's IID columns and Table 4, and the CA paper's numbers, are final values
            metrics.update(named("iid_valid", iid, "_final"))
            metrics.update(named("ood_valid", ood, "_final"))
            metrics.update(self.test_scores(tests, "_final"))
        if self.log:
            m, test = self.m, self.best.get(f"test_{self.m}_at_best", math.nan)
            self.log(
                f"[{self.label}] it {iteration}/{self.cfg.n_iters} loss {mean_loss:.4f} "
                f"train {metrics[f'train_{m}']:.3f} iid {iid[m]:.3f} ood {ood[m]:.3f} test@best {test:.3f} "
                f"({steps_per_s:.1f} it/s)"
            )
        self.metrics = metrics
        return metrics

    def diverge(self, iteration: int, mean_loss: float) -> dict:
        """A NaN/inf loss since the last evaluation: training on only produces garbage; stop with the
        best so far. The last evaluation's scores are not this iteration's; and a run diverged before
        its first has no best: NaN, which Tune needs as its metric and MLflow leaves out."""
        self.metrics = {
            "status": "diverged",
            "iteration": iteration,
            "loss": mean_loss,
            **(self.best_so_far() or {f"best_ood_valid_{self.m}": math.nan}),
        }
        if self.log:
            self.log(
                f"[{self.label}] loss became {mean_loss} by iteration {iteration}: stopping (status diverged)"
            )
        return self.metrics

    def select(self, model: torch.nn.Module, iteration: int, final: bool) -> tuple[dict, dict, dict]:
        """Validation scores, and the test scores where a checkpoint is kept (a new best, early best
        or per-depth best, or the final one): -> (iid, ood, tests); the kept checkpoints updated."""
        m, cfg = self.m, self.cfg
        iid = self.evaluate_split(model, "iid_valid", by_depth=self.per_depth)
        # Tasks without an OOD validation set fill both slots with their IID hold-out: score it once.
        same = self.task.splits["ood_valid"] is self.task.splits["iid_valid"]
        ood = iid if same else self.evaluate_split(model, "ood_valid", self.per_depth)
        # Ties go to the later checkpoint, as in the authors' selection: once OOD validation
        # saturates (NDR on CTL), the most-trained model is the one reported.
        new_best = self.at_least_as_good(ood[m], self.best[f"best_ood_valid_{m}"])
        new_early = (
            bool(cfg.early_budget)
            and iteration <= cfg.early_budget
            and self.at_least_as_good(ood[m], self.early[f"best_ood_valid_{m}_early"])
        )
        # Strictly better, as the Sort-of-CLEVR authors' per-type selection: ties keep the earlier epoch.
        depths_improved = [
            k
            for k in ood
            if self.per_depth
            and re.fullmatch(r"depth\d+_acc", k)
            and ood[k] > self.depth_best.get(f"best_ood_valid_{k}", -1.0)
        ]
        kept = new_best or new_early or final or depths_improved
        tests = (
            {name: self.evaluate_split(model, name, by_depth=True) for name in self.task.test_splits}
            if kept
            else {}
        )
        for k in depths_improved:
            self.depth_best[f"best_ood_valid_{k}"] = ood[k]
            self.depth_best[f"best_iteration_{k}"] = iteration
            self.depth_best[f"test_{k}_at_best"] = self.test_scores(tests, "_at_best")[f"test_{k}_at_best"]
        if new_best:
            best = {
                f"best_ood_valid_{m}": ood[m],
                f"iid_valid_{m}_at_best": iid[m],
                "best_iteration": iteration,
            }
            self.best = {**best, **self.test_scores(tests, "_at_best")}
        if new_early:
            early = {f"best_ood_valid_{m}_early": ood[m], "best_iteration_early": iteration}
            self.early = {**early, **self.test_scores(tests, "_at_best_early")}
        return iid, ood, tests


def named(prefix: str, scores: dict[str, float], suffix: str = "") -> dict[str, float]:
    return {f"{prefix}_{s}{suffix}": v for s, v in scores.items()}
