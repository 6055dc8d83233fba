"""Pointer-Augmented Neural Memory (Le et al.): sequence to sequence with explicit pointers.

An encoder writes the input into memory M (one slot per token). Each slot is bound to a b-bit binary
address A[n] = (p_B + n) mod 2^b, where the base p_B is drawn uniformly during training (so every
address is seen) and is 0 at evaluation. Per decoding step t:
  Pointer Units (Eq. 1-3), one GRU per Mode-1 head:   h_t = GRU(p_{t-1}, h_{t-1}),
      w_t[n] = softmax_n cos(h_t, g^a(A[n])),  p_t = A w_t  (a soft address),
  Mode-1 dereference:                                  *p_t = M w_t,
  Mode-2 relational access (Eq. 4-6), per head:        q_t = g^c([*p_t^a ...]),
      w_t^c[n] = softmax_n cos(q_t, M[n]),  *p_t^c = M w_t^c,
  Controller (Eq. 7 and the output MLP):               h_t^c = GRU([*p^a..., *p^c..., z_t], h_{t-1}^c),
      y_t = g^o([*p^a..., *p^c..., h_t^c]),  h_0^c = sum_n M[n] (Eq. 7; `controller_start: last`
      starts from the encoder's state at the last token, as the authors' code does). The authors'
      code feeds its Controller GRU the Mode-1 values only and the Mode-2 values to g^o alone
      (baselines/panm.py): `controller_reads_mode2: false`; by default the GRU reads both (Eq. 7).
The decoder input z_t is zero, as in the paper's algorithmic experiments (no teacher forcing); on
SCAN it is a Transformer decoder's output (App. D.3; enc_dec.py).
On Dyck (Sec. 3.2, App. D.2: `CausalPANM`) there is no encoder: the memory holds the raw symbols
(one-hot), each step sees the slots up to its own, z_t is the current symbol, and the Controller's
recurrent core is the stack RNN it is compared with (`controller: srnn`) or an LSTM.
Mode-1 pointers start at the base, end and middle addresses (H^a = 1, 2, 3). MLPs have one hidden
layer of 128 units; GRUs have 256.

Eq. 2 and 5 take a softmax of cosine similarities, which lie in [-1, 1] and cannot make a sharp
distribution over tens of slots; we multiply them by a learned inverse temperature (`sharpness`).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from .configs import PANMConfig
from .dropout import Dropout
from .lstm import LSTM
from .stack_rnn import StackRNNCell
from .transformer import sinusoids


def address_bank(base: torch.Tensor, length: int, bits: int) -> torch.Tensor:
    """(B,) base addresses -> (B, length, bits) binary codes of (base + n) mod 2^bits, MSB first."""
    n = (base[:, None] + torch.arange(length, device=base.device)[None]) % (2**bits)
    powers = 2 ** torch.arange(bits - 1, -1, -1, device=base.device)
    return ((n[..., None] // powers) % 2).float()


def initial_pointers(bank: torch.Tensor, lengths: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """The first pointers of the Mode-1 heads: base, end and middle addresses of each sequence."""
    rows = torch.arange(len(lengths), device=bank.device)
    slots = [torch.zeros_like(lengths), lengths - 1, (lengths - 1) // 2][:heads]
    return [bank[rows, s] for s in slots]


def dereference(weights: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
    """*p = M w: (B, L) weights over slots, (B, L, D) memory -> (B, D)."""
    return torch.einsum("bl,bld->bd", weights, memory)


def cosine_attention(
    query: torch.Tensor, keys: torch.Tensor, padding: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """softmax over slots of scale * cos(query, key): (B, D), (B, L, D) -> (B, L)."""
    cos = torch.einsum("bd,bld->bl", F.normalize(query, dim=-1), F.normalize(keys, dim=-1))
    return torch.softmax((scale * cos).masked_fill(padding, float("-inf")), dim=-1)


def mlp(d_in: int, d_hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_out))


class SequenceEncoder(nn.Module):
    """Tokens (+ optional per-token features) -> one memory slot per token."""

    def __init__(
        self,
        kind: str,
        vocab_size: int,
        n_features: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        dropout: float,
    ):
        super().__init__()
        if kind not in ("lstm", "transformer"):
            raise ValueError(f"encoder must be 'lstm' or 'transformer', got {kind!r}")
        self.kind = kind
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.features = nn.Linear(n_features, d_model) if n_features else None
        if kind == "lstm":
            self.net = LSTM(
                d_model,
                d_model,
                num_layers=n_layers,
                batch_first=True,
                dropout=dropout if n_layers > 1 else 0.0,
            )
        else:
            layer = nn.TransformerEncoderLayer(d_model, n_heads, 2 * d_model, dropout, batch_first=True)
            self.net = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)

    def forward(
        self, tokens: torch.Tensor, lengths: torch.Tensor, token_features: torch.Tensor | None
    ) -> torch.Tensor:
        x = self.embedding(tokens)
        if self.features is not None:
            x = x + self.features(token_features)
        padding = torch.arange(tokens.shape[1], device=tokens.device)[None] >= lengths[:, None]
        if self.kind == "lstm":
            packed = nn.utils.rnn.pack_padded_sequence(
                x, lengths.cpu(), batch_first=True, enforce_sorted=False
            )
            out, _ = self.net(packed)
            return nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])[0]
        x = x + sinusoids(torch.arange(tokens.shape[1], device=tokens.device), x.shape[-1])
        return self.net(x, src_key_padding_mask=padding)


class PointerDecoder(nn.Module):
    """Pointer Units, Mode-2 access, Controller and output MLP (Eq. 1-7) over a given memory: the
    decoding half of PANM, which the SCAN model puts on a Transformer decoder (enc_dec.py). With
    `input_size` > 0 each step's controller also reads a decoder input z_t (Eq. 7)."""

    def __init__(self, cfg: PANMConfig, vocab_size: int, input_size: int = 0):
        super().__init__()
        if cfg.controller_start not in ("sum", "last"):
            raise ValueError(f"controller_start must be 'sum' or 'last', got {cfg.controller_start!r}")
        if cfg.controller not in ("gru", "lstm", "srnn"):
            raise ValueError(f"controller must be 'gru', 'lstm' or 'srnn', got {cfg.controller!r}")
        self.cfg = cfg
        d, b = cfg.d_model, cfg.address_bits
        self.pointer_size = cfg.pointer_hidden or cfg.hidden
        self.pointer_units = nn.ModuleList(nn.GRUCell(b, self.pointer_size) for _ in range(cfg.mode1_heads))
        # g^a
        self.address_keys = nn.ModuleList(
            mlp(b, cfg.mlp_hidden, self.pointer_size) for _ in range(cfg.mode1_heads)
        )
        # Mode-2 queries come from the Mode-1 values (Eq. 4); with no Mode-1 head, from the controller.
        query_in = cfg.mode1_heads * d or cfg.hidden
        # g^c
        self.mode2_queries = nn.ModuleList(mlp(query_in, cfg.mlp_hidden, d) for _ in range(cfg.mode2_heads))
        read = (cfg.mode1_heads + cfg.mode2_heads) * d  # g^o reads every head's value
        core_read = (cfg.mode1_heads + cfg.mode2_heads * cfg.controller_reads_mode2) * d
        core_in = max(core_read + input_size, 1)
        if cfg.controller == "srnn":
            self.controller = StackRNNCell(core_in, cfg.hidden, cfg.stack_size, cfg.stack_dim)
        else:
            self.controller = (nn.GRUCell if cfg.controller == "gru" else nn.LSTMCell)(core_in, cfg.hidden)
        # Eq. 7 puts a memory slot's sum in the controller's state: only a size mismatch needs a map.
        self.controller_start = nn.Identity() if d == cfg.hidden else nn.Linear(d, cfg.hidden, bias=False)
        self.output = mlp(read + cfg.hidden, cfg.mlp_hidden, vocab_size)  # g^o
        self.log_sharpness = nn.Parameter(torch.full((2,), math.log(cfg.sharpness)))

    def begin(self, memory: torch.Tensor, lengths: torch.Tensor, trace: bool = False) -> dict:
        """The decoding state before the first step, over memory (B, L, D) of `lengths` slots; with
        `trace`, each step's attention weights are kept (the report's pointer maps)."""
        batch, length = memory.shape[:2]
        padding = torch.arange(length, device=memory.device)[None] >= lengths[:, None]
        if self.training:
            base = torch.randint(0, 2**self.cfg.address_bits, (batch,), device=memory.device)
        else:
            base = torch.zeros(batch, dtype=torch.long, device=memory.device)
        bank = address_bank(base, length, self.cfg.address_bits).to(memory.dtype)
        if self.cfg.controller_start == "sum":
            start = memory.masked_fill(padding[..., None], 0.0).sum(1)
        else:
            start = memory[torch.arange(batch, device=memory.device), lengths - 1]
        return {
            "memory": memory,
            "padding": padding,
            "bank": bank,
            "keys": [g(bank) for g in self.address_keys],
            "pointers": initial_pointers(bank, lengths, self.cfg.mode1_heads),
            "states": [
                torch.zeros(batch, self.pointer_size, device=memory.device)
                for _ in range(self.cfg.mode1_heads)
            ],
            "control": self.initial_control(self.controller_start(start)),
            "mode1": [] if trace else None,
            "mode2": [] if trace else None,
        }

    def initial_control(self, h: torch.Tensor):
        """The core's state from h_0^c: the GRU's is h itself; an LSTM's adds a zero cell, the stack
        RNN an empty stack."""
        if self.cfg.controller == "lstm":
            return h, torch.zeros_like(h)
        return self.controller.initial(h) if self.cfg.controller == "srnn" else h

    def control_of(self, state: dict) -> torch.Tensor:
        """h_t^c, what the Controller's output and queries read."""
        return state["control"] if self.cfg.controller == "gru" else state["control"][0]

    def step(self, state: dict, z: torch.Tensor | None = None) -> torch.Tensor:
        """One decoding step (B,) -> logits (B, vocab); `state` moves on (its attention weights
        appended where traced)."""
        memory, padding, bank = state["memory"], state["padding"], state["bank"]
        sharp_a, sharp_c = self.log_sharpness.exp()
        mode1 = []
        for h, unit in enumerate(self.pointer_units):
            state["states"][h] = unit(state["pointers"][h], state["states"][h])  # Eq. 1
            w = cosine_attention(state["states"][h], state["keys"][h], padding, sharp_a)  # Eq. 2
            state["pointers"][h] = torch.einsum("bl,blk->bk", w, bank)  # Eq. 3
            mode1.append((w, dereference(w, memory)))
        query_source = torch.cat([v for _, v in mode1], -1) if mode1 else self.control_of(state)
        mode2 = []
        for g in self.mode2_queries:
            w = cosine_attention(g(query_source), memory, padding, sharp_c)  # Eq. 5
            mode2.append((w, dereference(w, memory)))  # Eq. 6
        values = [v for _, v in mode1 + mode2]
        read = (values if self.cfg.controller_reads_mode2 else values[: len(mode1)]) + (
            [z] if z is not None else []
        )
        read = torch.cat(read, -1) if read else memory.new_zeros(len(memory), 1)
        state["control"] = self.controller(read, state["control"])  # Eq. 7
        if state["mode1"] is not None:
            state["mode1"].append(torch.stack([w for w, _ in mode1], 1) if mode1 else None)
            state["mode2"].append(torch.stack([w for w, _ in mode2], 1) if mode2 else None)
        return self.output(torch.cat(values + [self.control_of(state)], -1))


class PANM(PointerDecoder):
    def __init__(self, cfg: PANMConfig, vocab_size: int, n_features: int = 0):
        super().__init__(cfg, vocab_size)
        self.encoder = SequenceEncoder(
            cfg.encoder, vocab_size, n_features, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.dropout
        )
        self.dropout = Dropout(cfg.dropout)

    def forward(
        self,
        tokens,
        lengths,
        n_steps: int,
        token_features=None,
        target_lengths=None,
        return_activations: bool = False,
    ):
        """-> (B, n_steps, vocab) logits; with return_activations also the per-step attention weights.
        The decoder input z_t is zero (the algorithmic tasks: no teacher forcing). A step never
        reads a later one, so `target_lengths` (each sample's own output length) is not needed."""
        state = self.begin(
            self.dropout(self.encoder(tokens, lengths, token_features)), lengths, trace=return_activations
        )
        out = torch.stack([self.step(state) for _ in range(n_steps)], 1)
        return (out, {"mode1": state["mode1"], "mode2": state["mode2"]}) if return_activations else out


class CausalPANM(PointerDecoder):
    """PANM on Dyck: after each symbol, a logit per symbol that may come next (see the module's docstring)."""

    def __init__(self, cfg: PANMConfig, vocab_size: int, n_outputs: int):
        super().__init__(dataclasses.replace(cfg, d_model=vocab_size), n_outputs, input_size=vocab_size)
        self.vocab_size = vocab_size

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, return_activations: bool = False):
        memory = F.one_hot(tokens, self.vocab_size).float()
        # at t = 0 only slot 0 is visible: every pointer starts there
        state = self.begin(memory, torch.ones_like(lengths), trace=return_activations)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        out = []
        for t in range(tokens.shape[1]):
            state["padding"] = (positions > t)[None].expand(len(tokens), -1)
            out.append(self.step(state, memory[:, t]))
        out = torch.stack(out, 1)
        return (out, {"mode1": state["mode1"], "mode2": state["mode2"]}) if return_activations else out
