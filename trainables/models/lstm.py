"""LSTM and bidirectional LSTM classifiers, the NDR paper's recurrent baselines (no begin/end tokens),
and an LSTM that answers after every token (Dyck)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from .configs import LSTMConfig
from .dropout import Dropout


class LSTM(nn.LSTM):
    """nn.LSTM, in float32 on the CPU under bf16 autocast: oneDNN builds no bf16 LSTM on a CPU
    without bf16 instructions ("could not create a primitive descriptor for the LSTM forward
    propagation primitive" on an AMD EPYC without AVX-512). On a GPU autocast applies as to any layer."""

    def forward(self, input, hx=None):
        data = input.data if isinstance(input, PackedSequence) else input
        if data.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
            return super().forward(input, hx)
        with torch.autocast("cpu", enabled=False):
            input = input._replace(data=data.float()) if isinstance(input, PackedSequence) else data.float()
            return super().forward(input, None if hx is None else tuple(h.float() for h in hx))


class LSTMClassifier(nn.Module):
    # no begin/end tokens
    def __init__(
        self, cfg: LSTMConfig, bidirectional: bool, vocab_size: int, n_classes: int, pad_id: int, **_markers
    ):
        super().__init__()
        hidden = cfg.d_model // 2 if bidirectional else cfg.d_model
        self.embedding = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        self.dropout = Dropout(cfg.dropout)
        self.lstm = LSTM(
            cfg.d_model,
            hidden,
            num_layers=cfg.n_layers,
            batch_first=True,
            bidirectional=bidirectional,
            dropout=cfg.dropout if cfg.n_layers > 1 else 0.0,
        )
        self.readout = nn.Linear(hidden * (2 if bidirectional else 1), n_classes)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.embedding(tokens))
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)
        # h_n holds each direction's state after its last real token: forward at the end of the
        # sequence, backward at the start.
        top = h_n[-2:] if self.lstm.bidirectional else h_n[-1:]
        return self.readout(self.dropout(torch.cat(list(top), dim=-1)))


class LSTMTagger(nn.Module):
    """An LSTM that answers after every input token (Dyck's next-symbol sets: one logit per symbol)."""

    def __init__(self, cfg: LSTMConfig, vocab_size: int, n_outputs: int, pad_id: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        self.dropout = Dropout(cfg.dropout)
        self.lstm = LSTM(
            cfg.d_model,
            cfg.d_model,
            num_layers=cfg.n_layers,
            batch_first=True,
            dropout=cfg.dropout if cfg.n_layers > 1 else 0.0,
        )
        self.readout = nn.Linear(cfg.d_model, n_outputs)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # causal: padding after a sequence changes nothing before it
        out, _ = self.lstm(self.dropout(self.embedding(tokens)))
        return self.readout(self.dropout(out))
