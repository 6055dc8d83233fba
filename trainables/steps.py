"""One training step: the model (compiled or not), the optimizer and its learning rate, the forward
pass and loss, gradient clipping, and the step eager or replayed from a CUDA graph (graphs.py)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .config import TrainConfig
from .graphs import GraphedStep, graphs_unused_because, module_weights
from .kinds import Kind
from .models import build_model
from .models.dropout import rates_in_tensors
from .tasks.base import Task


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


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """`saved` into `optimizer`, as this run steps: a checkpoint keeps the `capturable` its run had
    (torch's load_state_dict restores it with the rest of each group), and a step graphed with a
    checkpoint's False, or eager on a CPU with a graphed run's True, fails at its first update."""
    groups = [
        {**group, "capturable": now["capturable"]} if "capturable" in now else group
        for group, now in zip(saved["param_groups"], optimizer.param_groups)
    ]
    optimizer.load_state_dict({**saved, "param_groups": groups})


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
