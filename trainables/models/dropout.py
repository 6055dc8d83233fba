"""Dropout with its mask drawn as uniform noise on the CPU, and gate-drop; both at a rate of each
stacked member's own.

torch's CPU dropout draws a Bernoulli per element, which dominated the small models' CPU steps
(about 60% of a small NDR's forward, issue 21); comparing uniform noise with p draws the same
mask distribution, P(keep) = 1 - p, kept values scaled by 1 / (1 - p), faster
(benchmarks/bench_dropout.py). On CUDA torch's fused kernel is already one launch and stays.

Each module keeps its rate as a (non-persistent) buffer too, read in place of the Python number
where `rates_in_tensors` says so: trainables.batched stacks buffers like weights, so in a stack of
members whose rates differ each member drops at its own rate, and a rate of 0 drops nothing, with
no branch on the value (vmap allows none). Compiled code reads it there too: a Python number is a
constant of the compiled code, so each trial of a search (a rate of its own) compiled again.
"""

from __future__ import annotations

import torch
from torch import nn


class Dropout(nn.Dropout):
    def __init__(self, p: float = 0.5):
        super().__init__(p)
        self.register_buffer("rate", torch.tensor(float(p)), persistent=False)
        self.rate_in_tensor = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:  # before p is read: evaluation's compiled code would hold it
            return x
        if self.rate_in_tensor:
            return x * (torch.rand_like(x) >= self.rate) / (1 - self.rate)
        if self.p == 0 or self.p >= 1 or x.device.type != "cpu":
            return super().forward(x)
        return x * (torch.rand_like(x) >= self.p) * (1.0 / (1.0 - self.p))


class GateDrop(nn.Module):
    """The NDR authors' gate-drop: in training, each column's gate is shut with probability p for one
    layer step (so the column keeps its state); no rescaling."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.register_buffer("rate", torch.tensor(float(p)), persistent=False)
        self.rate_in_tensor = False

    def forward(self, gate: torch.Tensor) -> torch.Tensor:
        if not self.training or (not self.rate_in_tensor and self.p == 0):
            return gate
        return gate * (torch.rand_like(gate[..., :1]) >= (self.rate if self.rate_in_tensor else self.p))


def rates_in_tensors(model: nn.Module) -> None:
    """Every dropout and gate-drop of `model` reads its rate from its buffer, not its Python number."""
    for module in model.modules():
        if isinstance(module, (Dropout, GateDrop)):
            module.rate_in_tensor = True
