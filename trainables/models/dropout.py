"""Dropout with its mask drawn as uniform noise on the CPU, and gate-drop; both at a rate of each
stacked member's own.

torch's CPU dropout draws a Bernoulli per element, which dominated the small models' CPU steps
(about 60% of a small NDR's forward, issue 21); comparing uniform noise with p draws the same
mask distribution, P(keep) = 1 - p, kept values scaled by 1 / (1 - p), faster
(benchmarks/bench_dropout.py). On CUDA torch's fused kernel is already one launch and stays.

Each module keeps its rate as a (non-persistent) buffer too: trainables.batched stacks buffers
like weights, so in a stack of members whose rates differ (`per_member`) each member drops at
its own rate, and a rate of 0 drops nothing, with no branch on the value (vmap allows none).
"""
from __future__ import annotations

import torch
from torch import nn


class Dropout(nn.Dropout):
    def __init__(self, p: float = 0.5):
        super().__init__(p)
        self.register_buffer("rate", torch.tensor(float(p)), persistent=False)
        self.per_member = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.per_member:
            return x * (torch.rand_like(x) >= self.rate) / (1 - self.rate)
        if not self.training or self.p == 0 or self.p >= 1 or x.device.type != "cpu":
            return super().forward(x)
        return x * (torch.rand_like(x) >= self.p) * (1.0 / (1.0 - self.p))


class GateDrop(nn.Module):
    """The NDR authors' gate-drop: in training, each column's gate is shut with probability p for one
    layer step (so the column keeps its state); no rescaling."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.register_buffer("rate", torch.tensor(float(p)), persistent=False)
        self.per_member = False

    def forward(self, gate: torch.Tensor) -> torch.Tensor:
        if not self.training or (not self.per_member and self.p == 0):  # per member, p is not read: compiled code would hold it
            return gate
        return gate * (torch.rand_like(gate[..., :1]) >= (self.rate if self.per_member else self.p))
