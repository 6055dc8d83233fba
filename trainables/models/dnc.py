"""Differentiable Neural Computer (Graves et al., 2016), the NDR paper's memory baseline (Table 1).

An LSTM controller reads [input, previous read vectors] and emits an interface vector that drives
one write head and `n_read_heads` read heads over `n_cells` memory words (Graves et al., Methods).
With the improvements of Csordás & Schmidhuber (2019), as the NDR authors ran them:
  deallocate:        freed cells are erased too (the erase matrix is scaled by the retention psi),
                     so content lookup cannot find stale words;
  sharpen_links:     each read head raises its forward/backward link weighting to a learned power
                     (oneplus) and renormalises it;
  masked_addressing: keys and memory are masked before the cosine similarity (off in the authors'
                     runs; an option here).
The classifier embeds tokens (no begin/end tokens), runs the DNC over them and reads the class from
the output at the last real token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .configs import DNCConfig
from .dropout import Dropout

EPS = 1e-6


def oneplus(x: torch.Tensor) -> torch.Tensor:
    return 1 + F.softplus(x)


def content_weights(
    memory: torch.Tensor, keys: torch.Tensor, strengths: torch.Tensor, masks: torch.Tensor | None
) -> torch.Tensor:
    """C(M, k, beta)[i] = softmax_i(beta cos(M[i], k)); memory (B, N, W), keys (B, H, W) -> (B, H, N)."""
    memory = memory[:, None]  # (B, 1, N, W)
    keys = keys[:, :, None]  # (B, H, 1, W)
    if masks is not None:
        memory, keys = memory * masks[:, :, None], keys * masks[:, :, None]
    cosine = (memory * keys).sum(-1) / (memory.norm(dim=-1) * keys.norm(dim=-1) + EPS)
    return torch.softmax(strengths[..., None] * cosine, dim=-1)


def allocation_weights(usage: torch.Tensor) -> torch.Tensor:
    """a[phi_j] = (1 - u[phi_j]) prod_{k<j} u[phi_k], phi sorting usage ascending (free cells first)."""
    usage = usage * (1 - EPS) + EPS  # keeps the products apart from exact zeros
    sorted_usage, order = usage.sort(-1)
    before = torch.cumprod(
        torch.cat([torch.ones_like(sorted_usage[..., :1]), sorted_usage[..., :-1]], -1), -1
    )
    return torch.zeros_like(usage).scatter(-1, order, (1 - sorted_usage) * before)


def sharpen(weights: torch.Tensor, power: torch.Tensor) -> torch.Tensor:
    """Csordás & Schmidhuber's sharpness control: (d / max d)^s, renormalised; weights (B, H, N),
    power (B, H)."""
    weights = weights + EPS
    weights = (weights / weights.amax(-1, keepdim=True)) ** power[..., None]
    return weights / weights.sum(-1, keepdim=True).clamp_min(EPS)


class DNCMemory(nn.Module):
    """The memory and its heads: one step from the previous state and the interface vector."""

    def __init__(self, cfg: DNCConfig):
        super().__init__()
        self.cfg, self.words = cfg, cfg.word_size or cfg.d_model
        R, W = cfg.n_read_heads, self.words
        self.sizes = {
            "read_keys": R * W,
            "read_strengths": R,
            "write_key": W,
            "write_strength": 1,
            "erase": W,
            "write": W,
            "free_gates": R,
            "allocation_gate": 1,
            "write_gate": 1,
            "read_modes": 3 * R,
        }
        if cfg.sharpen_links:
            self.sizes["sharpness"] = 2 * R
        if cfg.masked_addressing:
            self.sizes.update(read_masks=R * W, write_mask=W)

    @property
    def interface_size(self) -> int:
        return sum(self.sizes.values())

    def initial_state(self, batch: int, device) -> dict[str, torch.Tensor]:
        N, R, W = self.cfg.n_cells, self.cfg.n_read_heads, self.words
        zeros = lambda *shape: torch.zeros(batch, *shape, device=device)
        return {
            "memory": zeros(N, W),
            "usage": zeros(N),
            "precedence": zeros(N),
            "links": zeros(N, N),
            "read_weights": zeros(R, N),
            "write_weights": zeros(N),
            "reads": zeros(R, W),
        }

    def interface(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split and squash the raw interface vector (Graves et al., Methods, 'Interface parameters')."""
        B, R, W = vector.shape[0], self.cfg.n_read_heads, self.words
        raw = dict(zip(self.sizes, vector.split(list(self.sizes.values()), -1)))
        out = {
            "read_keys": raw["read_keys"].view(B, R, W),
            "read_strengths": oneplus(raw["read_strengths"]),
            "write_key": raw["write_key"],
            "write_strength": oneplus(raw["write_strength"]),
            "erase": torch.sigmoid(raw["erase"]),
            "write": raw["write"],
            "free_gates": torch.sigmoid(raw["free_gates"]),
            "allocation_gate": torch.sigmoid(raw["allocation_gate"]),
            "write_gate": torch.sigmoid(raw["write_gate"]),
            "read_modes": torch.softmax(raw["read_modes"].view(B, R, 3), -1),  # backward, content, forward
        }
        if "sharpness" in raw:
            out["sharpness"] = oneplus(raw["sharpness"]).view(B, 2, R)
        if "read_masks" in raw:
            out["read_masks"] = torch.sigmoid(raw["read_masks"].view(B, R, W))
            out["write_mask"] = torch.sigmoid(raw["write_mask"])
        return out

    def forward(self, state: dict[str, torch.Tensor], xi: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        memory, links = state["memory"], state["links"]
        # Usage: what was written stays in use unless the free gates release what was read.
        retention = torch.prod(1 - xi["free_gates"][..., None] * state["read_weights"], dim=1)  # psi (B, N)
        previous_write = state["write_weights"].detach()  # usage is bookkeeping: no gradient, as the authors'
        usage = (state["usage"] + previous_write - state["usage"] * previous_write) * retention
        write_mask = xi["write_mask"][:, None] if "write_mask" in xi else None
        write_content = content_weights(memory, xi["write_key"][:, None], xi["write_strength"], write_mask)[
            :, 0
        ]
        write_weights = xi["write_gate"] * (
            xi["allocation_gate"] * allocation_weights(usage) + (1 - xi["allocation_gate"]) * write_content
        )
        erase = 1 - write_weights[..., None] * xi["erase"][:, None]
        if self.cfg.deallocate:
            erase = erase * retention[..., None]
        memory = memory * erase + write_weights[..., None] * xi["write"][:, None]
        # Temporal links: L[i, j] says cell i was written right after cell j.
        w_i, w_j = write_weights[:, :, None], write_weights[:, None, :]
        eye = torch.eye(links.shape[-1], device=links.device)
        links = ((1 - w_i - w_j) * links + w_i * state["precedence"][:, None, :]) * (1 - eye)
        precedence = (1 - write_weights.sum(-1, keepdim=True)) * state["precedence"] + write_weights
        forward = torch.einsum("bij,brj->bri", links, state["read_weights"])
        backward = torch.einsum("bij,bri->brj", links, state["read_weights"])
        if "sharpness" in xi:
            forward, backward = (
                sharpen(forward, xi["sharpness"][:, 0]),
                sharpen(backward, xi["sharpness"][:, 1]),
            )
        read_content = content_weights(memory, xi["read_keys"], xi["read_strengths"], xi.get("read_masks"))
        modes = xi["read_modes"]
        read_weights = modes[..., 0:1] * backward + modes[..., 1:2] * read_content + modes[..., 2:3] * forward
        return {
            "memory": memory,
            "usage": usage,
            "precedence": precedence,
            "links": links,
            "read_weights": read_weights,
            "write_weights": write_weights,
            "reads": read_weights @ memory,
        }


class DNCClassifier(nn.Module):
    # no begin/end tokens
    def __init__(self, cfg: DNCConfig, vocab_size: int, n_classes: int, pad_id: int, **_markers):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(vocab_size, cfg.embedding_size, padding_idx=pad_id)
        self.dropout = Dropout(cfg.dropout)
        self.memory = DNCMemory(cfg)
        reads = cfg.n_read_heads * self.memory.words
        self.controller = nn.LSTMCell(cfg.embedding_size + reads, cfg.d_model)
        self.to_interface = nn.Linear(cfg.d_model, self.memory.interface_size)
        self.controller_out = nn.Linear(cfg.d_model, cfg.d_model)
        self.reads_out = nn.Linear(reads, cfg.d_model, bias=False)
        self.readout = nn.Linear(cfg.d_model, n_classes)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embedding(tokens))
        batch = tokens.shape[0]
        state = self.memory.initial_state(batch, tokens.device)
        h = c = torch.zeros(batch, self.cfg.d_model, device=tokens.device)
        outputs = []
        for t in range(tokens.shape[1]):
            h, c = self.controller(torch.cat([x[:, t], state["reads"].flatten(1)], -1), (h, c))
            xi = self.to_interface(h).clamp(-self.cfg.clip_controls, self.cfg.clip_controls)
            state = self.memory(state, self.memory.interface(xi))
            outputs.append(self.controller_out(h) + self.reads_out(state["reads"].flatten(1)))
        last = torch.stack(outputs, 1)[torch.arange(batch, device=tokens.device), lengths - 1]
        return self.readout(last)
