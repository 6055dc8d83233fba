"""Dropout with its mask drawn as uniform noise on the CPU.

torch's CPU dropout draws a Bernoulli per element, which dominated the small models' CPU steps
(about 60% of a small NDR's forward, issue 21); comparing uniform noise with p draws the same
mask distribution, P(keep) = 1 - p, kept values scaled by 1 / (1 - p), faster
(benchmarks/bench_dropout.py). On CUDA torch's fused kernel is already one launch and stays.
"""
from __future__ import annotations

import torch
from torch import nn


class Dropout(nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0 or self.p >= 1 or x.device.type != "cpu":
            return super().forward(x)
        return x * (torch.rand_like(x) >= self.p) * (1.0 / (1.0 - self.p))
