"""Model registry: the name used in YAML -> a config dataclass and a constructor.

Each entry says which task kinds the model can run, so the service can reject a model/task pair
that cannot work before anything launches.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from torch import nn

from ..tasks.base import Task
from .dnc import DNCClassifier, DNCConfig
from .enc_dec import EncDecConfig, EncDecPANMConfig, TransformerEncoderDecoder, TransformerPANM
from .esbn import ObjectSequenceTransformer
from .lstm import LSTMClassifier, LSTMConfig, LSTMTagger
from .panm import PANM, CausalPANM, PANMConfig
from .set_attention import SetAttentionRegressor
from .seq2seq import LSTMSeq2Seq, Seq2SeqConfig, TransformerSeq2Seq
from .stack_rnn import StackRNNConfig, StackRNNTagger
from .transformer import ImageQuestionTransformer, TransformerConfig, UniversalTransformerClassifier, UniversalTransformerSetRegressor


@dataclass(frozen=True)
class ModelSpec:
    config: type
    constructor: Callable[..., nn.Module]  # (config, task) -> module
    task_kinds: tuple[str, ...]
    description: str
    # Whether its seeds can train stacked (trainables.batched): a forward vmap can trace, whose
    # result for a sample does not depend on how wide its batch is padded (seeds' batches are padded
    # to the widest). So the shared-weight Transformers and the set-attention layers; not the LSTMs,
    # which pack their sequences by length on the host (pack_padded_sequence), the DNC, whose LSTM
    # cell has no batching rule, nor the Transformer seq2seq baseline, which decodes as many blanks
    # as its batch's longest target and lets its other samples attend to them.
    stacks: bool = False


def _token_ids(task: Task) -> dict:
    return {"vocab_size": len(task.vocab), "n_classes": task.n_classes, "pad_id": task.pad_id, "bos_id": task.bos_id, "eos_id": task.eos_id}


def _transformer(attention: str, gated: bool, description: str) -> ModelSpec:
    # Position-free attention (plain or compositional, without the copy gate) also reads sets, and
    # images with a question, and sequences of images.
    reads_sets = attention in ("softmax", "compositional") and not gated

    def build(cfg, task):
        if cfg.set_layer not in ("paper", "transformer"):
            raise ValueError(f"set_layer must be 'paper' or 'transformer', got {cfg.set_layer!r}")
        if task.kind == "set_regression" and cfg.set_layer == "paper":
            if cfg.fused_feed_forward:  # accepted and ignored, it would train what the file did not ask for
                raise ValueError("fused_feed_forward: the paper's set layer (set_layer: paper) has no feed-forward of ours to fuse")
            return SetAttentionRegressor(cfg.d_model, cfg.n_heads, cfg.n_retrievals if attention == "compositional" else None, task.n_features)
        if task.kind == "set_regression":
            return UniversalTransformerSetRegressor(cfg, attention, task.n_features)
        if task.kind == "visual_question_answering":
            return ImageQuestionTransformer(cfg, attention, task.n_features, task.n_classes)
        if task.kind == "image_classification":  # the triangles' images: n_features channels, 4 x 4 patches
            return ImageQuestionTransformer(cfg, attention, 0, task.n_classes, patch=4, channels=task.n_features)
        if task.kind == "image_sequence_classification":  # the ESBN tasks' sequences of object images
            return ObjectSequenceTransformer(cfg, attention, task.n_classes, channels=task.n_features)
        return UniversalTransformerClassifier(cfg, attention, gated, **_token_ids(task))

    kinds = ("sequence_classification", "set_regression", "visual_question_answering", "image_classification",
             "image_sequence_classification") if reads_sets else ("sequence_classification",)
    return ModelSpec(TransformerConfig, build, kinds, description, stacks=True)


def _seq2seq(config: type, cls, description: str) -> ModelSpec:
    return ModelSpec(config, lambda cfg, task: cls(cfg, len(task.vocab), task.n_features), ("sequence_to_sequence",), description)


MODELS: dict[str, ModelSpec] = {
    "transformer": _transformer("softmax", False, "Transformer, absolute sinusoidal positions"),
    "transformer_rel": _transformer("rel", False, "Transformer + rel (Transformer-XL relative positions)"),
    "transformer_rel_gate": _transformer("rel", True, "Transformer + rel + copy gate"),
    "transformer_absrel_gate": _transformer("absrel", True, "Transformer + abs/rel + copy gate (App. B)"),
    "transformer_geometric": _transformer("geometric", False, "Transformer + geometric attention"),
    "ndr": _transformer("geometric", True, "Neural Data Router: geometric attention + copy gate"),
    "transformer_compositional": _transformer("compositional", False, "Transformer with compositional attention (Mittal et al.)"),
    "panm": ModelSpec(PANMConfig, lambda cfg, task: CausalPANM(cfg, len(task.vocab), task.n_classes) if task.kind == "next_symbol_sets"
                      else PANM(cfg, len(task.vocab), task.n_features), ("sequence_to_sequence", "next_symbol_sets"),
                      "Pointer-Augmented Neural Memory (Le et al.)"),
    "lstm_seq2seq": _seq2seq(Seq2SeqConfig, LSTMSeq2Seq, "LSTM encoder-decoder"),
    "transformer_seq2seq": _seq2seq(Seq2SeqConfig, TransformerSeq2Seq, "Transformer encoder-decoder"),
    "transformer_enc_dec": ModelSpec(EncDecConfig, lambda cfg, task: TransformerEncoderDecoder(cfg, "softmax", len(task.vocab), task.bos_id),
                                     ("autoregressive_seq2seq", "translation"), "Transformer encoder-decoder (Csordás et al. 2021)"),
    "transformer_enc_dec_compositional": ModelSpec(EncDecConfig, lambda cfg, task: TransformerEncoderDecoder(cfg, "compositional", len(task.vocab), task.bos_id),
                                                   ("autoregressive_seq2seq", "translation"), "Transformer encoder-decoder with compositional attention"),
    "transformer_enc_dec_panm": ModelSpec(EncDecPANMConfig, lambda cfg, task: TransformerPANM(cfg, len(task.vocab), task.bos_id),
                                          ("autoregressive_seq2seq", "translation"), "Transformer encoder, PANM's Controller on a Transformer decoder (Le et al., App. D.3)"),
    "lstm": ModelSpec(LSTMConfig, lambda cfg, task: LSTMTagger(cfg, len(task.vocab), task.n_classes, task.pad_id) if task.kind == "next_symbol_sets"
                      else LSTMClassifier(cfg, False, **_token_ids(task)), ("sequence_classification", "next_symbol_sets"), "LSTM"),
    "stack_rnn": ModelSpec(StackRNNConfig, lambda cfg, task: StackRNNTagger(cfg, len(task.vocab), task.n_classes), ("next_symbol_sets",),
                           "stack RNN with a softmax push/pop gate (Suzgun et al. 2019)"),
    "dnc": ModelSpec(DNCConfig, lambda cfg, task: DNCClassifier(cfg, **_token_ids(task)), ("sequence_classification",),
                     "DNC with the improvements of Csordás & Schmidhuber (2019)"),
    "bilstm": ModelSpec(LSTMConfig, lambda cfg, task: LSTMClassifier(cfg, True, **_token_ids(task)), ("sequence_classification",), "bidirectional LSTM"),
}


BATCHABLE_MODELS = tuple(name for name, spec in MODELS.items() if spec.stacks)


def batchable(flat: dict) -> str | None:
    """Why a trial config cannot train its seeds batched, or None where it can."""
    if flat.get("model") not in BATCHABLE_MODELS:
        return f"model {flat.get('model')!r} steps through its input with host-side control flow"
    if flat.get("act", "none") != "none":
        return "adaptive computation time stops on a data-dependent test"
    return None


def model_fields(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(MODELS[name].config)}


def build_model(name: str, options: dict, task: Task) -> nn.Module:
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    spec = MODELS[name]
    if task.kind not in spec.task_kinds:
        raise ValueError(f"model {name!r} runs {', '.join(spec.task_kinds)}; task {task.name!r} is {task.kind}")
    return spec.constructor(spec.config(**options), task)
