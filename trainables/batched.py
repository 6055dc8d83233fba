"""N members of one configuration trained as one model: their parameters stacked along a new first
dimension (torch.func.stack_module_state) and every step one vmapped forward and backward
(torch.func.vmap over functional_call). On a GPU, where one small model cannot fill the device,
this runs N members in little more than the time of one.

A member is a seed, and may have its own learning rate, weight decay, gradient clipping, dropout
and gate-drop rates too (MEMBER_KEYS: values that live in tensors, not in the model's shapes or its
data), so every seed of every cell of an ablation over those values trains as one stack, and so do
a search's suggestions of them. Each member keeps what a run of its own would have: its
initialisation (the model built after `torch.manual_seed(seed)`, as `train` does), its data order
(its own batch generator and length buckets), its own dropout masks at its own rates (vmap's
randomness="different"), its own gradient clipping (the norm per member), its own optimizer step
(MemberOptimizer) and its own checkpoint selection and metrics (train.Selection). Without dropout
the result equals N separate runs within floating-point rounding (tests/test_batched.py); with
dropout each member draws other masks than its separate run would, from the same distribution.

Models need a forward pass free of data-dependent Python control flow (`models.batchable` says which).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap
from tqdm import tqdm

from .config import TrainConfig, parse_trial_config
from .graphs import N_BUCKETS, GraphedStep, graphs_unused_because
from .models import batchable
from .models.dropout import rates_in_tensors
from .tasks import load_task
from .train import (Selection, add_sums, batch_source, batch_tensors, free_what_finished_trials_left, load_optimizer_state, loss_of, lr_factor,
                    make_model, make_optimizer, predict, random_states, ratios, restore_random_states, room_for_compiles, score_sums, set_lr,
                    setup_device, synchronize, where)

# What may differ between the members of one stack: the rest of their configs is one. The rates
# live in tensors too: the optimizer's per member (MemberOptimizer), dropout's and gate-drop's as
# stacked buffers (models.dropout).
RATE_KEYS = ("dropout", "attention_dropout", "query_dropout", "input_dropout", "gate_drop")
MEMBER_KEYS = ("seed", "lr", "weight_decay", "grad_clip", *RATE_KEYS)

# report(metrics per member, state, compiled): after every evaluation, as train.Reporter for each
# member at once; `compiled`: whether the step still runs compiled (compile: auto falls back).
MembersReporter = Callable[[list[dict[str, Any]], Callable[[], dict], bool], None]


def stacked_batch(parts: list[tuple[Any, np.ndarray]], device: torch.device, bucketed: bool = False) -> dict[str, torch.Tensor]:
    """One batch per seed (each seed's own rows, trimmed to its own longest, or padded to its bucket
    width: train.batch_tensors), padded to the widest of them and stacked along a new first
    dimension. Padding is 0, the pad token's id; the models mask it, so a seed's result does not
    depend on the other seeds' lengths."""
    batches = [batch_tensors(split, index, device, bucketed) for split, index in parts]
    out = {}
    for name in batches[0]:
        tensors = [b[name] for b in batches]
        if tensors[0].dim() >= 2 and name in ("tokens", "token_features", "targets"):
            width = max(t.shape[1] for t in tensors)
            tensors = [F.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1])) for t in tensors]
        out[name] = torch.stack(tensors)
    return out


def unstack(batch: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    return {name: tensor[k] for name, tensor in batch.items()}


def per_member(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """One value per member (M,), shaped to broadcast over a stacked tensor (M, ...)."""
    return values.view(-1, *[1] * (like.dim() - 1))


def clip_per_member(grad_clip_by: str, limits: torch.Tensor, grads: list[torch.Tensor]) -> None:
    """torch.nn.utils.clip_grad_norm_ (or _value_) for each member's slice of the stacked gradients,
    at the member's own limit (`limits`, one per member; inf: no clipping)."""
    if grad_clip_by == "value":
        for g in grads:
            limit = per_member(limits, g)
            g.clamp_(-limit, limit)
        return
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads]).norm(dim=0)  # (members,)
    scale = (limits / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(per_member(scale, g))


class MemberOptimizer:
    """The configured optimizer (train.make_optimizer) over stacked parameters, each member stepping
    with its own learning rate and weight decay. Adam, AdamW and RMSprop update each entry from its
    own gradient alone, and their step is proportional to the learning rate: so the optimizer runs
    at lr 1 without decay, and each member's slice of the step is scaled by its own lr afterwards.
    Decay goes in as torch's optimizers apply it: AdamW's shrinks the weights before the step (by
    lr x decay), Adam's and RMSprop's adds decay x weight to the gradient. Members that all share
    their lr and decay use the optimizer as it is (no copy of the weights per step)."""

    def __init__(self, configs: list[TrainConfig], params: list[torch.Tensor], device: torch.device, capturable: bool = False):
        self.params, self.base_lr, self.factor = params, configs[0].lr, 1.0
        self.decoupled = configs[0].optimizer == "adamw"
        self.shared = len({(c.lr, c.weight_decay) for c in configs}) == 1
        if self.shared:
            self.optimizer = make_optimizer(configs[0], params, capturable)
        else:
            self.optimizer = make_optimizer(dataclasses.replace(configs[0], lr=1.0, weight_decay=0.0), params, capturable)
            self.lr = torch.tensor([c.lr for c in configs], device=device)
            self.decay = torch.tensor([c.weight_decay for c in configs], device=device)

    @torch.no_grad()
    def step(self) -> None:
        if self.shared:
            self.optimizer.step()
            return
        live = [p for p in self.params if p.grad is not None]
        if not self.decoupled:
            for p in live:
                p.grad.add_(p * per_member(self.decay, p))
        before = [p.clone() for p in live]
        self.optimizer.step()
        for p, old in zip(live, before):
            lr = per_member(self.lr, p) * self.factor
            shrunk = old * (1 - lr * per_member(self.decay, p)) if self.decoupled else old
            p.copy_(shrunk + lr * (p - old))

    def schedule(self, factor: float) -> None:
        """Every member's learning rate at `factor` of its own (train.lr_factor)."""
        self.factor = factor
        if self.shared:
            set_lr(self.optimizer, self.base_lr * factor)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        load_optimizer_state(self.optimizer, state)


def member_state_dict(snapshot: dict, k: int) -> dict[str, torch.Tensor]:
    """Member k's model weights (a state dict its model loads) from a snapshot of `train_members`."""
    return {name: value[k] for name, value in {**snapshot["params"], **snapshot["buffers"]}.items()}


def member_configs(cfg: TrainConfig, members: list[dict[str, Any]]) -> list[TrainConfig]:
    """Each member's own config: `cfg` with the member's values of MEMBER_KEYS, checked as any. A
    member without a seed has `cfg`'s, as a search's trials do (the suggestions of one stack then
    start from the same weights and see the same batches, as their separate trials would)."""
    for member in members:
        if not member.keys() <= set(MEMBER_KEYS):
            raise ValueError(f"a member sets at most {', '.join(MEMBER_KEYS)}, got {sorted(member)}")
    return [parse_trial_config({**cfg.flat(), **member}) for member in members]


def train_seeds(cfg: TrainConfig, seeds: list[int], **kwargs) -> dict[int, dict[str, Any]]:
    """Train `cfg` once per seed of `seeds`, all at once; returns each seed's final metrics."""
    return dict(zip(seeds, train_members(cfg, [{"seed": seed} for seed in seeds], **kwargs)))


class Stack:
    """The members' models stacked, each with its own batch source, and their optimizer: `step()`
    trains every member once. What train_members runs and member_steps_per_second times."""

    def __init__(self, cfg: TrainConfig, members: list[dict[str, Any]], task, device: torch.device,
                 log: Callable[[str], None] | None = print):
        why_not = batchable({**cfg.flat(), "model": cfg.model})
        if why_not:
            raise ValueError(f"members cannot be stacked: {why_not}")
        self.falls_back, self.log = cfg.compile == "auto", log  # falls back uncompiled where auto compiled (gradients)
        cfg = cfg.settled(device.type, len(members))
        self.cfg, self.task, self.device = cfg, task, device
        self.configs = member_configs(cfg, members)
        self.rngs = [np.random.default_rng(c.seed) for c in self.configs]
        self.sources = [batch_source(c, task, rng) for c, rng in zip(self.configs, self.rngs)]
        self.models = []
        for c in self.configs:
            torch.manual_seed(c.seed)  # the initialisation a run of its own would have
            self.models.append(make_model(c, task).to(device))
        self.params, self.buffers = stack_module_state(self.models)
        skeleton = copy.deepcopy(self.models[0]).to("meta")
        if cfg.compile or len({tuple(c.model_options.get(k) for k in RATE_KEYS) for c in self.configs}) > 1:
            rates_in_tensors(skeleton)  # each member at its own rate, a stacked buffer; compiled, none a constant of the code
        # Checkpoints hold the buffers a member's state dict has (not the rates: they are config).
        self.saved_buffers = [name for name in self.buffers if name in self.models[0].state_dict()]
        self.graphed = graphs_unused_because(cfg, device, stacked=True) is None
        # Compiled code is compiled once per shape: batches padded to a few widths, graphed or not.
        self.bucketed = self.graphed or bool(cfg.compile)
        self.optimizer = MemberOptimizer(self.configs, list(self.params.values()), device, capturable=self.graphed and device.type == "cuda")
        self.clip_limits = torch.tensor([c.grad_clip or math.inf for c in self.configs], device=device)
        self.clips = any(c.grad_clip for c in self.configs)

        def forward(p: dict, b: dict, batch: dict) -> torch.Tensor:
            return predict(lambda *args: functional_call(skeleton, (p, b), args), task.kind, batch)

        # The parameters vary along dim 0; so does the batch in training (a batch per member), while
        # every member is evaluated on the same rows.
        self.forward = self.uncompiled = vmap(forward, in_dims=(0, 0, 0), randomness="different")
        if cfg.compile:  # the vmapped forward and its backward as fused kernels, compiled once per shape
            # Static shapes: where a size changed between compiles (a later stack of another d_model
            # in the same process, as Tune reuses a trial's process), torch's automatic dynamic shapes
            # recompiled with symbolic sizes, which vmap's batched tensors cannot give: the step failed.
            self.forward = torch.compile(self.forward, mode=cfg.compile_mode, dynamic=False)
            room_for_compiles(N_BUCKETS)  # one per bucket width
        # On CUDA the whole step is one graph replay (graphs.py), as train's is.
        self.run = GraphedStep(self.train_batch, {**self.params, **self.buffers}, self.optimizer.optimizer,
                               eager_replay=device.type != "cuda") if self.graphed else self.train_batch

    def train_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """One training step of every member on its slice of `batch`: -> (each member's loss, each member's score sums)."""
        out, losses = self.gradients(batch)
        if self.clips:
            clip_per_member(self.cfg.grad_clip_by, self.clip_limits, [p.grad for p in self.params.values() if p.grad is not None])
        self.optimizer.step()
        return losses.detach().float(), [score_sums(self.task.kind, out[k].detach(), unstack(batch, k)) for k in range(len(self.configs))]

    def gradients(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every member's output and loss on its slice of `batch`, the loss's gradients in the
        parameters. Where `compile: auto` compiled the step and the compiled code fails (a single
        NDR's did on CUDA under torch 2.11: an Inductor stride assertion in its backward), the stack
        says why and goes on uncompiled from this very step: nothing was updated yet. A compile
        asked for outright fails as it is."""
        try:
            return self.forward_backward(batch)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - compile: auto must not cost a trial the compiler's own bug
            # Inside a capture an error is the capture's (the compile ran in its warm-up): going on uncompiled there would hide it.
            capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
            if not self.falls_back or self.forward is self.uncompiled or capturing:
                raise
            why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        # Out of the except block: the failed attempt's activations, which its traceback holds, are freed first.
        self.train_uncompiled(f"the compiled step failed ({why})")
        return self.forward_backward(batch)

    def train_uncompiled(self, why: str) -> None:
        self.forward = self.uncompiled
        message = f"[{self.cfg.task}/{self.cfg.model}] {why}; training on uncompiled"
        if self.log:
            self.log(message)
        else:  # a launch's trials log nothing else: the worker's warning reaches the driver's console
            warnings.warn(message, stacklevel=3)

    def forward_backward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16, cache_enabled=not self.graphed):
            out = self.forward(self.params, self.buffers, batch)
        losses = torch.stack([loss_of(self.task.kind, out[k], unstack(batch, k)) for k in range(len(self.configs))])
        self.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()  # members share no parameter: each gets its own loss's gradient
        return out, losses

    @property
    def compiled(self) -> bool:
        return self.forward is not self.uncompiled

    def next_batch(self) -> dict[str, torch.Tensor]:
        """Every member's next batch, stacked."""
        return stacked_batch([next_batch() for next_batch, _ in self.sources], self.device, self.bucketed)

    def step(self) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """One training step of every member on its next batch: -> (each member's loss, each member's score sums)."""
        return self.run(self.next_batch())

    def load_member(self, k: int) -> torch.nn.Module:
        """Member k's parameters in a module of its own, for evaluation (train.evaluate runs it)."""
        with torch.no_grad():
            for name, p in self.models[k].named_parameters():
                p.copy_(self.params[name][k])
            for name, b in self.models[k].named_buffers():
                b.copy_(self.buffers[name][k])
        return self.models[k]


def member_steps_per_second(cfg: TrainConfig, sizes: list[int], steps: int = 3) -> list[tuple[int, float]]:
    """(n, member-steps/s) of `cfg` stacked n members high (seeds 0..n-1), for each n of `sizes` in
    turn: the median of `steps` steps after a warm-up, each timed to the device's end. Stops at the
    first size the device has no memory for. The throughput curve a stack size is chosen from."""
    device = setup_device(cfg)
    task = load_task(cfg.task, cfg.task_options)
    curve = []
    for n in sizes:
        try:
            stack = Stack(cfg, [{"seed": seed} for seed in range(n)], task, device)
            times = []
            for _ in range(steps + 1):
                start = time.perf_counter()
                stack.step()
                synchronize(device)
                times.append(time.perf_counter() - start)
        except torch.cuda.OutOfMemoryError:
            break
        finally:
            stack = None
            free_what_finished_trials_left(device)  # before the next size: a stack outlives its last reference
        curve.append((n, n / statistics.median(times[1:])))
    return curve


def stack_cuts(members: int, size: int) -> list[int]:
    """The stacks `members` members train in, at most `size` each: full stacks, then the rest;
    where the rest would be one member alone, the last two stacks share it (4 + 1 becomes 3 + 2).
    A lone member trains as a plain trial, and on CUDA that is uncompiled and in TF32 where stacks
    train compiled in bf16 (TrainConfig.settled): one cell's seeds would differ in numerics."""
    full, rest = divmod(members, size)
    cuts = [size] * full + ([rest] if rest else [])
    if len(cuts) > 1 and cuts[-1] == 1 and size > 2:
        cuts[-2:] = [size - 1, 2]
    return cuts


def group_rate(curve: list[tuple[int, float]], members: int, size: int) -> float:
    """Member-steps/s of `members` members trained in stacks of at most `size` one after another
    (stack_cuts), each at its throughput read off the curve (between two measured sizes, on the
    line joining them)."""
    sizes, rates = zip(*sorted(curve))
    return members / sum(n / float(np.interp(n, sizes, rates)) for n in stack_cuts(members, size))


def knee(curve: list[tuple[int, float]], within: float = 0.9, members: int | None = None) -> int:
    """The smallest stack size whose throughput for a group of `members` (the curve's largest size
    unless given) is `within` of the best size's: a larger stack would cost memory and a longer
    wait per evaluation for little more. The group's throughput counts every stack it is cut
    into (group_rate), so five seeds do not split three and two where a stack of five trains them sooner."""
    members = members or max(n for n, _ in curve)
    rates = {n: group_rate(curve, members, n) for n, _ in curve if n <= members}
    best = max(rates.values())
    return min(n for n, rate in rates.items() if rate >= within * best)


def train_members(cfg: TrainConfig, members: list[dict[str, Any]], report: MembersReporter | None = None,
                  resume_state: dict | None = None, log: Callable[[str], None] | None = print) -> list[dict[str, Any]]:
    """Train `cfg` once per member (its seed and its own values of MEMBER_KEYS), all at once;
    returns each member's final metrics."""
    device = setup_device(cfg)
    free_what_finished_trials_left(device)
    task = load_task(cfg.task, cfg.task_options)
    stack = Stack(cfg, members, task, device, log)
    cfg = stack.cfg
    params, rngs, sources, optimizer = stack.params, stack.rngs, stack.sources, stack.optimizer
    bar = tqdm(total=cfg.n_iters, unit="it", disable=not (log and sys.stderr.isatty()), dynamic_ncols=True)
    say = stack.log = log and (bar.write if not bar.disable else log)
    described = [" ".join(f"{k} {v}" for k, v in member.items()) for member in members]
    selections = [Selection(c, task, device, say, f"{cfg.task}/{cfg.model} {d}") for c, d in zip(stack.configs, described)]
    if log:
        log(f"[{cfg.task}/{cfg.model}] {len(members)} members stacked ({'; '.join(described)}): "
            f"{sum(p.numel() for p in stack.models[0].parameters()):,} parameters each on {where(cfg, device)}; {cfg.n_iters:,} iterations")
    start = 0
    if resume_state:
        with torch.no_grad():
            for name, value in resume_state["params"].items():
                params[name].copy_(value)
            for name, value in resume_state.get("buffers", {}).items():
                stack.buffers[name].copy_(value)
        if resume_state.get("compiled") is False and stack.compiled:
            stack.train_uncompiled("its compiled step failed before the checkpoint")
        optimizer.load_state_dict(resume_state["optimizer"])
        restore_random_states(resume_state, device)
        start = resume_state["iteration"]
        for rng, (_, buckets), selection, saved in zip(rngs, sources, selections, resume_state["member_states"]):
            rng.bit_generator.state = saved["batch_rng"]
            selection.restore(saved)
            if buckets:
                buckets.restore(saved["buckets"])
    bar.update(start)

    def snapshot() -> dict:
        return copy.deepcopy({
            "members": list(members), "params": {name: p.detach() for name, p in params.items()}, "buffers": {name: stack.buffers[name] for name in stack.saved_buffers},
            "optimizer": optimizer.state_dict(),
            "iteration": iteration, **random_states(device), "compiled": stack.compiled,
            "member_states": [{"batch_rng": rng.bit_generator.state, **selection.state(), "buckets": buckets.state() if buckets else None}
                              for rng, (_, buckets), selection in zip(rngs, sources, selections)],
        })

    iteration = start
    if all(selection.ended(start) for selection in selections):  # as train's: restored from the checkpoint the stack ended at
        if report:
            report([selection.metrics for selection in selections], snapshot, stack.compiled)
        bar.close()
        return [selection.metrics for selection in selections]
    n = len(members)
    loss_sums, train_sums, steps, since = torch.zeros(n, device=device), [{} for _ in members], 0, time.perf_counter()
    for iteration in range(start + 1, cfg.n_iters + 1):
        if cfg.lr_schedule != "constant":
            optimizer.schedule(lr_factor(cfg, iteration))
        losses, sums = stack.step()
        loss_sums = loss_sums + losses
        train_sums = [add_sums(into, more) for into, more in zip(train_sums, sums)]
        steps += 1
        bar.update()
        if iteration % cfg.eval_every == 0 or iteration == cfg.n_iters:
            mean_losses = (loss_sums / steps).tolist()  # waits for the window's last step, as train's rate does
            rate = steps / max(time.perf_counter() - since, 1e-9)
            for k, selection in enumerate(selections):
                if not selection.diverged:  # a diverged member keeps its last metrics, as its own run would have stopped
                    selection(stack.load_member(k), iteration, mean_losses[k], ratios(train_sums[k]), rate)
            if report:
                report([selection.metrics for selection in selections], snapshot, stack.compiled)
            if all(selection.diverged for selection in selections):
                break
            loss_sums, train_sums, steps, since = torch.zeros(n, device=device), [{} for _ in members], 0, time.perf_counter()
    bar.close()
    return [selection.metrics for selection in selections]
