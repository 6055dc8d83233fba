"""The Compositional Attention paper's contextual-retrieval model (Mittal et al., App. C.1, Table 6).

    x -> MLP (in -> d -> d) -> one attention layer -> MLP (d -> d -> 1) per set element.

The attention layer has no residual, LayerNorm or feed-forward ("we opt to exclude the residual
network"), masks the diagonal (the ground-truth search is argmin over j != i) and concatenates a
projection of the element itself to the attended values before the output projection (the paper's
"extra value ... because it contains information about the retrieval preferences"; the authors'
`--concat`). Query, key and value widths equal d, as in the authors' runs, which gives Table 6's
parameter counts (30k, 28k, 27k for 2, 4, 8 heads at d = 64; 30k compositional).

  multi-head:     S heads of width d/S; each head's values of width d/S.
  compositional:  S searches (query/key width d/S) over R shared value projections of width d/R
                  (Eq. 7-10); each search then picks among its R retrievals by a second, softmax
                  attention (Eq. 11-13) with a query from the element (width d/S) and a key from
                  each retrieved value (one map d/R -> d/S shared by the retrievals).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def mlp(d_in: int, d_hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_out))


class SetAttention(nn.Module):
    def __init__(self, d_model: int, searches: int, retrievals: int | None):
        """retrievals None: multi-head attention with `searches` heads; else compositional."""
        super().__init__()
        values = retrievals or searches
        if d_model % searches or d_model % values:
            raise ValueError(
                f"d_model={d_model} must be divisible by the heads/searches ({searches}) "
                f"and retrievals ({values})"
            )
        self.searches, self.retrievals = searches, retrievals
        self.d_search, self.d_value = d_model // searches, d_model // values
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        if retrievals:
            self.retrieval_query = nn.Linear(d_model, d_model)  # W̄_q, one d/S slice per search (Eq. 11)
            self.retrieval_key = nn.Linear(self.d_value, self.d_search)  # W̄_k, shared (Eq. 12)
        self.own = nn.Linear(d_model, self.d_value)  # the element's own extra value
        self.out = nn.Linear((searches + 1) * self.d_value, d_model)
        self.last_search_scores = self.last_value_scores = None  # for plots

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, n, _ = h.shape
        q = self.query(h).view(batch, n, self.searches, self.d_search).transpose(1, 2) / math.sqrt(
            self.d_search
        )
        k = self.key(h).view(batch, n, self.searches, self.d_search).transpose(1, 2)
        logits = (q @ k.transpose(-1, -2)).masked_fill(
            torch.eye(n, dtype=torch.bool, device=h.device), float("-inf")
        )
        search = torch.softmax(logits, dim=-1)  # (B, S, N, N)
        self.last_search_scores = search.detach()
        if self.retrievals is None:
            v = self.value(h).view(batch, n, self.searches, self.d_value).transpose(1, 2)
            read = (search @ v).transpose(1, 2).reshape(batch, n, -1)
        else:
            v = self.value(h).view(batch, n, self.retrievals, self.d_value).transpose(1, 2)  # (B, R, N, d_v)
            retrieved = torch.einsum("bsij,brjd->bisrd", search, v)  # every search x every retrieval (Eq. 10)
            rq = self.retrieval_query(h).view(batch, n, self.searches, 1, self.d_search) / math.sqrt(
                self.d_search
            )
            # (B, N, S, R), Eq. 13
            choice = torch.softmax((rq * self.retrieval_key(retrieved)).sum(-1), dim=-1)
            self.last_value_scores = choice.detach()
            read = (choice[..., None] * retrieved).sum(3).reshape(batch, n, -1)  # Eq. 14
        return self.out(torch.cat([read, self.own(h)], -1))


class SetAttentionRegressor(nn.Module):
    """A set of feature vectors -> one scalar per element."""

    def __init__(self, d_model: int, searches: int, retrievals: int | None, n_features: int):
        super().__init__()
        self.encoder = mlp(n_features, d_model, d_model)
        self.attention = SetAttention(d_model, searches, retrievals)
        self.decoder = mlp(d_model, d_model, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.attention(self.encoder(features)))[..., 0]
