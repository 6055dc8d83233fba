"""The PANM paper's sequence-to-sequence baselines for its algorithmic tasks, shaped as the authors'
code (about 1.1M parameters each at the presets' sizes, as App. D.1 says):

  LSTM:        one LSTM reads the input (one-hot tokens and any token features), then goes on from
               the state it ended in (every layer's h and c) over one zero input per output token.
  Transformer: encoder-only; the input's embeddings followed by one blank position per output
               token pass through a Transformer encoder (no mask between them), and the blanks'
               outputs are the prediction.

Like PANM here, neither gets the target as input (no teacher forcing).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from .configs import Seq2SeqConfig
from .dropout import Dropout
from .lstm import LSTM
from .transformer import sinusoids


class LSTMSeq2Seq(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig, vocab_size: int, n_features: int = 0):
        super().__init__()
        self.vocab_size = vocab_size
        self.lstm = LSTM(
            vocab_size + n_features,
            cfg.d_model,
            num_layers=cfg.n_layers,
            batch_first=True,
            dropout=cfg.dropout if cfg.n_layers > 1 else 0.0,
        )
        self.dropout = Dropout(cfg.dropout)
        self.output = nn.Linear(cfg.d_model, vocab_size)

    def forward(self, tokens, lengths, n_steps: int, token_features=None, target_lengths=None):
        """-> (B, n_steps, vocab); a recurrent decoder's step t never reads a later one, so each
        sample's outputs are its own whatever the batch's longest target (`target_lengths` unused)."""
        x = F.one_hot(tokens, self.vocab_size).float()
        if token_features is not None:
            x = torch.cat([x, token_features], -1)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, state = self.lstm(packed)  # each layer's (h, c) after each sample's own last token
        out, _ = self.lstm(x.new_zeros(len(lengths), n_steps, x.shape[-1]), state)
        return self.output(self.dropout(out))


class TransformerSeq2Seq(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig, vocab_size: int, n_features: int = 0):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, cfg.d_model)
        self.features = nn.Linear(n_features, cfg.d_model) if n_features else None
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.n_heads, int(cfg.ff_multiplier * cfg.d_model), cfg.dropout, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.output = nn.Linear(cfg.d_model, vocab_size)

    def forward(self, tokens, lengths, n_steps: int, token_features=None, target_lengths=None):
        """-> (B, n_steps, vocab). Sample b has one blank per output token it is asked for
        (`target_lengths`, else n_steps each), as in the authors' batches of one length: the blanks
        past its own are padding, so its outputs do not depend on the batch's longest target."""
        x = self.embedding(tokens)
        if self.features is not None:
            x = x + self.features(token_features)
        # Sample b's input sits at positions 0..len_b-1 and its blanks right after it, so every
        # sample's blanks carry the same positions whatever the batch's longest input.
        width = tokens.shape[1] + n_steps
        positions = torch.arange(width, device=tokens.device)
        is_input = positions[None] < lengths[:, None]
        h = torch.where(is_input[..., None], F.pad(x, (0, 0, 0, n_steps)), 0.0) + sinusoids(
            positions, x.shape[-1]
        )
        own_steps = torch.full_like(lengths, n_steps) if target_lengths is None else target_lengths
        h = self.encoder(h, src_key_padding_mask=positions[None] >= (lengths + own_steps)[:, None])
        blanks = lengths[:, None] + torch.arange(n_steps, device=tokens.device)
        return self.output(h.gather(1, blanks[..., None].expand(-1, -1, h.shape[-1])))
