"""The stack-augmented RNN of Suzgun et al. (2019) with a softmax push/pop gate, the Dyck baseline
PANM is compared with and built on (PANM Sec. 3.2, App. D.2), as the authors' `SRNN_Softmax`
(suzgunmirac/marnns, `models/rnn_models.py`) computes it, batched:

  h~_t  = h_{t-1} + W_sh s_{t-1}[0]                  (the stack's top read into the state)
  h_t   = tanh(W_ih x_t + W_hh h~_t + b)              (an Elman RNN step)
  a_t   = softmax(W_a h_t)                            (push, pop)
  n_t   = sigmoid(W_n h_t)                            (the element a push writes)
  s_t   = a_push [n_t; s_{t-1}[:-1]] + a_pop [s_{t-1}[1:]; 0]
  y_t   = W_y h_t                                     (one logit per symbol; the loss takes sigmoids)

The stack has `stack_size` cells of `stack_dim` (the authors' 104 and 5); the state has `hidden` (8).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .configs import StackRNNConfig


class StackRNNCell(nn.Module):
    """One step: x (B, input), (h (B, hidden), stack (B, stack_size, stack_dim)) -> the new (h, stack)."""

    def __init__(self, input_size: int, hidden: int, stack_size: int, stack_dim: int):
        super().__init__()
        if stack_size < 1 or stack_dim < 1:
            raise ValueError(f"stack_size and stack_dim must be positive, got {stack_size} and {stack_dim}")
        self.stack_size, self.stack_dim = stack_size, stack_dim
        self.rnn = nn.RNNCell(input_size, hidden)
        self.read = nn.Linear(stack_dim, hidden)  # W_sh
        self.actions = nn.Linear(hidden, 2)  # W_a
        self.element = nn.Linear(hidden, stack_dim)  # W_n

    def initial(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return h, h.new_zeros(len(h), self.stack_size, self.stack_dim)

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, stack = state
        h = self.rnn(x, h + self.read(stack[:, 0]))
        push, pop = torch.softmax(self.actions(h), -1).unbind(-1)
        pushed = torch.cat([torch.sigmoid(self.element(h))[:, None], stack[:, :-1]], 1)
        popped = torch.cat([stack[:, 1:], torch.zeros_like(stack[:, :1])], 1)
        return h, push[:, None, None] * pushed + pop[:, None, None] * popped


class StackRNNTagger(nn.Module):
    """Reads one-hot symbols and gives, after each, a logit per symbol that may come next."""

    def __init__(self, cfg: StackRNNConfig, vocab_size: int, n_outputs: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.cell = StackRNNCell(vocab_size, cfg.hidden, cfg.stack_size, cfg.stack_dim)
        self.readout = nn.Linear(cfg.hidden, n_outputs)  # W_y

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = F.one_hot(tokens, self.vocab_size).to(self.readout.weight.dtype)
        state = self.cell.initial(x.new_zeros(len(tokens), self.cell.rnn.hidden_size))
        hidden = []
        for t in range(tokens.shape[1]):  # positions after a sequence's end are computed and ignored
            state = self.cell(x[:, t], state)
            hidden.append(state[0])
        return self.readout(torch.stack(hidden, 1))
