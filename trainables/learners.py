"""What the protocol (train.run) trains: the `Learner` interface, and `Single`, a lone trial's model
and optimizer (batched.Stack is the other Learner: N members at once)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from .batches import LengthBuckets, batch_source, batch_tensors
from .config import TrainConfig
from .devices import where
from .steps import compile_model, load_optimizer_state, make_model, set_lr, step_function
from .tasks import load_task
from .tasks.base import Task


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
