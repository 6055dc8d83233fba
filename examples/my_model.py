"""A model of your own, in one file: a Transformer whose attention adds a learned bias per head and
clipped relative distance (as T5 does), run against the papers' baselines by naming it in a
search-space file:

    models: [ndr, transformer, examples/my_model.py:RelBiasTransformer]

The registry reads three class attributes (trainables/models/__init__.py): `Config`, a dataclass
of the keys a search may vary, each with a default; `kinds`, the task kinds it reads; `stacks`,
whether seeds may train vmapped as one stack. It builds the model as `RelBiasTransformer(config,
task)`, and calls forward with what each kind hands a model (trainables/kinds.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from trainables.fields import rate
from trainables.kinds import SEQUENCE_CLASSIFICATION, SEQUENCE_TO_SEQUENCE


@dataclass
class RelBiasConfig:
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    dropout: float = rate(0.1)  # 0 <= dropout < 1: a range the Config states (trainables.fields)
    max_distance: int = 16  # distances beyond share one bias


class Block(nn.Module):
    """Pre-norm self-attention with a relative-position bias, then a feed-forward layer."""

    def __init__(self, cfg: RelBiasConfig):
        super().__init__()
        self.n_heads, self.max_distance = cfg.n_heads, cfg.max_distance
        self.norm1, self.norm2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.qkv, self.out = nn.Linear(cfg.d_model, 3 * cfg.d_model), nn.Linear(cfg.d_model, cfg.d_model)
        self.bias = nn.Embedding(2 * cfg.max_distance + 1, cfg.n_heads)
        self.ff = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.ReLU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, h: torch.Tensor, padding: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = (
            self.qkv(self.norm1(h)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        )
        distance = (positions[None] - positions[:, None]).clamp(
            -self.max_distance, self.max_distance
        ) + self.max_distance
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + self.bias(distance).permute(2, 0, 1)
        scores = scores.masked_fill(padding[:, None, None, :], float("-inf"))
        mixed = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        h = h + self.drop(self.out(mixed))
        return h + self.drop(self.ff(self.norm2(h)))


class RelBiasTransformer(nn.Module):
    """Transformer with a learned relative-position bias (an example model from outside the package)."""

    Config = RelBiasConfig
    kinds = (SEQUENCE_CLASSIFICATION, SEQUENCE_TO_SEQUENCE)
    stacks = True  # plain tensor operations, no host-side control flow: vmap traces it

    def __init__(self, cfg: RelBiasConfig, task):
        super().__init__()
        self.embed = nn.Embedding(len(task.vocab), cfg.d_model)
        self.features = nn.Linear(task.n_features, cfg.d_model) if task.n_features else None
        self.query = nn.Parameter(
            torch.randn(cfg.d_model) * 0.02
        )  # an output slot, before the bias tells slots apart
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(
            cfg.d_model, task.n_classes if task.kind is SEQUENCE_CLASSIFICATION else len(task.vocab)
        )

    def encode(self, h: torch.Tensor, padding: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            h = block(h, padding, positions)
        return self.norm(h)

    def forward(self, tokens, lengths, n_out=None, token_features=None, target_lengths=None):
        """Sequence classification: (B, classes) read at the first token. Sequence to sequence:
        `n_out` output slots after the input, read as (B, n_out, vocab). Slot i sits at position i,
        beside input token i, and slots past the sample's target length are masked as padding is: a
        sample's output does not depend on how wide its batch is padded (what stacking seeds needs:
        their batches pad to the widest)."""
        h = self.embed(tokens)
        if self.features is not None and token_features is not None:
            h = h + self.features(token_features)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        padding = positions[None] >= lengths[:, None]
        if n_out is None:
            return self.head(self.encode(h, padding, positions)[:, 0])
        h = torch.cat([h, self.query.expand(h.shape[0], n_out, -1)], dim=1)
        slots = torch.arange(n_out, device=tokens.device)
        unread = (
            slots[None]
            >= (target_lengths if target_lengths is not None else torch.full_like(lengths, n_out))[:, None]
        )
        padding, positions = torch.cat([padding, unread], dim=1), torch.cat([positions, slots])
        return self.head(self.encode(h, padding, positions)[:, -n_out:])
