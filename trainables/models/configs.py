"""The paper models' config dataclasses: each model's keys, their defaults and ranges (field
metadata, trainables.fields), and the rules between them (`joint_problems`). Apart from the models'
nn.Modules, so that the registry, a plan and the commands that read a launch judge a config
without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import MOST_MODULES, finite, ranged, rate, validate


def heads_problems(values: dict) -> list[tuple[str, str]]:
    """The heads split d_model evenly (the attention's d_head = d_model / n_heads)."""
    d_model, n_heads = values["d_model"], values["n_heads"]
    return [("", f"d_model={d_model} is not divisible by n_heads={n_heads}")] if d_model % n_heads else []


@dataclass
class TransformerConfig:
    d_model: int = ranged(256, 1)
    n_heads: int = ranged(4, 1)
    # d_FF = ff_multiplier * d_model, as in the paper's Table 10
    ff_multiplier: float = ranged(2.0, 0, low_inclusive=False)
    n_layers: int = ranged(14, 1, MOST_MODULES)
    dropout: float = rate(0.1)
    attention_dropout: float = rate(0.0)  # on the attention weights (the authors never use it)
    # on the content and position queries (App. C.3; Table 10's "attention dropout"), as the paper
    # says; the authors' code drops the content and position keys instead
    query_dropout: float = rate(0.1)
    # on the input embeddings: none in the authors' gated and relative models
    input_dropout: float = rate(0.0)
    # gated models: probability that a column's gate is forced shut for one layer step
    gate_drop: float = rate(0.0)
    gate_ff_dropout: bool = True  # gated models: `dropout` inside the gate's feed-forward, as the authors'
    # gated models: `dropout` between the update feed-forward and its LayerNorm/tanh
    update_dropout: bool = False
    # geometric attention: L1-normalise the weights (the "+geom. att." baseline)
    normalize_geometric: bool = False
    # geometric attention: one alpha, beta, gamma for all heads, as the authors'
    shared_geometric_scale: bool = True
    readout: str = "last"  # "last" column (the end token) or "first" (Table 5)
    # more layers at evaluation than in training (App. C.1)
    eval_n_layers: int | None = ranged(None, 1, MOST_MODULES)
    gate_bias_init: float = finite(-3.0)
    n_retrievals: int = ranged(2, 1)  # compositional attention: R (n_heads is the number of searches S)
    retrieval_dim: int = ranged(32, 1)  # compositional attention: d_r, size of retrieval queries and keys
    retrieval_scores: str = "dot"  # compositional attention: "dot" (Eq. 13) or "mlp" (Table 8)
    mask_self: bool = False  # sets: no element attends to itself (contextual retrieval searches j != i)
    # Sets: "paper", the Compositional Attention paper's one attention layer between two MLPs
    # (set_attention.py; uses d_model, n_heads and n_retrievals only), or "transformer", these
    # shared-weight layers (UniversalTransformerSetRegressor).
    set_layer: str = "paper"
    # ESBN tasks (esbn.py): standardise the objects' codes over the "sequence", over "pairs", or "none"
    context_norm: str = "sequence"
    act: str = "none"  # adaptive computation time (App. A, Table 6): "graves" (their "A") or "dehghani" ("U")
    # a column halts when its summed halting probabilities reach this (1 - epsilon)
    act_threshold: float = ranged(0.99, 0, 1, low_inclusive=False)
    # alpha of the ponder cost L_ACT (the authors' best of their search)
    act_loss_weight: float = ranged(0.03, 0)
    # Issue 21: each of a layer's feed-forwards as one op, on CUDA Triton kernels of our own
    # (feed_forward_op.py). Off: on an H200 it made NDR's stack slower (257.8 member-steps/s against
    # 441.2), and its dropout masks are drawn otherwise than torch's (learning curves not compared).
    fused_feed_forward: bool = False

    def __post_init__(self):
        validate(self)

    joint_problems = staticmethod(heads_problems)


@dataclass
class PANMConfig:
    encoder: str = "lstm"  # or "transformer"
    d_model: int = ranged(256, 1)  # memory slot size (the encoder's output)
    n_layers: int = ranged(1, 1, MOST_MODULES)  # encoder layers
    n_heads: int = ranged(4, 1)  # Transformer encoder heads
    hidden: int = ranged(256, 1)  # Controller GRU size, and the Pointer Units' unless pointer_hidden says
    pointer_hidden: int | None = ranged(None, 1)  # Pointer Unit GRU size (Dyck: 256 beside the stack RNN's 8)
    mlp_hidden: int = ranged(128, 1)
    address_bits: int = ranged(10, 1, 62)
    mode1_heads: int = ranged(2, 0, 3)  # H^a: the pointers start at base, end and middle addresses
    mode2_heads: int = ranged(1, 0, MOST_MODULES)  # H^c
    dropout: float = rate(0.0)
    # initial inverse temperature of the cosine attentions
    sharpness: float = ranged(10.0, 0, low_inclusive=False)
    # h_0^c: "sum" of the memory slots (Eq. 7) or the "last" slot (the authors' code)
    controller_start: str = "sum"
    # the Controller's core reads the Mode-2 values (Eq. 7), or only g^o does (the authors' code)
    controller_reads_mode2: bool = True
    # the Controller's recurrent core: "gru" (Eq. 7), "lstm", or "srnn" (the Dyck stack RNN)
    controller: str = "gru"
    stack_size: int = ranged(104, 1)  # srnn: the stack's cells
    stack_dim: int = ranged(5, 1)  # srnn: each cell's size

    def __post_init__(self):
        validate(self)


@dataclass
class EncDecConfig:
    d_model: int = ranged(128, 1)
    n_heads: int = ranged(8, 1)  # compositional attention: the searches S
    ff_multiplier: float = ranged(2.0, 0, low_inclusive=False)
    encoder_layers: int = ranged(3, 1, MOST_MODULES)
    decoder_layers: int = ranged(3, 1, MOST_MODULES)
    universal: bool = True
    relative_positions: bool = False
    dropout: float = rate(0.5)
    n_retrievals: int = ranged(1, 1)  # compositional attention: R
    retrieval_dim: int = ranged(32, 1)  # compositional attention: size of retrieval queries and keys
    retrieval_scores: str = "dot"  # compositional attention: "dot" or "mlp"

    def __post_init__(self):
        validate(self)

    joint_problems = staticmethod(heads_problems)

    def layer_config(self, attention: str) -> TransformerConfig:
        # Csordas et al.'s multi-head attention drops attention weights at the model's rate; the
        # Compositional Attention authors' SCAN attention (merged_attention) drops none.
        return TransformerConfig(
            d_model=self.d_model,
            n_heads=self.n_heads,
            ff_multiplier=self.ff_multiplier,
            dropout=self.dropout,
            attention_dropout=0.0 if attention == "compositional" else self.dropout,
            query_dropout=0.0,
            n_retrievals=self.n_retrievals,
            retrieval_dim=self.retrieval_dim,
            retrieval_scores=self.retrieval_scores,
        )


@dataclass
class EncDecPANMConfig(EncDecConfig):
    universal: bool = False  # PANM's SCAN row builds on TRM, the Transformer without shared layers
    # App. D.3 keeps PANM's parameter count at the baseline's: 64 gives 1,012,760 against TRM's 998,294.
    hidden: int = ranged(64, 1)  # Pointer Unit and Controller GRU size
    mlp_hidden: int = ranged(64, 1)
    address_bits: int = ranged(10, 1, 62)
    mode1_heads: int = ranged(2, 0, 3)  # H^a (PANMConfig.mode1_heads)
    mode2_heads: int = ranged(1, 0, MOST_MODULES)  # H^c
    sharpness: float = ranged(10.0, 0, low_inclusive=False)
    controller_start: str = "sum"
    controller_reads_mode2: bool = True

    def pointer_config(self) -> PANMConfig:
        return PANMConfig(
            d_model=self.d_model,
            hidden=self.hidden,
            mlp_hidden=self.mlp_hidden,
            address_bits=self.address_bits,
            mode1_heads=self.mode1_heads,
            mode2_heads=self.mode2_heads,
            sharpness=self.sharpness,
            controller_start=self.controller_start,
            controller_reads_mode2=self.controller_reads_mode2,
        )


@dataclass
class LSTMConfig:
    d_model: int = ranged(200, 1)  # the state size; a bidirectional LSTM gives each direction half of it
    n_layers: int = ranged(1, 1, MOST_MODULES)
    dropout: float = rate(0.5)

    def __post_init__(self):
        validate(self)


@dataclass
class Seq2SeqConfig:
    d_model: int = ranged(512, 1)  # LSTM units (the authors' 512) or Transformer width (the authors' 256)
    # the PANM paper found 1 layer best for its LSTM baseline on Copy
    n_layers: int = ranged(1, 1, MOST_MODULES)
    n_heads: int = ranged(8, 1)  # Transformer only
    ff_multiplier: float = ranged(2.0, 0, low_inclusive=False)  # Transformer only
    dropout: float = rate(0.0)

    def __post_init__(self):
        validate(self)


@dataclass
class StackRNNConfig:
    hidden: int = ranged(8, 1)
    stack_size: int = ranged(104, 1)
    stack_dim: int = ranged(5, 1)

    def __post_init__(self):
        validate(self)


@dataclass
class DNCConfig:
    d_model: int = ranged(200, 1)  # controller LSTM size (Table 7)
    n_cells: int = ranged(21, 1)
    word_size: int | None = ranged(None, 1)  # None: d_model, as the authors'
    n_read_heads: int = ranged(4, 1)
    embedding_size: int = ranged(16, 1)  # the authors' token embedding
    dropout: float = rate(0.5)  # on the embeddings
    deallocate: bool = True
    sharpen_links: bool = True
    masked_addressing: bool = False
    clip_controls: float = ranged(20.0, 0, low_inclusive=False)  # the interface vector is clipped to +-20

    def __post_init__(self):
        validate(self)
