"""Shared-weight (Universal) Transformer encoders up to the Neural Data Router (Csordás et al., ICLR 2022).

One layer's weights are applied n_layers times. Variants differ in two places:
  attention: "softmax" (absolute sinusoidal positions added to the input), "rel" (Transformer-XL
             relative positions), "absrel" (App. B, Eq. 16-17: a per-position gate switches between
             absolute and relative positional keys), "geometric" (Sec. 2.2: attend to the closest
             match, with direction encoding).
             "compositional" (Mittal et al., Eq. 7-14): n_heads searches share n_retrievals
             value projections, each search choosing its retrieval by a second attention
             (dot-product scores, or the authors' "MLP" scores of their Table 8).
  gate:      the copy gate of Sec. 2.1 (Eq. 1-5), which lets a column skip a layer.
NDR = geometric attention + copy gate. The same layers also read sets (feature vectors, no
positions) for set regression: UniversalTransformerSetRegressor; and, normalised before each
sublayer as the Compositional Attention authors' are, images with a question (Sort-of-CLEVR):
ImageQuestionTransformer.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import feed_forward_op
from .configs import TransformerConfig
from .dropout import Dropout, GateDrop

ATTENTION_KINDS = ("softmax", "rel", "absrel", "geometric", "compositional")
RETRIEVAL_SCORES = ("dot", "mlp")
ACT_VARIANTS = ("none", "graves", "dehghani")


def sinusoids(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """Vaswani et al. sinusoidal embedding of (possibly negative) integer positions."""
    freq = torch.exp(torch.arange(0, d_model, 2, device=positions.device) * (-math.log(10000.0) / d_model))
    angles = positions.float()[:, None] * freq[None]
    out = torch.zeros(len(positions), d_model, device=positions.device)
    out[:, 0::2] = torch.sin(angles)
    out[:, 1::2] = torch.cos(angles)
    return out


def geometric_order(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For each target i: the source positions sorted from closest to farthest, and each source's rank.

    Rank 0 is i itself. At equal distance the source to the right of i is the closer one (the
    sentence above Eq. 8, Figure 1/right and Eq. 8 itself, read literally)."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    closeness = 2 * (i - j).abs() - (j > i).long()
    order = closeness.argsort(dim=1)
    return order, order.argsort(dim=1)


class GeometricTables(NamedTuple):
    """What geometric attention over N positions reads that depends on N alone, as flat indices into
    (N, N) matrices and masks: `to_ranks` lays row i's sources out by closeness down column i, each
    one rank lower ([r, i] <- [i, order[i, r - 1]]; rank 0 reads i itself), so that a sum down the
    columns is the exclusive sum of Eq. 7; `from_ranks` puts them back ([i, j] <- [rank[i, j], i]);
    `diagonal` is i == j, `source_right` i <= j (Eq. 9's W_LR)."""

    to_ranks: torch.Tensor
    from_ranks: torch.Tensor
    diagonal: torch.Tensor
    source_right: torch.Tensor


def geometric_tables(n: int, device: torch.device) -> GeometricTables:
    order, rank = geometric_order(n, device)
    i = torch.arange(n, device=device)
    one_rank_lower = torch.cat([order[:, :1], order[:, :-1]], 1)
    return GeometricTables(
        to_ranks=(i[None, :] * n + one_rank_lower.T).flatten(),
        from_ranks=(rank * n + i[:, None]).flatten(),
        diagonal=i[:, None] == i[None, :],
        source_right=i[:, None] <= i[None, :],
    )


# Made on the device (a copy from the host would stop a CUDA graph's capture) and kept there: a
# capture's warm-up steps fill this cache, and it never evicts, since a captured graph reads these
# very tensors (a few small ones per sequence width). Under torch.compile they are traced instead.
cached_geometric_tables = lru_cache(maxsize=None)(geometric_tables)


def tables_for(n: int, device: torch.device) -> GeometricTables:
    return (
        geometric_tables(n, device) if torch.compiler.is_compiling() else cached_geometric_tables(n, device)
    )


def geometric_attention_weights(logits: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """Eq. 7 in log space: A_ij = P_ij * prod_{k in S_ij} (1 - P_ik), P = sigmoid(logits), A_ii = 0.

    Sorting each row's sources by closeness turns the product over S_ij into an exclusive cumulative
    sum of log(1 - P), O(N^2) like softmax attention. The sorted rows are laid out as columns, so
    that the sum runs down a middle dimension: on a GPU a scan along the innermost dimension of
    short rows was the slowest kernel of a stacked NDR step
    (docs/performance.md#gpu-where-a-stacked-ndr-steps-time-goes). The diagonal's
    logit is -inf: P_ii = 0 gives A_ii = 0, and log(1 - P_ii) = 0 is what rank 0 adds to the sum, so
    the exclusive sum needs no subtraction. Masked keys carry logit -inf too: P = 0 there, so they
    neither receive weight nor shadow anything. `normalize` divides each row by its sum (at least
    1e-12), as the authors' "+geom. att." baseline does; NDR does not."""
    n = logits.shape[-1]
    tables = tables_for(n, logits.device)
    logits = logits.masked_fill(tables.diagonal, float("-inf"))
    log_not_p = F.logsigmoid(-logits)
    flat_shape = (*logits.shape[:-2], n * n)
    by_rank = log_not_p.flatten(-2).gather(-1, tables.to_ranks.expand(flat_shape)).view(logits.shape)
    exclusive = (
        by_rank.cumsum(-2).flatten(-2).gather(-1, tables.from_ranks.expand(flat_shape)).view(logits.shape)
    )
    weights = torch.exp(F.logsigmoid(logits) + exclusive)
    return weights / weights.sum(-1, keepdim=True).clamp_min(1e-12) if normalize else weights


class Attention(nn.Module):
    def __init__(
        self,
        kind: str,
        d_model: int,
        n_heads: int,
        attention_dropout: float,
        query_dropout: float,
        n_retrievals: int = 1,
        retrieval_dim: int = 32,
        normalize_geometric: bool = False,
        shared_geometric_scale: bool = True,
        retrieval_scores: str = "dot",
    ):
        super().__init__()
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"attention kind must be one of {ATTENTION_KINDS}, got {kind!r}")
        self.kind, self.n_heads, self.d_head = kind, n_heads, d_model // n_heads
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model, bias=False)
        self.value = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        self.attention_dropout = Dropout(attention_dropout)
        self.query_dropout = Dropout(query_dropout)
        if kind in ("rel", "absrel"):
            self.pos_key = nn.Linear(d_model, d_model, bias=False)  # W_{k,P}
            self.content_bias = nn.Parameter(torch.zeros(n_heads, self.d_head))  # b_{q,E}
            self.pos_bias = nn.Parameter(torch.zeros(n_heads, self.d_head))  # b_{q,P}
        if kind == "absrel":
            self.abs_rel_switch = nn.Linear(d_model, 1)  # Eq. 16: r_i = sigmoid(h_i W_ar + b_ar)
        if kind == "compositional":
            self.add_retrievals(d_model, n_retrievals, retrieval_dim, retrieval_scores)
        if kind == "geometric":
            # Eq. 9-10: direction projections per head; alpha, beta, gamma shared by the heads in the
            # authors' code (the paper is silent), or one set per head.
            self.normalize_geometric = normalize_geometric
            self.direction = nn.Linear(d_model, 2 * n_heads)  # [W_LR; W_RL], [b_LR; b_RL]
            n_scales = 1 if shared_geometric_scale else n_heads
            self.alpha = nn.Parameter(torch.full((n_scales,), 1.0 / math.sqrt(self.d_head)))
            self.beta = nn.Parameter(torch.ones(n_scales))
            self.gamma = nn.Parameter(torch.zeros(n_scales))

    def add_retrievals(
        self, d_model: int, n_retrievals: int, retrieval_dim: int, retrieval_scores: str
    ) -> None:
        """Compositional attention's retrievals (Mittal et al., Eq. 9-11): R values per search."""
        if n_retrievals < 1:
            raise ValueError(f"n_retrievals must be >= 1, got {n_retrievals}")
        if retrieval_scores not in RETRIEVAL_SCORES:
            raise ValueError(f"retrieval_scores must be one of {RETRIEVAL_SCORES}, got {retrieval_scores!r}")
        self.n_retrievals, self.retrieval_dim, self.retrieval_scores = (
            n_retrievals,
            retrieval_dim,
            retrieval_scores,
        )
        self.value = nn.Linear(d_model, n_retrievals * self.d_head)  # W_v1..W_vR (Eq. 9)
        # W̄_q per search (Eq. 11)
        self.retrieval_query = nn.Linear(d_model, self.n_heads * retrieval_dim, bias=False)
        if retrieval_scores == "dot":
            self.retrieval_key = nn.Linear(self.d_head, retrieval_dim, bias=False)  # shared W̄_k (Eq. 11)
        else:
            # the authors' "MLP" (Table 8): one linear map of [retrieval query; retrieved value] to a score
            self.retrieval_score = nn.Linear(retrieval_dim + self.d_head, 1)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, H, N, d_head)
        return x.view(x.shape[0], x.shape[1], self.n_heads, self.d_head).transpose(1, 2)

    def scores(self, h: torch.Tensor, source: torch.Tensor | None = None) -> torch.Tensor:
        """Pre-normalisation attention logits (B, H, N_target, N_source); the keys are `h`'s own or,
        for softmax and compositional attention, another sequence's (`source`: a decoder reading its
        encoder)."""
        n = h.shape[1]
        if source is not None and self.kind not in ("softmax", "compositional"):
            raise ValueError(
                f"{self.kind} attention reads only its own sequence: its positions are relative to it"
            )
        q, k = self.split_heads(self.query(h)), self.split_heads(self.key(h if source is None else source))
        if self.kind in ("softmax", "compositional"):  # compositional: the searches, Eq. 7-8
            return self.query_dropout(q) @ k.transpose(-1, -2) / math.sqrt(self.d_head)
        if self.kind == "geometric":
            # beta D_ij + gamma on the (B, N, 2H) projections before spreading them over (B, H, N, N)
            directions = self.direction(h).view(h.shape[0], n, 2, self.n_heads) * self.beta + self.gamma
            lr, rl = directions.permute(2, 0, 3, 1)  # (B, H, N)
            # Eq. 9
            direction = torch.where(tables_for(n, h.device).source_right, lr[..., :, None], rl[..., :, None])
            return torch.addcmul(
                direction, self.query_dropout(q) @ k.transpose(-1, -2), self.alpha[:, None, None]
            )
        # Eq. 17: (a)+(c) content term, (b)+(d)+(e) positional term with the abs/rel switch r_i.
        content = self.query_dropout(q + self.content_bias[:, None]) @ k.transpose(-1, -2)
        pos_query = self.query_dropout(q + self.pos_bias[:, None])
        offsets = torch.arange(-(n - 1), n, device=h.device)  # i - j for every pair
        rel_keys = self.split_heads(self.pos_key(sinusoids(offsets, h.shape[-1]))[None])[0]  # (H, 2N-1, d)
        rel_all = pos_query @ rel_keys.transpose(-1, -2)  # (B, H, N, 2N-1)
        i = torch.arange(n, device=h.device)
        offset_index = (i[:, None] - i[None, :] + n - 1).expand(*rel_all.shape[:2], n, n)
        positional = rel_all.gather(-1, offset_index)
        if self.kind == "absrel":
            abs_keys = self.split_heads(self.pos_key(sinusoids(i, h.shape[-1]))[None])[0]  # (H, N, d)
            absolute = pos_query @ abs_keys.transpose(-1, -2)
            r = torch.sigmoid(self.abs_rel_switch(h))[:, None]  # (B, 1, N, 1)
            positional = r * positional + (1 - r) * absolute
        return (content + positional) / math.sqrt(self.d_head)

    def forward(
        self,
        h: torch.Tensor,
        key_padding: torch.Tensor,
        mask_self: bool = False,
        source: torch.Tensor | None = None,
        causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h (B, N, D), key_padding (B, M) True at padding -> (output (B, N, D), weights (B, H, N, M)).
        Keys and values come from `source` (B, M, D) where given, else from h (M = N); `causal`:
        position i sees positions up to i only (a decoder's own outputs)."""
        mixed, weights = self.mix(h, key_padding, mask_self, source, causal)
        return self.out(mixed), weights

    def mix(
        self,
        h: torch.Tensor,
        key_padding: torch.Tensor,
        mask_self: bool = False,
        source: torch.Tensor | None = None,
        causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """forward's heads' outputs side by side (B, N, D), before the output projection, and the weights."""
        source_ = h if source is None else source
        logits = self.scores(h, source).masked_fill(key_padding[:, None, None, :], float("-inf"))
        if mask_self:
            logits = logits.masked_fill(
                torch.eye(h.shape[1], dtype=torch.bool, device=h.device), float("-inf")
            )
        if causal:
            logits = logits.masked_fill(
                torch.ones(logits.shape[-2:], dtype=torch.bool, device=h.device).triu(1), float("-inf")
            )
        if self.kind == "geometric":
            weights = geometric_attention_weights(logits, self.normalize_geometric)
        else:
            weights = torch.softmax(logits, dim=-1)
        if self.kind == "compositional":
            mixed = self.compose(h, self.attention_dropout(weights), source_)
        else:
            mixed = self.attention_dropout(weights) @ self.split_heads(self.value(source_))
        return mixed.transpose(1, 2).reshape(h.shape), weights

    def compose(self, h: torch.Tensor, search: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """Eq. 9-13: every search applied to every retrieval, then each search picks its retrievals.
        search (B, S, N, M) -> (B, S, N, d_head); values from `source` (B, M, D), retrieval queries from h."""
        batch, n, _ = h.shape
        # (B, R, M, d)
        values = (
            self.value(source).view(batch, source.shape[1], self.n_retrievals, self.d_head).transpose(1, 2)
        )
        retrieved = torch.einsum("bsij,brjd->bsrid", search, values)  # Retrieval_ij (Eq. 10)
        # (B, S, N, d_r)
        queries = self.retrieval_query(h).view(batch, n, self.n_heads, self.retrieval_dim).transpose(1, 2)
        if self.retrieval_scores == "dot":
            keys = self.retrieval_key(retrieved)  # (B, S, R, N, d_r), Eq. 11-12
            logits = torch.einsum("bsnk,bsrnk->bsnr", queries, keys) / math.sqrt(self.retrieval_dim)
        else:
            pairs = torch.cat([queries[:, :, None].expand(-1, -1, self.n_retrievals, -1, -1), retrieved], -1)
            logits = self.retrieval_score(pairs)[..., 0].transpose(2, 3)  # (B, S, N, R)
        value_scores = torch.softmax(logits, dim=-1)
        self.last_value_scores = value_scores.detach()  # Eq. 13's "value scores", for plots
        return torch.einsum("bsnr,bsrnd->bsnd", value_scores, retrieved)


class FeedForward(nn.Sequential):
    """Eq. 5: W2 max(W1 x + b1, 0) + b2; `fused`: as one op (feed_forward_op.py)."""

    def __init__(self, d_in: int, d_hidden: int, dropout: float, fused: bool = False):
        super().__init__(nn.Linear(d_in, d_hidden), nn.ReLU(), Dropout(dropout), nn.Linear(d_hidden, d_in))
        if fused:
            feed_forward_op.check_sizes(d_in, d_hidden)
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return feed_forward_op.apply(self, x) if self.fused else super().forward(x)


def attention_of(cfg: TransformerConfig, attention: str) -> Attention:
    return Attention(
        attention,
        cfg.d_model,
        cfg.n_heads,
        cfg.attention_dropout,
        cfg.query_dropout,
        cfg.n_retrievals,
        cfg.retrieval_dim,
        cfg.normalize_geometric,
        cfg.shared_geometric_scale,
        cfg.retrieval_scores,
    )


class Layer(nn.Module):
    def __init__(self, cfg: TransformerConfig, attention: str, gated: bool):
        super().__init__()
        d_ff = int(cfg.ff_multiplier * cfg.d_model)
        self.gated = gated
        self.attention = attention_of(cfg, attention)
        self.mask_self = cfg.mask_self
        self.norm_attention = nn.LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg.d_model, d_ff, cfg.dropout, cfg.fused_feed_forward)
        self.dropout = Dropout(cfg.dropout)
        if gated:
            self.gate_drop = GateDrop(cfg.gate_drop)
            self.update_dropout = Dropout(cfg.dropout if cfg.update_dropout else 0.0)
            self.gate = FeedForward(
                cfg.d_model, cfg.d_model, cfg.dropout if cfg.gate_ff_dropout else 0.0, cfg.fused_feed_forward
            )
            nn.init.constant_(self.gate[-1].bias, cfg.gate_bias_init)
            # App. C.3: gated models without geometric attention squash the update with tanh
            # instead of LayerNorm (Eq. 2).
            self.norm_update = nn.LayerNorm(cfg.d_model) if attention == "geometric" else nn.Tanh()
        else:
            self.norm_ff = nn.LayerNorm(cfg.d_model)

    def forward(self, h: torch.Tensor, key_padding: torch.Tensor):
        attended, weights = self.attention(h, key_padding, self.mask_self)
        a = self.norm_attention(h + self.dropout(attended))  # Eq. 1
        if not self.gated:
            return self.norm_ff(a + self.dropout(self.ff(a))), weights, None
        u = self.norm_update(self.update_dropout(self.ff(a)))  # Eq. 2, no residual around the update
        g = torch.sigmoid(self.gate(a))  # Eq. 3
        g = self.gate_drop(g)
        # Eq. 4, g * u + (1 - g) * h, in one kernel; under autocast u and g may be half precision,
        # which lerp does not promote
        return torch.lerp(h, u.to(h.dtype), g.to(h.dtype)), weights, g


class UniversalTransformerClassifier(nn.Module):
    """Embeds '<bos> tokens <eos>', applies one shared layer n_layers times, reads one column out."""

    def __init__(
        self,
        cfg: TransformerConfig,
        attention: str,
        gated: bool,
        vocab_size: int,
        n_classes: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
    ):
        super().__init__()
        if cfg.readout not in ("first", "last"):
            raise ValueError(f"readout must be 'first' or 'last', got {cfg.readout!r}")
        if cfg.act not in ACT_VARIANTS:
            raise ValueError(f"act must be one of {ACT_VARIANTS}, got {cfg.act!r}")
        self.cfg, self.attention_kind = cfg, attention
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.embedding = nn.Embedding(vocab_size, cfg.d_model)
        self.input_dropout = Dropout(cfg.input_dropout)
        self.layer = Layer(cfg, attention, gated)
        self.readout = nn.Linear(cfg.d_model, n_classes)
        if cfg.act != "none":
            self.halting = nn.Linear(cfg.d_model, 1)  # Eq. 11: p = sigmoid(W_H h + b_H)
        self.aux_loss = None  # the ponder cost of the last forward pass, for the training loss

    def add_markers(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # Out of place (cat, scatter), so that torch.func.vmap can batch it over seeds (batched.py).
        bos = torch.full_like(tokens[:, :1], self.bos_id)
        out = torch.cat([bos, tokens, torch.full_like(bos, self.pad_id)], dim=1)
        return out.scatter(1, (lengths + 1)[:, None], torch.full_like(bos, self.eos_id))

    def forward(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        n_layers: int | None = None,
        return_activations: bool = False,
    ):
        """tokens (B, N) PAD-padded without markers, lengths (B,) -> class logits (B, C).

        With return_activations, also {"attention": [per layer (B, H, N+2, N+2)], "gates": [per layer
        (B, N+2, D)]} for plots (gates only for gated variants)."""
        seq = self.add_markers(tokens, lengths)
        key_padding = seq == self.pad_id
        h = self.embedding(seq)
        if self.attention_kind == "softmax":
            h = h + sinusoids(torch.arange(seq.shape[1], device=seq.device), h.shape[-1])
        h = self.input_dropout(h)
        if n_layers is None:
            n_layers = (
                self.cfg.n_layers
                if self.training or self.cfg.eval_n_layers is None
                else self.cfg.eval_n_layers
            )
        activations = {"attention": [], "gates": []}

        def step(h):
            h, weights, gate = self.layer(h, key_padding)
            if return_activations:
                activations["attention"].append(weights.detach())
                if gate is not None:
                    activations["gates"].append(gate.detach())
            return h

        if self.cfg.act == "none":
            for _ in range(n_layers):
                h = step(h)
        else:
            h, remainders, steps = self.adaptive(h, key_padding, n_layers, step)
            self.aux_loss = self.cfg.act_loss_weight * remainders.mean()
            activations["steps"] = steps
        column = lengths + 1 if self.cfg.readout == "last" else torch.zeros_like(lengths)
        logits = self.readout(h[torch.arange(len(lengths), device=h.device), column])
        return (logits, activations) if return_activations else logits

    def adaptive(self, h: torch.Tensor, key_padding: torch.Tensor, max_steps: int, step):
        """Adaptive computation time per column (App. A, Eq. 11-15). Every column keeps being updated
        while any is running (others attend to it); what halts is its output o_i = sum_t p^_it h_it,
        with p^ = p before the halting step T_i and the remainder R_i = 1 - sum_{t<T_i} p_it at it.
        "graves" forces every running column to halt at the last step; "dehghani" (Universal
        Transformers) does not, and mixes o <- w h + (1 - w) o. Padding starts halted.
        -> (outputs, remainders (B, N), steps per column)."""
        running = ~key_padding
        accumulated = torch.zeros(h.shape[:2], device=h.device)
        remainders = torch.zeros_like(accumulated)
        steps = torch.zeros_like(accumulated)
        output = torch.zeros_like(h)
        for t in range(max_steps):
            p = torch.sigmoid(self.halting(h))[..., 0]
            halts = running & (accumulated + p >= self.cfg.act_threshold)
            if self.cfg.act == "graves" and t == max_steps - 1:
                halts = running
            continues = running & ~halts
            weight = torch.where(continues, p, 0.0) + torch.where(halts, 1 - accumulated, 0.0)
            remainders = remainders + torch.where(halts, 1 - accumulated, 0.0)
            accumulated = accumulated + torch.where(continues, p, 0.0)
            steps = steps + running.float()
            h = step(h)
            w = weight[..., None]
            output = output + w * h if self.cfg.act == "graves" else w * h + (1 - w) * output
            running = continues
            if not running.any():
                break
        return output, remainders, steps


class UniversalTransformerSetRegressor(nn.Module):
    """A set of feature vectors -> one scalar per element, through the same shared-weight layers.

    No positional information: the input is a set. Used for contextual retrieval (Mittal et al.).
    The features are embedded by a one-hidden-layer MLP: attending to the nearest element on a scalar
    feature needs -(z_i - z_j)^2 as a score, whose key term -z_j^2 no linear embedding provides."""

    def __init__(self, cfg: TransformerConfig, attention: str, n_features: int):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Sequential(
            nn.Linear(n_features, cfg.d_model), nn.ReLU(), nn.Linear(cfg.d_model, cfg.d_model)
        )
        self.layer = Layer(cfg, attention, gated=False)
        self.readout = nn.Linear(cfg.d_model, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        h = self.embed(features)
        no_padding = torch.zeros(h.shape[:2], dtype=torch.bool, device=h.device)
        for _ in range(self.cfg.n_layers):
            h, _, _ = self.layer(h, no_padding)
        return self.readout(h)[..., 0]


class PreNormLayer(nn.Module):
    """The Compositional Attention authors' block: each sublayer reads a LayerNorm of its input and
    adds to it, x + Attention(LN(x)), then x + FF(LN(x)), dropout inside and after the feed-forward."""

    def __init__(self, cfg: TransformerConfig, attention: str):
        super().__init__()
        self.attention = attention_of(cfg, attention)
        self.norm_attention, self.norm_ff = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.ff = FeedForward(
            cfg.d_model, int(cfg.ff_multiplier * cfg.d_model), cfg.dropout, cfg.fused_feed_forward
        )
        self.dropout = Dropout(cfg.dropout)

    def forward(self, h: torch.Tensor, key_padding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attended, weights = self.attention(self.norm_attention(h), key_padding)
        h = h + attended
        return h + self.dropout(self.ff(self.norm_ff(h))), weights


class ImageQuestionTransformer(nn.Module):
    """The Compositional Attention paper's Sort-of-CLEVR model (Sec. 4.2, App. C.2, the authors'
    `Sort-of-CLEVR/model.py`): 15 x 15 patches of the image, each embedded by one convolution to
    d/2 plus sinusoidal positions (Vaswani et al.'s; the authors' code scales its own by
    1/(1 + e^-1) and lets their frequencies fall twice as fast), after a learnt summary token; the
    question, embedded to d/2, is appended to every token, and one map to d mixes the two. One
    pre-norm layer applied n_layers times (shared weights; the paper's 4), then the summary
    token's column is classified.
    Without a question (n_question 0: equilateral triangles, App. C.3, the authors'
    `Equilateral-Detection/model.py`) the patches (4 x 4 of one channel there) are embedded to d."""

    def __init__(
        self,
        cfg: TransformerConfig,
        attention: str,
        n_question: int,
        n_classes: int,
        patch: int = 15,
        channels: int = 3,
    ):
        super().__init__()
        if n_question and cfg.d_model % 2:
            raise ValueError(f"d_model={cfg.d_model} must be even: image and question get half each")
        self.cfg = cfg
        width = cfg.d_model // 2 if n_question else cfg.d_model
        self.patches = nn.Conv2d(channels, width, kernel_size=patch, stride=patch)
        self.summary = nn.Parameter(torch.randn(1, 1, width))
        self.question = nn.Linear(n_question, width) if n_question else None
        self.mix = nn.Linear(cfg.d_model, cfg.d_model) if n_question else None
        self.layer = PreNormLayer(cfg, attention)
        self.readout = nn.Linear(cfg.d_model, n_classes)

    def forward(
        self, images: torch.Tensor, questions: torch.Tensor | None = None, return_activations: bool = False
    ):
        """images (B, H, W, channels) uint8, questions (B, n_question) -> class logits (B, C)."""
        # (B, P, width)
        x = (
            self.patches(images.permute(0, 3, 1, 2).to(self.patches.weight.dtype) / 255)
            .flatten(2)
            .transpose(1, 2)
        )
        x = x + sinusoids(torch.arange(x.shape[1], device=x.device), x.shape[-1])
        x = torch.cat([self.summary.expand(len(x), -1, -1), x], 1)
        h = (
            x
            if self.question is None
            else self.mix(torch.cat([x, self.question(questions)[:, None].expand(-1, x.shape[1], -1)], -1))
        )
        no_padding = torch.zeros(h.shape[:2], dtype=torch.bool, device=h.device)
        attention = []
        for _ in range(self.cfg.n_layers):
            h, weights = self.layer(h, no_padding)
            attention.append(weights.detach())
        logits = self.readout(h[:, 0])
        return (logits, {"attention": attention}) if return_activations else logits
