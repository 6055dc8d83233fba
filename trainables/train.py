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

import copy
import functools
import gc
import math
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from tqdm import tqdm

from .config import ConfigError, TrainConfig
from .graphs import GraphedStep, bucket_widths, graphs_unused_because, module_weights, pick_width
from .kinds import Kind
from .models import build_model
from .models.dropout import rates_in_tensors
from .scores import LOWER_IS_BETTER
from .tasks import load_task
from .tasks.base import HOST_ONLY, Split, Task

# report(metrics, state): called after every evaluation; `state()` returns a resumable snapshot.
Reporter = Callable[[dict[str, Any], Callable[[], dict]], None]
# The same for each member of a run at once (run, batched.train_members), and `compiled`: whether
# its step still runs compiled (a stack's compile: auto falls back).
MembersReporter = Callable[[list[dict[str, Any]], Callable[[], dict], bool], None]


def pick_device(name: str) -> torch.device:
    """`name`'s device; ConfigError where torch here has none such (a GPU launch's best config re-run
    on a laptop, a trial on a node without CUDA), before torch fails somewhere inside the trial."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(
            f"device: {name}, but torch finds {torch.cuda.device_count()} CUDA device(s) here "
            "(device=auto trains on what there is)"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"device: {name}, but torch finds no MPS device here (device=auto trains on what there is)"
        )
    return device


def where(cfg: TrainConfig, device: torch.device) -> str:
    """The device and how a settled config runs on it, for a trial's first log line: its compile
    and bf16 may have been decided by `auto`, which the recorded parameters keep."""
    return str(device) + "".join(
        f", {word}" for word, on in (("compiled", cfg.compile), ("bf16 autocast", cfg.bf16)) if on
    )


def setup_device(cfg: TrainConfig) -> torch.device:
    """The trial's device, with its CPU threads and, on CUDA, its matmul precision (`tf32`) set."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cfg.tf32
    return device


def resident(split: Split, device: torch.device) -> dict[str, torch.Tensor]:
    """The split's arrays on `device`, in their stored (narrow) dtypes, made once per split and
    device: every later batch is gathered where the model runs, with no copy of data from the host.
    On the CPU they share the arrays' memory."""
    cache = split.__dict__.setdefault("_resident", {})
    if device not in cache:
        cache[device] = {
            name: torch.from_numpy(array).to(device)
            for name, array in split.arrays.items()
            if name not in HOST_ONLY
        }
    return cache[device]


def batch_tensors(
    split: Split, index: np.ndarray, device: torch.device, bucketed: bool = False
) -> dict[str, torch.Tensor]:
    """The arrays of `split` at `index` as tensors on `device` (int64 or float32), token rows
    trimmed to the batch's longest, or with `bucketed` padded up to the first of a few fixed widths
    that holds it (graphs.bucket_widths: a CUDA graph replays fixed shapes; the pad is the pad
    token the models mask). The width comes from the host's copy of the lengths, so nothing waits
    for the device. Images (one per several questions) are gathered through the questions'
    `image_ids` and stay uint8, a quarter of float32's traffic: the model scales them."""
    widths = {"tokens": "lengths", "token_features": "lengths", "targets": "target_lengths"}
    rows = torch.from_numpy(np.asarray(index, dtype=np.int64)).to(device, non_blocking=True)
    arrays = resident(split, device)
    out = {}
    for name, tensor in arrays.items():
        if name == "images":
            continue
        batch = tensor[rows]
        if name in widths and widths[name] in split.arrays:
            width = int(split.arrays[widths[name]][index].max())
            batch = batch[:, : pick_width(width, bucket_widths(tensor.shape[1])) if bucketed else width]
        out[name] = batch.float() if batch.is_floating_point() else batch.long()
    if "images" in arrays:
        out["images"] = arrays["images"][out["image_ids"]]
    return out


def ratios(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """Each score's sum over its count; perplexity is e to its ratio, the mean negative log-likelihood."""
    out = {name: float(total[0] / total[1]) if total[1] else math.nan for name, total in sums.items()}
    if "perplexity" in out:
        out["perplexity"] = math.exp(min(out["perplexity"], 700.0))  # a diverged model's, finite
    return out


def add_sums(into: dict[str, torch.Tensor], more: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: into.get(name, 0) + value for name, value in more.items()}


class LengthBuckets:
    """The authors' length-bucketed batches: each pass over the data shuffles it, drops the remainder
    of a batch, stable-sorts by input length, cuts consecutive batches and serves them in random
    order. Batches need little padding, and short ones run fast. Resumable from `state()`."""

    def __init__(self, lengths: np.ndarray, batch_size: int, rng: np.random.Generator):
        self.lengths, self.batch_size, self.rng = lengths, batch_size, rng
        self.epoch_start, self.batches, self.position = None, [], 0

    def new_epoch(self) -> None:
        self.epoch_start = self.rng.bit_generator.state
        order = self.rng.permutation(len(self.lengths))
        width = min(self.batch_size, len(order))
        order = order[: len(order) - len(order) % width]
        order = order[np.argsort(self.lengths[order], kind="stable")]
        batches = order.reshape(-1, width)
        self.batches, self.position = batches[self.rng.permutation(len(batches))], 0

    def __call__(self) -> np.ndarray:
        if self.position >= len(self.batches):
            self.new_epoch()
        self.position += 1
        return self.batches[self.position - 1]

    def state(self) -> dict:
        return {"epoch_start": self.epoch_start, "position": self.position}

    def restore(self, state: dict) -> None:
        if state["epoch_start"] is not None:
            self.rng.bit_generator.state = state["epoch_start"]
            self.new_epoch()
            self.position = state["position"]


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


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """`saved` into `optimizer`, as this run steps: a checkpoint keeps the `capturable` its run had
    (torch's load_state_dict restores it with the rest of each group), and a step graphed with a
    checkpoint's False, or eager on a CPU with a graphed run's True, fails at its first update."""
    groups = [
        {**group, "capturable": now["capturable"]} if "capturable" in now else group
        for group, now in zip(saved["param_groups"], optimizer.param_groups)
    ]
    optimizer.load_state_dict({**saved, "param_groups": groups})


def make_model(cfg: TrainConfig, task: Task) -> torch.nn.Module:
    return build_model(cfg.model, cfg.model_options, task)


_compiles_allowed = 0


def room_for_compiles(n: int) -> None:
    """Room in torch's recompile limits for `n` more compiles in this process. torch counts the
    compiles of each function (8 at most by default), and every trial of a model compiles the same
    function again for its own sizes; Tune hands one process trial after trial (reuse_actors). Past
    the limit torch runs the function uncompiled with one log line: on 2026-11-28 a process's third
    compiled stack of another size did, and its fifth compiled single trial."""
    global _compiles_allowed
    from torch._dynamo import config  # noqa: PLC0415 - importing it takes a second; compiled runs only

    _compiles_allowed += n
    config.recompile_limit = max(config.recompile_limit, _compiles_allowed)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, _compiles_allowed)


def compile_model(cfg: TrainConfig, model: torch.nn.Module) -> None:
    """`model` compiled in place (its state dict keeps its keys, so checkpoints load either way)."""
    rates_in_tensors(model)
    room_for_compiles(4)  # training and evaluation, each at its first width, then at symbolic widths
    model.compile(mode=cfg.compile_mode)


def make_optimizer(cfg: TrainConfig, parameters, capturable: bool = False) -> torch.optim.Optimizer:
    """`capturable`: its step count on the device, as a CUDA graph's capture needs (graphs.py)."""
    if cfg.optimizer == "rmsprop":  # the PANM authors' choice
        return torch.optim.RMSprop(
            parameters,
            lr=cfg.lr,
            alpha=cfg.rmsprop_alpha,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
            capturable=capturable,
        )
    if cfg.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=cfg.lr, weight_decay=cfg.weight_decay, capturable=capturable)
    return torch.optim.AdamW(parameters, lr=cfg.lr, weight_decay=cfg.weight_decay, capturable=capturable)


def lr_factor(cfg: TrainConfig, iteration: int) -> float:
    """The share of `cfg.lr` that step `iteration` (1-based) takes under `cfg.lr_schedule`."""
    if cfg.lr_schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * (iteration - 1) / cfg.n_iters))
    return 1.0


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_gradients(cfg: TrainConfig, parameters) -> None:
    if not cfg.grad_clip:
        return
    if cfg.grad_clip_by == "value":  # each gradient entry into [-c, c], as the PANM authors' code
        torch.nn.utils.clip_grad_value_(parameters, cfg.grad_clip)
    else:
        torch.nn.utils.clip_grad_norm_(parameters, cfg.grad_clip)


def forward_loss(
    cfg: TrainConfig,
    model: torch.nn.Module,
    kind: Kind,
    batch: dict[str, torch.Tensor],
    device: torch.device,
    graphed: bool = False,
):
    """-> (the model's output, the training loss) on one batch. `graphed`: inside a CUDA graph's
    capture, where autocast must not cache its casts (they would be freed under the graph)."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16, cache_enabled=not graphed):
        out = kind.predict(model, batch)
    loss = kind.loss(out, batch)
    if getattr(model, "aux_loss", None) is not None:  # e.g. ACT's ponder cost
        loss = loss + model.aux_loss
    return out, loss


def step_function(
    cfg: TrainConfig, model: torch.nn.Module, task: Task, device: torch.device
) -> tuple[Callable, torch.optim.Optimizer, bool]:
    """-> (step(batch) -> (the batch's loss, its score sums), the optimizer, whether batches must be
    bucketed). One training step: forward, loss, backward, clipping, the optimizer's update and
    the score sums, eager or, on CUDA where the model allows, replayed from a CUDA graph (graphs.py)."""
    graphed = graphs_unused_because(cfg, device) is None
    optimizer = make_optimizer(cfg, model.parameters(), capturable=graphed and device.type == "cuda")

    def step(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out, loss = forward_loss(cfg, model, task.kind, batch, device, graphed)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_gradients(cfg, model.parameters())
        optimizer.step()
        return loss.detach().float(), task.kind.score_sums(out.detach(), batch)

    if graphed:
        return (
            GraphedStep(step, module_weights(model), optimizer, eager_replay=device.type != "cuda"),
            optimizer,
            True,
        )
    return step, optimizer, False


def batch_source(cfg: TrainConfig, task: Task, rng: np.random.Generator):
    """-> (next batch's Split and row indices, bucket sampler or None). Online tasks draw a fresh
    batch from `rng`, so the data follow the training seed and resume with the rng's state."""
    if task.draw_train is not None:
        if cfg.length_bucketed:
            raise ConfigError(
                f"length_bucketed: task {cfg.task!r} draws a fresh batch every step (task_options.online); "
                "there is no training set to bucket"
            )
        whole = np.arange(cfg.batch_size)
        return (lambda: (task.draw_train(rng, cfg.batch_size), whole)), None
    split = task.splits["train"]
    if cfg.length_bucketed:
        if "lengths" not in split.arrays:
            raise ConfigError(f"length_bucketed: task {cfg.task!r} has no input lengths to bucket by")
        buckets = LengthBuckets(split.lengths, cfg.batch_size, rng)
        return (lambda: (split, buckets())), buckets
    return (lambda: (split, rng.integers(len(split), size=cfg.batch_size))), None


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


def free_what_finished_trials_left(device: torch.device) -> None:
    """Frees what finished trials left in this process (Tune hands one process trial after trial),
    and on CUDA counts gpu_memory_mib from here. A stack is garbage in a reference cycle (its step
    refers to it), which only Python's occasional full collection frees: its weights, optimizer
    state and CUDA graphs stayed allocated into the next trial. And the allocator keeps freed
    blocks reserved, which the next trial's gpu_memory_mib (peak reserved) counted as its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def random_states(device: torch.device) -> dict:
    """What a checkpoint keeps of torch's generators: the CPU's, and on CUDA the device's, which
    dropout there draws from (without it a resumed trial drew its first steps' masks again)."""
    return {
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def restore_random_states(saved: dict, device: torch.device) -> None:
    """`saved`'s generators; a checkpoint from another kind of device (or from before the CUDA one
    was kept) leaves the device's as the trial's seed set it."""
    torch.set_rng_state(saved["torch_rng"])
    if device.type == "cuda" and saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(saved["cuda_rng"], device)


class Learner(Protocol):
    """What the protocol (`run`) trains: a lone trial (Single) or N members at once (batched.Stack).
    Per member: its config, label, batch generator and length buckets (None: no bucketing)."""

    cfg: TrainConfig
    device: torch.device
    task: Task
    configs: list[TrainConfig]
    labels: list[str]
    rngs: list[np.random.Generator]
    buckets: list[LengthBuckets | None]
    log: Callable[[str], None] | None  # `run` sets it: its lines go through its progress bar

    @property
    def compiled(self) -> bool:
        """Whether its step still runs compiled (a stack's compile: auto falls back)."""

    def step(self) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """One training step of every member on its next batch: -> (each member's loss, each
        member's score sums)."""

    def schedule(self, factor: float) -> None:
        """Every member's learning rate at `factor` of its own (lr_factor)."""

    def member_model(self, k: int) -> torch.nn.Module:
        """Member k's model, for evaluation."""

    def weights(self) -> dict:
        """The weights and optimizer state a checkpoint keeps."""

    def load_weights(self, saved: dict) -> None:
        """What `weights` returned, back in place."""

    def pack(self, common: dict, members: list[dict]) -> dict:
        """A checkpoint of `common` state and each member's."""

    def unpack(self, saved: dict) -> list[dict]:
        """Each member's state in a checkpoint `pack` made."""


class Single:
    """One model and its optimizer: what `train` runs through the protocol (`run`), as a stack of
    one member (a Learner, as batched.Stack is for N members trained at once)."""

    def __init__(self, cfg: TrainConfig, device: torch.device, log: Callable[[str], None] | None = None):
        cfg = cfg.settled(device.type)
        torch.manual_seed(cfg.seed)
        self.cfg, self.device, self.configs, self.labels = cfg, device, [cfg], [f"{cfg.task}/{cfg.model}"]
        self.log = log
        self.rngs = [np.random.default_rng(cfg.seed)]
        if log:
            log(
                f"[{self.labels[0]}] data: loading {cfg.task}, or generating it once into the cache "
                "(this can take minutes)"
            )
        self.task = load_task(cfg.task, cfg.task_options)
        self.next_batch, buckets = batch_source(cfg, self.task, self.rngs[0])
        self.buckets = [buckets]
        self.model = make_model(cfg, self.task).to(device)
        if cfg.compile:
            compile_model(cfg, self.model)
        if log:
            log(
                f"[{self.labels[0]}] model: {sum(p.numel() for p in self.model.parameters()):,} parameters "
                f"on {where(cfg, device)}; {cfg.n_iters:,} iterations, evaluating every {cfg.eval_every:,}"
            )
        self.run, self.optimizer, self.bucketed = step_function(cfg, self.model, self.task, device)
        self.compiled = True  # a lone trial's compile never falls back (batched.Stack's may)
        self.model.train()

    def step(self) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """One training step on the next batch: -> (the loss, as one member's, its score sums)."""
        split, index = self.next_batch()
        loss, sums = self.run(batch_tensors(split, index, self.device, self.bucketed))
        return loss.reshape(1), [sums]

    def schedule(self, factor: float) -> None:
        set_lr(self.optimizer, self.cfg.lr * factor)

    def member_model(self, k: int) -> torch.nn.Module:
        return self.model

    def weights(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_weights(self, saved: dict) -> None:
        self.model.load_state_dict(saved["model"])
        load_optimizer_state(self.optimizer, saved["optimizer"])

    @staticmethod
    def pack(common: dict, members: list[dict]) -> dict:
        """A checkpoint: a lone trial's member state sits beside the rest."""
        return {**common, **members[0]}

    @staticmethod
    def unpack(saved: dict) -> list[dict]:
        return [saved]


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


def snapshot(learner: Learner, selections: list[Selection], iteration: int) -> dict:
    """A resumable checkpoint of the run at `iteration` (resume reads it)."""
    members = [
        {
            "batch_rng": rng.bit_generator.state,
            **selection.state(),
            "buckets": buckets.state() if buckets else None,
        }
        for rng, buckets, selection in zip(learner.rngs, learner.buckets, selections)
    ]
    common = {**learner.weights(), "iteration": iteration, **random_states(learner.device)}
    # Deep copy: state_dict() holds live tensors that the next optimizer step overwrites.
    return copy.deepcopy(learner.pack(common, members))


def resume(learner: Learner, selections: list[Selection], saved: dict) -> int:
    """`learner` and `selections` as `saved` left them; -> the iteration it was taken at."""
    learner.load_weights(saved)
    restore_random_states(saved, learner.device)
    for rng, buckets, selection, member in zip(
        learner.rngs, learner.buckets, selections, learner.unpack(saved)
    ):
        rng.bit_generator.state = member["batch_rng"]
        selection.restore(member)
        if buckets:
            buckets.restore(member["buckets"])
    return saved["iteration"]


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


def training_step(cfg: TrainConfig) -> tuple[Callable[[], None], torch.device]:
    """-> (one training step of `cfg` as `train` takes it, on fresh data each call; its device), with
    the task loaded and the model built: what a benchmark or the cost estimate times. The task's
    data are generated (or read from the cache) as for training: pass small sizes."""
    device = setup_device(cfg)
    return Single(cfg, device).step, device


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: a timer read before it would time the host's queueing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_step(
    cfg: TrainConfig, steps: int = 3, before_timing: Callable[[], None] | None = None
) -> float:
    """Seconds per training step of `cfg` on this machine (step_seconds), evaluations left out: what
    `launch --dry-run` turns into a cost estimate. `before_timing` runs between the warm-up and the
    timing (a benchmark's barrier)."""
    step, device = training_step(cfg)
    return step_seconds(step, device, steps, before_timing)


def step_seconds(
    step: Callable[[], Any],
    device: torch.device,
    steps: int,
    before_timing: Callable[[], None] | None = None,
) -> float:
    """The median seconds of `steps` calls of `step`, each timed to its device's end, after one
    warm-up call. A median, so that one step slowed by other work on a shared machine does not
    move the estimate."""
    step()
    synchronize(device)
    if before_timing:
        before_timing()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
