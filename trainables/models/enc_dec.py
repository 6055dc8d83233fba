"""The Transformer encoder-decoder of Csordás et al. (2021), which both SCAN papers train (the
Compositional Attention paper, Sec. 4.6 and App. C.6: a 3-layer Universal Transformer, d = 128, 8
heads, FF 256; PANM, Table 2's TRM, U. TRM and their +RPE variants), shaped as the authors' code
(`models/transformer_enc_dec.py`, `layers/transformer/`):

  encoder: <bos> and the input's embeddings plus sinusoidal positions (unscaled: the "noscale"
           variants), post-norm layers (attention, then feed-forward, each added and normalised);
  decoder: <bos> and the previous output tokens' embeddings plus positions, post-norm layers of
           causal self-attention, attention over the encoder's output and feed-forward; the output
           logits are the decoder states times the output embedding (tied), plus a bias;
  universal: one encoder layer and one decoder layer, each applied n times (shared weights);
  relative_positions: Transformer-XL relative positions in the self-attentions instead of the
           absolute ones (the "+RPE" rows; softmax attention only).
Compositional attention replaces every attention (self and cross) with S = n_heads searches over
n_retrievals retrievals. Dropout (the authors' 0.5) is applied after each sublayer, inside the
feed-forward and on the attention weights.

PANM on SCAN (App. D.3, `TransformerPANM`): the same encoder's output, <bos> included, is PANM's
memory; a Transformer decoder of `decoder_layers` - 1 layers gives the Controller its input
z_t = Decoder(y_<t), and the Controller (Eq. 7) takes the last decoder layer's place.

Training feeds the decoder the target (teacher forcing); evaluation feeds it its own greedy
outputs, recomputing the whole decoder prefix at each step (the causal mask makes that equal to
decoding step by step with a cache; tested) while PANM's Controller takes one step per token.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .configs import EncDecConfig, EncDecPANMConfig, TransformerConfig
from .dropout import Dropout
from .panm import PointerDecoder
from .transformer import (
    RETRIEVAL_SCORES,
    FeedForward,
    Layer,
    attention_of,
    sinusoids,
)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, self_attention: str, cross_attention: str):
        super().__init__()
        self.self_attention, self.cross_attention = (
            attention_of(cfg, self_attention),
            attention_of(cfg, cross_attention),
        )
        self.ff = FeedForward(cfg.d_model, int(cfg.ff_multiplier * cfg.d_model), cfg.dropout)
        self.norms = nn.ModuleList(nn.LayerNorm(cfg.d_model) for _ in range(3))
        self.dropout = Dropout(cfg.dropout)

    def forward(self, h: torch.Tensor, memory: torch.Tensor, memory_padding: torch.Tensor) -> torch.Tensor:
        no_padding = torch.zeros(h.shape[:2], dtype=torch.bool, device=h.device)
        h = self.norms[0](h + self.dropout(self.self_attention(h, no_padding, causal=True)[0]))
        h = self.norms[1](h + self.dropout(self.cross_attention(h, memory_padding, source=memory)[0]))
        return self.norms[2](h + self.dropout(self.ff(h)))


class TransformerEncoderDecoder(nn.Module):
    def __init__(self, cfg: EncDecConfig, attention: str, vocab_size: int, bos_id: int):
        super().__init__()
        if cfg.retrieval_scores not in RETRIEVAL_SCORES:
            raise ValueError(
                f"retrieval_scores must be one of {RETRIEVAL_SCORES}, got {cfg.retrieval_scores!r}"
            )
        if cfg.relative_positions and attention != "softmax":
            raise ValueError("relative_positions: only with softmax attention (the +RPE baselines)")
        self.cfg, self.bos_id = cfg, bos_id
        layer_cfg = cfg.layer_config(attention)
        own = "rel" if cfg.relative_positions else attention
        self.input_embedding = nn.Embedding(vocab_size, cfg.d_model)
        self.output_embedding = nn.Embedding(vocab_size, cfg.d_model)
        self.encoder = nn.ModuleList(
            Layer(layer_cfg, own, gated=False) for _ in range(1 if cfg.universal else cfg.encoder_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(layer_cfg, own, attention) for _ in range(1 if cfg.universal else cfg.decoder_layers)
        )
        self.output_bias = nn.Parameter(torch.zeros(vocab_size))
        if cfg.relative_positions:  # the authors' relative variants start their embeddings as Xavier's
            nn.init.xavier_uniform_(self.input_embedding.weight)
            nn.init.xavier_uniform_(self.output_embedding.weight)

    def embed(self, embedding: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        x = embedding(tokens)
        if self.cfg.relative_positions:
            return x
        return x + sinusoids(torch.arange(tokens.shape[1], device=tokens.device), x.shape[-1])

    def with_bos(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.cat(
            [torch.full((len(tokens), 1), self.bos_id, dtype=tokens.dtype, device=tokens.device), tokens], 1
        )

    def encode(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.with_bos(tokens)
        padding = torch.arange(tokens.shape[1], device=tokens.device)[None] > lengths[:, None]
        h = self.embed(self.input_embedding, tokens)
        for k in range(self.cfg.encoder_layers):
            h = self.encoder[0 if self.cfg.universal else k](h, padding)[0]
        return h, padding

    def decode(
        self, previous: torch.Tensor, memory: torch.Tensor, memory_padding: torch.Tensor
    ) -> torch.Tensor:
        """previous (B, T): <bos> and the tokens output so far -> the decoder's states (B, T, d)."""
        h = self.embed(self.output_embedding, previous)
        for k in range(self.cfg.decoder_layers):
            h = self.decoder[0 if self.cfg.universal else k](h, memory, memory_padding)
        return h

    def begin_output(self, memory: torch.Tensor, lengths: torch.Tensor) -> dict | None:
        """What the output layer carries from one decoding step to the next: nothing here."""
        return None

    def output(self, h: torch.Tensor, state: dict | None) -> torch.Tensor:
        """Decoder states (B, T, d) of the next T steps -> their logits (B, T, vocab)."""
        return h @ self.output_embedding.weight.T + self.output_bias

    def forward(
        self, tokens: torch.Tensor, lengths: torch.Tensor, n_steps: int, targets: torch.Tensor | None = None
    ) -> torch.Tensor:
        """-> (B, n_steps, vocab) logits: of each target token given the ones before it (teacher
        forcing) where `targets` (B, n_steps) are given, else of greedy decoding."""
        memory, padding = self.encode(tokens, lengths)
        state = self.begin_output(memory, lengths)
        if targets is not None:
            return self.output(self.decode(self.with_bos(targets[:, :-1]), memory, padding), state)
        previous, steps = self.with_bos(tokens[:, :0]), []
        for _ in range(n_steps):
            steps.append(self.output(self.decode(previous, memory, padding)[:, -1:], state)[:, 0])
            previous = torch.cat([previous, steps[-1].argmax(-1, keepdim=True)], 1)
        return torch.stack(steps, 1)


class TransformerPANM(TransformerEncoderDecoder):
    def __init__(self, cfg: EncDecPANMConfig, vocab_size: int, bos_id: int):
        if cfg.decoder_layers < 2:
            raise ValueError(
                "decoder_layers must be at least 2 (the Controller replaces the last), "
                f"got {cfg.decoder_layers}"
            )
        super().__init__(
            dataclasses.replace(cfg, decoder_layers=cfg.decoder_layers - 1), "softmax", vocab_size, bos_id
        )
        self.output_bias = None  # the Controller's output MLP makes the logits
        self.pointer_decoder = PointerDecoder(cfg.pointer_config(), vocab_size, input_size=cfg.d_model)

    def begin_output(self, memory: torch.Tensor, lengths: torch.Tensor) -> dict:
        return self.pointer_decoder.begin(memory, lengths + 1)  # <bos> is a memory slot too

    def output(self, h: torch.Tensor, state: dict) -> torch.Tensor:
        return torch.stack([self.pointer_decoder.step(state, h[:, t]) for t in range(h.shape[1])], 1)
