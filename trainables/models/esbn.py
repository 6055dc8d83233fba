"""The Transformer of Webb et al.'s ESBN tasks (2020), which the Compositional Attention paper keeps
and gives compositional attention (Sec. 4.5, App. C.5: "the initialization as well as normalization
schemes of the original codebase"; taylorwwebb/emergent_symbols `models/Transformer.py`, the
authors' `emergent_symbols/models/tsf.py` and `comp_tsf.py`).

Each 32 x 32 object image is encoded by three strided convolutions and two linear maps to d (128);
the sequence of codes is context-normalised (below), given sinusoidal positions and passed through
one post-norm layer (d, 8 heads or 8 searches, FF 512, no dropout) and a LayerNorm; the mean over
the sequence goes through a hidden layer of 256 to the answer's logits.

Context normalisation (Webb et al., Sec. 3): each feature of the codes is standardised over the
positions of the sequence, z' = gamma * (z - mean) / sqrt(var + 1e-8) + beta, with the unbiased
variance; "pairs" standardises each pair of positions on its own (their "task-segmented" variant,
which the RMTS runs use), "none" leaves the codes as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from .configs import TransformerConfig
from .transformer import Layer, sinusoids

CONTEXT_NORMS = ("sequence", "pairs", "none")


def context_norm(z: torch.Tensor, segment: int | None) -> torch.Tensor:
    """(B, T, D) codes standardised per feature over each run of `segment` positions (None: all T)."""
    b, t, d = z.shape
    parts = z.view(b, t // segment, segment, d) if segment else z[:, None]
    mean, var = parts.mean(2, keepdim=True), parts.var(2, keepdim=True)
    return ((parts - mean) / (var + 1e-8).sqrt()).view(b, t, d)


class ObjectSequenceTransformer(nn.Module):
    def __init__(self, cfg: TransformerConfig, attention: str, n_classes: int, channels: int = 1):
        super().__init__()
        if cfg.context_norm not in CONTEXT_NORMS:
            raise ValueError(
                f"context_norm must be one of {', '.join(CONTEXT_NORMS)}, got {cfg.context_norm!r}"
            )
        self.cfg = cfg
        conv = lambda c_in: [nn.Conv2d(c_in, 32, 4, stride=2, padding=1), nn.ReLU()]  # halves the side
        self.encoder = nn.Sequential(
            *conv(channels),
            *conv(32),
            *conv(32),
            nn.Flatten(),
            nn.Linear(4 * 4 * 32, 256),
            nn.ReLU(),
            nn.Linear(256, cfg.d_model),
            nn.ReLU(),
        )
        self.gamma, self.beta = nn.Parameter(torch.ones(cfg.d_model)), nn.Parameter(torch.zeros(cfg.d_model))
        self.layer = Layer(cfg, attention, gated=False)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.hidden = nn.Linear(cfg.d_model, 256)
        self.readout = nn.Linear(256, n_classes)
        self.initialise()

    def initialise(self) -> None:
        """The authors' initialisation (emergent_symbols/models/tsf.py, comp_tsf.py, modules.py): biases
        0; Kaiming normal before a ReLU (encoder, feed-forward, hidden layer); Xavier normal at gain
        1/sqrt(2) for the maps into queries, keys and values (their `*_net`: compositional attention's
        retrieval query and key too) and at gain 1 for the attention's output map and the readout;
        LayerNorms as PyTorch makes them."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for part in (self.encoder, self.layer.ff, self.hidden):
            for module in part.modules():
                if isinstance(module, (nn.Linear, nn.Conv2d)):
                    nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
        for name, weight in self.layer.attention.named_parameters():
            if weight.dim() > 1:
                nn.init.xavier_normal_(weight, gain=1.0 if name.startswith("out.") else 2**-0.5)
        nn.init.xavier_normal_(self.readout.weight)

    def forward(self, images: torch.Tensor, return_activations: bool = False):
        """images (B, T, H, W, channels) uint8 -> answer logits (B, C)."""
        b, t = images.shape[:2]
        z = self.encoder(images.flatten(0, 1).permute(0, 3, 1, 2).float() / 255).view(b, t, -1)
        if self.cfg.context_norm != "none":
            z = self.gamma * context_norm(z, 2 if self.cfg.context_norm == "pairs" else None) + self.beta
        h = z + sinusoids(torch.arange(t, device=z.device), z.shape[-1])
        no_padding = torch.zeros((b, t), dtype=torch.bool, device=h.device)
        attention = []
        for _ in range(self.cfg.n_layers):
            h, weights, _ = self.layer(h, no_padding)
            h = self.norm(h)
            attention.append(weights.detach())
        logits = self.readout(torch.relu(self.hidden(h.mean(1))))
        return (logits, {"attention": attention}) if return_activations else logits
