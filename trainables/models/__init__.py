"""Model registry: the name used in YAML -> a config dataclass and a builder per task kind it reads.

A model is one of the package's (MODELS), or a researcher's own class brought from outside the
package: `path/to/file.py:Class` (a path from the current folder), or the name of an entry point in
the group `sysgen.models` of an installed package. Such a class states what the registry holds for
the package's own models, as class attributes (see examples/my_model.py):

    Config = MyConfig            # a dataclass of the model's keys, each with a default
    kinds = (SEQUENCE_CLASSIFICATION, ...)  # trainables.kinds objects: the tasks it reads
    stacks = False               # whether seeds may train vmapped as one stack (trainables.batched)

and is built as `Class(config, task)`; its forward takes what each of its kinds hands a model
(kinds.Kind.forward). A model that states these wrongly is refused in one line before anything runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from ..fields import closest
from ..kinds import (
    AUTOREGRESSIVE_SEQ2SEQ,
    IMAGE_CLASSIFICATION,
    IMAGE_SEQUENCE_CLASSIFICATION,
    KINDS,
    NEXT_SYMBOL_SETS,
    SEQUENCE_CLASSIFICATION,
    SEQUENCE_TO_SEQUENCE,
    SET_REGRESSION,
    TRANSLATION,
    VISUAL_QUESTION_ANSWERING,
    Kind,
)
from ..tasks.base import Task
from .configs import (
    DNCConfig,
    EncDecConfig,
    EncDecPANMConfig,
    LSTMConfig,
    PANMConfig,
    Seq2SeqConfig,
    StackRNNConfig,
    TransformerConfig,
)

if TYPE_CHECKING:
    from torch import nn

ENTRY_POINTS = "sysgen.models"  # the entry-point group an installed package names its models in

Builder = Callable[..., "nn.Module"]  # (config, task) -> module


class ModelError(ValueError):
    """A model name that names nothing, or a model brought from outside that states itself wrongly."""


@dataclass(frozen=True)
class ModelSpec:
    config: type
    builders: dict[Kind, Builder]  # per task kind it reads: (config, task) -> module
    description: str
    # Whether its seeds can train stacked (trainables.batched): a forward vmap can trace, whose
    # result for a sample does not depend on how wide its batch is padded (seeds' batches are padded
    # to the widest). So the shared-weight Transformers and the set-attention layers; not the LSTMs,
    # which pack their sequences by length on the host (pack_padded_sequence), the DNC, whose LSTM
    # cell has no batching rule, nor the Transformer seq2seq baseline, which decodes as many blanks
    # as its batch's longest target and lets its other samples attend to them.
    stacks: bool = False

    @property
    def kinds(self) -> tuple[Kind, ...]:
        return tuple(self.builders)


def _nets(module: str) -> ModuleType:
    """trainables.models.<module>, imported when a builder builds one of its models: the models'
    modules import torch, and what only reads the registry (a plan, the commands that read a
    launch) goes without it. Their configs are configs.py's."""
    return importlib.import_module(f"{__name__}.{module}")


def _token_ids(task: Task) -> dict:
    return {
        "vocab_size": len(task.vocab),
        "n_classes": task.n_classes,
        "pad_id": task.pad_id,
        "bos_id": task.bos_id,
        "eos_id": task.eos_id,
    }


def _transformer(attention: str, gated: bool, description: str) -> ModelSpec:
    def sets(cfg, task):
        if cfg.set_layer == "transformer":
            return _nets("transformer").UniversalTransformerSetRegressor(cfg, attention, task.n_features)
        if cfg.fused_feed_forward:  # accepted and ignored, it would train what the file did not ask for
            raise ValueError(
                "fused_feed_forward: the paper's set layer (set_layer: paper) has no feed-forward "
                "of ours to fuse"
            )
        return _nets("set_attention").SetAttentionRegressor(
            cfg.d_model,
            cfg.n_heads,
            cfg.n_retrievals if attention == "compositional" else None,
            task.n_features,
        )

    builders = {
        SEQUENCE_CLASSIFICATION: lambda cfg, task: _nets("transformer").UniversalTransformerClassifier(
            cfg, attention, gated, **_token_ids(task)
        )
    }
    # Position-free attention (plain or compositional, without the copy gate) also reads sets, and
    # images with a question, and sequences of images.
    if attention in ("softmax", "compositional") and not gated:
        builders |= {
            SET_REGRESSION: sets,
            VISUAL_QUESTION_ANSWERING: lambda cfg, task: _nets("transformer").ImageQuestionTransformer(
                cfg, attention, task.n_features, task.n_classes
            ),
            # the triangles' images: n_features channels, 4 x 4 patches
            IMAGE_CLASSIFICATION: lambda cfg, task: _nets("transformer").ImageQuestionTransformer(
                cfg, attention, 0, task.n_classes, patch=4, channels=task.n_features
            ),
            IMAGE_SEQUENCE_CLASSIFICATION: lambda cfg, task: _nets("esbn").ObjectSequenceTransformer(
                cfg, attention, task.n_classes, channels=task.n_features
            ),
        }
    return ModelSpec(
        TransformerConfig,
        {kind: _checking_set_layer(build) for kind, build in builders.items()},
        description,
        stacks=True,
    )


def _checking_set_layer(build: Builder) -> Builder:
    def checked(cfg, task):  # a typo in set_layer is refused whatever the task, as any key's bad value
        if cfg.set_layer not in ("paper", "transformer"):
            raise ValueError(f"set_layer must be 'paper' or 'transformer', got {cfg.set_layer!r}")
        return build(cfg, task)

    return checked


def _seq2seq(cls: str, description: str) -> ModelSpec:
    """A baseline of seq2seq.py, its class `cls` named."""
    return ModelSpec(
        Seq2SeqConfig,
        {
            SEQUENCE_TO_SEQUENCE: lambda cfg, task: getattr(_nets("seq2seq"), cls)(
                cfg, len(task.vocab), task.n_features
            )
        },
        description,
    )


def _enc_dec(config: type, build: Builder, description: str) -> ModelSpec:
    return ModelSpec(config, {AUTOREGRESSIVE_SEQ2SEQ: build, TRANSLATION: build}, description)


MODELS: dict[str, ModelSpec] = {
    "transformer": _transformer("softmax", False, "Transformer, absolute sinusoidal positions"),
    "transformer_rel": _transformer("rel", False, "Transformer + rel (Transformer-XL relative positions)"),
    "transformer_rel_gate": _transformer("rel", True, "Transformer + rel + copy gate"),
    "transformer_absrel_gate": _transformer("absrel", True, "Transformer + abs/rel + copy gate (App. B)"),
    "transformer_geometric": _transformer("geometric", False, "Transformer + geometric attention"),
    "ndr": _transformer("geometric", True, "Neural Data Router: geometric attention + copy gate"),
    "transformer_compositional": _transformer(
        "compositional", False, "Transformer with compositional attention (Mittal et al.)"
    ),
    "panm": ModelSpec(
        PANMConfig,
        {
            SEQUENCE_TO_SEQUENCE: lambda cfg, task: _nets("panm").PANM(cfg, len(task.vocab), task.n_features),
            NEXT_SYMBOL_SETS: lambda cfg, task: _nets("panm").CausalPANM(
                cfg, len(task.vocab), task.n_classes
            ),
        },
        "Pointer-Augmented Neural Memory (Le et al.)",
    ),
    "lstm_seq2seq": _seq2seq("LSTMSeq2Seq", "LSTM encoder-decoder"),
    "transformer_seq2seq": _seq2seq(
        "TransformerSeq2Seq", "Transformer encoder only: the output read at blank positions"
    ),
    "transformer_enc_dec": _enc_dec(
        EncDecConfig,
        lambda cfg, task: _nets("enc_dec").TransformerEncoderDecoder(
            cfg, "softmax", len(task.vocab), task.bos_id
        ),
        "Transformer encoder-decoder (Csordás et al. 2021)",
    ),
    "transformer_enc_dec_compositional": _enc_dec(
        EncDecConfig,
        lambda cfg, task: _nets("enc_dec").TransformerEncoderDecoder(
            cfg, "compositional", len(task.vocab), task.bos_id
        ),
        "Transformer encoder-decoder with compositional attention",
    ),
    "transformer_enc_dec_panm": _enc_dec(
        EncDecPANMConfig,
        lambda cfg, task: _nets("enc_dec").TransformerPANM(cfg, len(task.vocab), task.bos_id),
        "Transformer encoder, PANM's Controller on a Transformer decoder (Le et al., App. D.3)",
    ),
    "lstm": ModelSpec(
        LSTMConfig,
        {
            SEQUENCE_CLASSIFICATION: lambda cfg, task: _nets("lstm").LSTMClassifier(
                cfg, False, **_token_ids(task)
            ),
            NEXT_SYMBOL_SETS: lambda cfg, task: _nets("lstm").LSTMTagger(
                cfg, len(task.vocab), task.n_classes, task.pad_id
            ),
        },
        "LSTM",
    ),
    "stack_rnn": ModelSpec(
        StackRNNConfig,
        {
            NEXT_SYMBOL_SETS: lambda cfg, task: _nets("stack_rnn").StackRNNTagger(
                cfg, len(task.vocab), task.n_classes
            )
        },
        "stack RNN with a softmax push/pop gate (Suzgun et al. 2019)",
    ),
    "dnc": ModelSpec(
        DNCConfig,
        {SEQUENCE_CLASSIFICATION: lambda cfg, task: _nets("dnc").DNCClassifier(cfg, **_token_ids(task))},
        "DNC with the improvements of Csordás & Schmidhuber (2019)",
    ),
    "bilstm": ModelSpec(
        LSTMConfig,
        {
            SEQUENCE_CLASSIFICATION: lambda cfg, task: _nets("lstm").LSTMClassifier(
                cfg, True, **_token_ids(task)
            )
        },
        "bidirectional LSTM",
    ),
}
BATCHABLE_MODELS = tuple(name for name, spec in MODELS.items() if spec.stacks)
_BROUGHT: dict[str, ModelSpec] = {}  # models from outside the package, once loaded in this process


def is_file_model(name: str) -> bool:
    return ":" in name and name.split(":", 1)[0].endswith(".py")


def canonical(name: str) -> str:
    """`name` as any process on this machine finds it: a model file's path made absolute (a
    launch's trials run in folders of their own), other names as they are."""
    if not is_file_model(name):
        return name
    path, cls = name.rsplit(":", 1)
    return f"{Path(path).expanduser().resolve()}:{cls}"


def label(name: str) -> str:
    """A model's short name, for pair names and tables: a model file's class name."""
    return name.rsplit(":", 1)[1] if is_file_model(name) else name


def _load_file_class(name: str) -> type:
    path, cls_name = canonical(name).rsplit(":", 1)
    if not Path(path).is_file():
        raise ModelError(f"no model file {path}")
    module_name = f"sysgen_model_{hashlib.sha1(path.encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # where dataclasses and pickle look a class's module up
    try:
        spec.loader.exec_module(module)
    # whatever the file raises is said in one line: a syntax error, an import it lacks, a sys.exit()
    except (Exception, SystemExit) as e:
        del sys.modules[module_name]
        raise ModelError(
            f"{path} does not load: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        ) from None
    if not isinstance(getattr(module, cls_name, None), type):
        raise ModelError(f"{path} has no class {cls_name}")
    return getattr(module, cls_name)


def _entry_point_class(name: str) -> type | None:
    found = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINTS) if ep.name == name]
    return found[0].load() if found else None


def _forward_takes(cls: type, kind: Kind) -> bool:
    try:
        inspect.signature(cls.forward).bind(None, *kind.forward)
    except TypeError:
        return False
    return True


def spec_of_class(cls: type, name: str) -> ModelSpec:
    """The registry's entry for a model class brought from outside the package, or ModelError
    saying in one line what the class states wrongly."""
    # Here, not at the top: the registry's own models reach torch only when one is built (_nets); a
    # class brought from outside is a Module of torch's, which its file imported already.
    from torch import nn  # noqa: PLC0415

    config, kinds = getattr(cls, "Config", None), getattr(cls, "kinds", None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ModelError(f"{name}: not a torch.nn.Module class")
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise ModelError(f"{name}: its class attribute Config must be a dataclass of its keys")
    missing = [
        f.name
        for f in dataclasses.fields(config)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ModelError(f"{name}: Config.{missing[0]} needs a default (a search varies only what it names)")
    if not kinds or not isinstance(kinds, (tuple, list)) or not all(isinstance(k, Kind) for k in kinds):
        given = (
            [k for k in (kinds or []) if not isinstance(k, Kind)]
            if isinstance(kinds, (tuple, list))
            else kinds
        )
        raise ModelError(
            f"{name}: its class attribute kinds must be a tuple of trainables.kinds objects "
            f"({', '.join(KINDS)}), got {given!r}"
        )
    try:
        inspect.signature(cls).bind(None, None)
    except TypeError:
        raise ModelError(
            f"{name}: it must be built as {cls.__name__}(config, task), but takes {inspect.signature(cls)}"
        ) from None
    for kind in kinds:
        if not _forward_takes(cls, kind):
            raise ModelError(
                f"{name}: forward{inspect.signature(cls.forward)} cannot take what a {kind} task "
                f"hands a model: forward(self, {', '.join(kind.forward)})"
            )
    description = ((cls.__doc__ or "").strip().splitlines() or [f"{cls.__module__}.{cls.__name__}"])[0]
    return ModelSpec(
        config, {kind: cls for kind in kinds}, description, stacks=bool(getattr(cls, "stacks", False))
    )


def unknown_model(name) -> str:
    """What to say of a name that names no model."""
    return (
        f"unknown model {name!r}{closest(str(name), MODELS)}; known: {', '.join(MODELS)}, "
        f"a file's model as path/to/file.py:Class, or an entry point of {ENTRY_POINTS}"
    )


def model_spec(name: str) -> ModelSpec:
    """The model `name` names: one of MODELS, a `file.py:Class`, or an entry point of ENTRY_POINTS."""
    if name in MODELS:
        return MODELS[name]
    key = canonical(name)
    if key not in _BROUGHT:
        cls = _load_file_class(key) if is_file_model(key) else _entry_point_class(key)
        if cls is None:
            raise ModelError(unknown_model(name))
        _BROUGHT[key] = spec_of_class(cls, label(key))
    return _BROUGHT[key]


def batchable(flat: dict) -> str | None:
    """Why a trial config cannot train its seeds batched, or None where it can."""
    try:
        stacks = model_spec(flat["model"]).stacks
    except (KeyError, ModelError):
        stacks = False
    if not stacks:
        return f"model {flat.get('model')!r} steps through its input with host-side control flow"
    if flat.get("act", "none") != "none":
        return "adaptive computation time stops on a data-dependent test"
    return None


def model_fields(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(model_spec(name).config)}


def build_model(name: str, options: dict, task: Task) -> nn.Module:
    spec = model_spec(name)
    if task.kind not in spec.builders:
        raise ValueError(
            f"model {label(name)!r} runs {', '.join(map(str, spec.kinds))}; task {task.name!r} is {task.kind}"
        )
    return spec.builders[task.kind](spec.config(**options), task)
