"""Sequence-to-sequence baselines for PANM's algorithmic tasks: LSTM and Transformer encoder-decoders.

Like PANM here, the decoder gets no token input (z_t = 0, no teacher forcing): an LSTM decoder
starts from the encoder's final state, a Transformer decoder sees only output positions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .panm import SequenceEncoder
from .transformer import sinusoids


@dataclass
class Seq2SeqConfig:
    d_model: int = 256
    n_layers: int = 1  # the PANM paper found 1 layer best for its baselines on Copy
    n_heads: int = 4  # Transformer only
    ff_multiplier: float = 2.0  # Transformer only
    dropout: float = 0.0


class LSTMSeq2Seq(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig, vocab_size: int, n_features: int = 0):
        super().__init__()
        self.encoder = SequenceEncoder("lstm", vocab_size, n_features, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.dropout)
        self.decoder = nn.LSTM(cfg.d_model, cfg.d_model, num_layers=cfg.n_layers, batch_first=True)
        self.output = nn.Linear(cfg.d_model, vocab_size)

    def forward(self, tokens, lengths, n_steps: int, token_features=None):
        memory = self.encoder(tokens, lengths, token_features)
        last = memory[torch.arange(len(lengths), device=tokens.device), lengths - 1]
        start = last[None].expand(self.decoder.num_layers, -1, -1).contiguous()
        zeros = torch.zeros(len(lengths), n_steps, memory.shape[-1], device=tokens.device)
        out, _ = self.decoder(zeros, (start, torch.zeros_like(start)))
        return self.output(out)


class TransformerSeq2Seq(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig, vocab_size: int, n_features: int = 0):
        super().__init__()
        self.encoder = SequenceEncoder("transformer", vocab_size, n_features, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.dropout)
        layer = nn.TransformerDecoderLayer(cfg.d_model, cfg.n_heads, int(cfg.ff_multiplier * cfg.d_model), cfg.dropout, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, cfg.n_layers)
        self.output = nn.Linear(cfg.d_model, vocab_size)

    def forward(self, tokens, lengths, n_steps: int, token_features=None):
        memory = self.encoder(tokens, lengths, token_features)
        padding = torch.arange(tokens.shape[1], device=tokens.device)[None] >= lengths[:, None]
        queries = sinusoids(torch.arange(n_steps, device=tokens.device), memory.shape[-1])[None].expand(len(lengths), -1, -1)
        return self.output(self.decoder(queries, memory, memory_key_padding_mask=padding))
