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
(MemberOptimizer) and its own checkpoint selection and metrics (evaluation.Selection). Without dropout
the result equals N separate runs within floating-point rounding (tests/test_batched.py); with
dropout each member draws other masks than its separate run would, from the same distribution.

Models need a forward pass free of data-dependent Python control flow (`models.batchable` says which).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

from .batches import batch_source, batch_tensors
from .config import MEMBER_KEYS, RATE_KEYS, TrainConfig, parse_trial_config
from .devices import free_what_finished_trials_left, setup_device, where
from .graphs import N_BUCKETS, GraphedStep, graphs_unused_because
from .models import batchable
from .models.dropout import rates_in_tensors
from .steps import load_optimizer_state, make_model, make_optimizer, room_for_compiles, set_lr
from .tasks import load_task
from .timing import step_seconds
from .train import MembersReporter, run


def stacked_batch(
    parts: list[tuple[Any, np.ndarray]], device: torch.device, bucketed: bool = False
) -> dict[str, torch.Tensor]:
    """One batch per seed (each seed's own rows, trimmed to its own longest, or padded to its bucket
    width: batches.batch_tensors), padded to the widest of them and stacked along a new first
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
    """The configured optimizer (steps.make_optimizer) over stacked parameters, each member stepping
    with its own learning rate and weight decay. Adam, AdamW and RMSprop update each entry from its
    own gradient alone, and their step is proportional to the learning rate: so the optimizer runs
    at lr 1 without decay, and each member's slice of the step is scaled by its own lr afterwards.
    Decay goes in as torch's optimizers apply it: AdamW's shrinks the weights before the step (by
    lr x decay), Adam's and RMSprop's adds decay x weight to the gradient. Members that all share
    their lr and decay use the optimizer as it is (no copy of the weights per step)."""

    def __init__(
        self,
        configs: list[TrainConfig],
        params: list[torch.Tensor],
        device: torch.device,
        capturable: bool = False,
    ):
        self.params, self.base_lr, self.factor = params, configs[0].lr, 1.0
        self.decoupled = configs[0].optimizer == "adamw"
        self.shared = len({(c.lr, c.weight_decay) for c in configs}) == 1
        if self.shared:
            self.optimizer = make_optimizer(configs[0], params, capturable)
        else:
            self.optimizer = make_optimizer(
                dataclasses.replace(configs[0], lr=1.0, weight_decay=0.0), params, capturable
            )
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
        """Every member's learning rate at `factor` of its own (steps.lr_factor)."""
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

    def __init__(
        self,
        cfg: TrainConfig,
        members: list[dict[str, Any]],
        task,
        device: torch.device,
        log: Callable[[str], None] | None = print,
    ):
        why_not = batchable({**cfg.flat(), "model": cfg.model})
        if why_not:
            raise ValueError(f"members cannot be stacked: {why_not}")
        # compile: auto falls back uncompiled where the compiled step fails (gradients)
        self.falls_back, self.log = cfg.compile == "auto", log
        cfg = cfg.settled(device.type, len(members))
        self.cfg, self.task, self.device = cfg, task, device
        self.configs = member_configs(cfg, members)
        self.members = list(members)
        self.described = [" ".join(f"{k} {v}" for k, v in member.items()) for member in members]
        self.labels = [f"{cfg.task}/{cfg.model} {d}" for d in self.described]
        self.rngs = [np.random.default_rng(c.seed) for c in self.configs]
        self.sources = [batch_source(c, task, rng) for c, rng in zip(self.configs, self.rngs)]
        self.buckets = [buckets for _, buckets in self.sources]
        self.models = []
        for c in self.configs:
            torch.manual_seed(c.seed)  # the initialisation a run of its own would have
            self.models.append(make_model(c, task).to(device))
        self.params, self.buffers = stack_module_state(self.models)
        # Checkpoints hold the buffers a member's state dict has (not the rates: they are config).
        self.saved_buffers = [name for name in self.buffers if name in self.models[0].state_dict()]
        self.graphed = graphs_unused_because(cfg, device, stacked=True) is None
        # Compiled code is compiled once per shape: batches padded to a few widths, graphed or not.
        self.bucketed = self.graphed or bool(cfg.compile)
        capturable = self.graphed and device.type == "cuda"
        self.optimizer = MemberOptimizer(self.configs, list(self.params.values()), device, capturable)
        self.clip_limits = torch.tensor([c.grad_clip or math.inf for c in self.configs], device=device)
        self.clips = any(c.grad_clip for c in self.configs)
        self.forward = self.uncompiled = self.vmapped_forward()
        if cfg.compile:  # the vmapped forward and its backward as fused kernels, compiled once per shape
            # Static shapes: where a size changed between compiles (a later stack of another d_model
            # in the same process, as Tune reuses a trial's process), torch's automatic dynamic shapes
            # recompiled with symbolic sizes, which vmap's batched tensors cannot give: the step failed.
            self.forward = torch.compile(self.forward, mode=cfg.compile_mode, dynamic=False)
            room_for_compiles(N_BUCKETS)  # one per bucket width
        # On CUDA the whole step is one graph replay (graphs.py), as train's is.
        weights = {**self.params, **self.buffers}
        eager_replay = device.type != "cuda"
        graphed = GraphedStep(self.train_batch, weights, self.optimizer.optimizer, eager_replay=eager_replay)
        self.run = graphed if self.graphed else self.train_batch

    def vmapped_forward(self):
        """Every member's forward at once: the parameters vary along dim 0; so does the batch in
        training (a batch per member), while every member is evaluated on the same rows."""
        skeleton = copy.deepcopy(self.models[0]).to("meta")
        rates = {tuple(c.model_options.get(k) for k in RATE_KEYS) for c in self.configs}
        if self.cfg.compile or len(rates) > 1:
            # each member at its own rate, a stacked buffer; compiled, none a constant of the code
            rates_in_tensors(skeleton)
        kind = self.task.kind

        def forward(p: dict, b: dict, batch: dict) -> torch.Tensor:
            return kind.predict(lambda *args: functional_call(skeleton, (p, b), args), batch)

        return vmap(forward, in_dims=(0, 0, 0), randomness="different")

    def train_batch(
        self, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """One training step of every member on its slice of `batch`: -> (each member's loss, each
        member's score sums)."""
        out, losses = self.gradients(batch)
        if self.clips:
            clip_per_member(
                self.cfg.grad_clip_by,
                self.clip_limits,
                [p.grad for p in self.params.values() if p.grad is not None],
            )
        self.optimizer.step()
        return losses.detach().float(), [
            self.task.kind.score_sums(out[k].detach(), unstack(batch, k)) for k in range(len(self.configs))
        ]

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
        except Exception as e:  # compile: auto must not cost a trial the compiler's own bug
            # Inside a capture an error is the capture's (the compile ran in its warm-up): going on
            # uncompiled there would hide it.
            capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
            if not self.falls_back or self.forward is self.uncompiled or capturing:
                raise
            why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        # Out of the except block: the failed attempt's activations, which its traceback holds, are
        # freed first.
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
        with torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16, cache_enabled=not self.graphed
        ):
            out = self.forward(self.params, self.buffers, batch)
        losses = torch.stack(
            [self.task.kind.loss(out[k], unstack(batch, k)) for k in range(len(self.configs))]
        )
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
        """One training step of every member on its next batch: -> (each member's loss, each member's
        score sums)."""
        return self.run(self.next_batch())

    def schedule(self, factor: float) -> None:
        self.optimizer.schedule(factor)

    def weights(self) -> dict:
        return {
            "members": self.members,
            "params": {name: p.detach() for name, p in self.params.items()},
            "buffers": {name: self.buffers[name] for name in self.saved_buffers},
            "optimizer": self.optimizer.state_dict(),
            "compiled": self.compiled,
        }

    def load_weights(self, saved: dict) -> None:
        with torch.no_grad():
            for name, value in saved["params"].items():
                self.params[name].copy_(value)
            for name, value in saved.get("buffers", {}).items():
                self.buffers[name].copy_(value)
        if saved.get("compiled") is False and self.compiled:
            self.train_uncompiled("its compiled step failed before the checkpoint")
        self.optimizer.load_state_dict(saved["optimizer"])

    @staticmethod
    def pack(common: dict, members: list[dict]) -> dict:
        return {**common, "member_states": members}

    @staticmethod
    def unpack(saved: dict) -> list[dict]:
        return saved["member_states"]

    def member_model(self, k: int) -> torch.nn.Module:
        """Member k's parameters in a module of its own, for evaluation (evaluation.evaluate runs it)."""
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
            seconds = step_seconds(stack.step, device, steps)
        except torch.cuda.OutOfMemoryError:
            break
        finally:
            stack = None
            free_what_finished_trials_left(
                device
            )  # before the next size: a stack outlives its last reference
        curve.append((n, n / seconds))
    return curve


def train_members(
    cfg: TrainConfig,
    members: list[dict[str, Any]],
    report: MembersReporter | None = None,
    resume_state: dict | None = None,
    log: Callable[[str], None] | None = print,
) -> list[dict[str, Any]]:
    """Train `cfg` once per member (its seed and its own values of MEMBER_KEYS), all at once, by
    the protocol a lone trial follows (train.run); returns each member's final metrics."""
    device = setup_device(cfg)
    free_what_finished_trials_left(device)
    stack = Stack(cfg, members, load_task(cfg.task, cfg.task_options), device, log)
    if log:
        log(
            f"[{stack.cfg.task}/{stack.cfg.model}] {len(members)} members stacked "
            f"({'; '.join(stack.described)}): {sum(p.numel() for p in stack.models[0].parameters()):,} "
            f"parameters each on {where(stack.cfg, device)}; {stack.cfg.n_iters:,} iterations"
        )
    return run(stack, report, resume_state, log)
