"""A trial's config: one flat mapping (what a search space and `--set` speak) -> typed parts.

Flat keys are either training keys (TrainConfig's fields), keys of the chosen model's config
dataclass, or `task_options` (a mapping given to the task's config dataclass).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import re
import typing
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import torch
import yaml

from .models import MODELS, ModelError, build_model, is_file_model, model_fields, model_spec
from .tasks import TASKS, task_config


class ConfigError(ValueError):
    """A config key or value that cannot work; the message names the key and the reason."""


def closest(word: str, options) -> str:
    match = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


@dataclass
class TrainConfig:
    task: str
    model: str
    task_options: dict = field(default_factory=dict)
    model_options: dict = field(default_factory=dict)
    lr: float = 1e-4
    # "cosine": lr x (1 + cos(pi t / n_iters)) / 2 at step t (0-based), down to 0 at the end; the
    # compositional-attention authors anneal so on their triangles (per epoch, of 200).
    lr_schedule: str = "constant"
    weight_decay: float = 0.0
    batch_size: int = 512
    # batches of similar input lengths (the authors' sampler; see train.LengthBuckets)
    length_bucketed: bool = False
    n_iters: int = 30_000
    optimizer: str = "adamw"  # "adamw", "adam" or "rmsprop" (the PANM authors')
    momentum: float = 0.0  # rmsprop only
    rmsprop_alpha: float = 0.99  # rmsprop's smoothing constant (torch's default; the PANM authors use 0.95)
    grad_clip: float | None = 5.0  # 5 for CTL, 1 for arithmetic and ListOps (App. C.3)
    # "norm" (the NDR authors') or "value" (each entry into [-c, c]; the PANM authors')
    grad_clip_by: str = "norm"
    eval_every: int = 1000
    # also report the best checkpoint within this many iterations (Table 2: 50K)
    early_budget: int | None = None
    eval_batch_size: int = 1024
    seed: int = 0
    device: str = "auto"  # "auto" picks CUDA when there is one
    # bf16 autocast, on any device (tests check it against float32 on the CPU); auto: where the step is
    # compiled on CUDA. Compiled, NDR's stacked learning curves at the paper's setting stay within seed
    # noise of TF32's and the step runs 1.36x faster; uncompiled, its casts stay unfused and it is no
    # faster than TF32 (H100, docs/performance.md#gpu-precision-and-learning-curves).
    bf16: bool | str = "auto"
    # TF32 matmuls on CUDA (10-bit mantissas, float32 range): NDR's learning curves at the paper's
    # setting stay within seed noise of float32 (benchmarks/precision_curves.py,
    # docs/performance.md#gpu-precision-and-learning-curves) and its stacked steps run 1.75x faster.
    # No effect on a CPU.
    tf32: bool = True
    # torch.compile the model (Module.compile: checkpoints keep their keys), or a stack's vmapped step:
    # true (torch's default mode) or one of COMPILE_MODES ("reduce-overhead" adds CUDA graphs of its own).
    # auto: a stack of several members on CUDA, in the default mode (1.5-3 minutes of compiling for
    # 1.5x at NDR's 20 members); a single trial and the CPU stay uncompiled (a single NDR's compile
    # failed on CUDA under torch 2.11; on the CPU a compile takes minutes and the step is slower).
    compile: bool | str = "auto"
    # auto: each training step one CUDA graph replay where the model allows (graphs.py); false: eager
    cuda_graphs: str | bool = "auto"
    threads: int | None = None  # torch CPU threads; None leaves torch's default

    @property
    def compile_mode(self) -> str | None:
        """torch.compile's mode, or None where nothing compiles."""
        if self.compile == "auto":
            raise ValueError(
                "compile: auto has no mode until the config is settled for its device (TrainConfig.settled)"
            )
        return None if self.compile is False else "default" if self.compile is True else self.compile

    def settled(self, device_type: str, members: int = 1) -> TrainConfig:
        """This config with `compile: auto` and `bf16: auto` decided for `members` stacked on a
        `device_type` device (what train and batched.Stack run)."""
        compile = (device_type == "cuda" and members > 1) if self.compile == "auto" else self.compile
        bf16 = (device_type == "cuda" and compile is not False) if self.bf16 == "auto" else self.bf16
        return dataclasses.replace(self, compile=compile, bf16=bf16)

    def flat(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "model_options"}
        out.update(self.model_options)
        return out


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CHOICES = {
    "optimizer": ("adamw", "adam", "rmsprop"),
    "lr_schedule": ("constant", "cosine"),
    "grad_clip_by": ("norm", "value"),
    "cuda_graphs": ("auto", False),
    "compile": ("auto", False, True, *COMPILE_MODES),
    "bf16": ("auto", False, True),
}
# (lowest, whether the lowest itself is allowed, highest or None) per numeric training key; null
# only where the key's type allows it (NULLABLE).
RANGES = {
    "lr": (0, True, None),
    "weight_decay": (0, True, None),
    "batch_size": (1, True, None),
    "n_iters": (1, True, None),
    "momentum": (0, True, None),
    "rmsprop_alpha": (0, True, 1),
    "grad_clip": (0, False, None),
    "eval_every": (1, True, None),
    "early_budget": (1, True, None),
    "eval_batch_size": (1, True, None),
    "seed": (0, True, 2**32 - 1),
    "threads": (1, True, 1024),
}
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")
# grad_clip: null turns clipping off
NULLABLE = {name: "None" in str(hint) for name, hint in typing.get_type_hints(TrainConfig).items()}


def yaml_word(value) -> str:
    """A choice as a YAML file writes it (false, not False)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


# A model's numbers, by one rule per kind of key: sizes and counts positive, dropout rates in [0, 1),
# every float finite; and the keys below in their own ranges (PANM's addresses are drawn as int64;
# a PANM may go without Mode-1 or Mode-2 heads, App. D.5). The constructors check what depends on
# several keys (heads dividing d_model, PANM's Mode-1 heads). Counts that build a module each (layers,
# Mode-2 heads) stop at 1,000, a hundred times the papers' most: past that a count is a typo, and
# building it to check it (on the meta device) took minutes: an LSTM of 10^6 layers most of the
# memory, a PANM of 10^6 Mode-2 heads more than 20 s (mutations in tests/test_bad_input.py draw such
# counts).
MODEL_RANGES = {
    "act_threshold": (0, False, 1),
    "act_loss_weight": (0, True, None),
    "ff_multiplier": (0, False, None),
    "sharpness": (0, False, None),
    "clip_controls": (0, False, None),
    "address_bits": (1, True, 62),
    "mode1_heads": (0, True, None),
    "mode2_heads": (0, True, 1000),
    **{key: (1, True, 1000) for key in ("n_layers", "eval_n_layers", "encoder_layers", "decoder_layers")},
}


def model_range(key: str, hint) -> tuple | None:
    if key in MODEL_RANGES:
        return MODEL_RANGES[key]
    if hint in (int, int | None):
        return (1, True, None)
    if hint is float and (key.endswith("dropout") or key == "gate_drop"):
        return (0, True, 1, False)
    if hint is float:
        return (-math.inf, True, None)
    return None


def check_range(key: str, value, bounds: tuple | None = None, nullable: bool | None = None) -> None:
    """`bounds`: (lowest, whether it may equal it, highest or None[, whether it may equal that]);
    RANGES[key] where not given. `nullable`: whether null may stand for the number (NULLABLE[key]
    where not given)."""
    low, low_allowed, high, high_allowed = (*(bounds or RANGES[key]), True)[:4]
    if value is None and (NULLABLE[key] if nullable is None else nullable):
        return
    if value is None or isinstance(value, bool):
        raise ConfigError(
            f"{key}: expected a number, got {yaml_word(value) if value is not None else 'null'}"
        )
    if not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value!r}")
    if (
        value < low
        or (value == low and not low_allowed)
        or (high is not None and (value > high or (value == high and not high_allowed)))
    ):
        bound = f"{'at least' if low_allowed else 'greater than'} {low}"
        if high is not None:
            bound += f" and {'at most' if high_allowed else 'less than'} {high}"
        raise ConfigError(f"{key}: must be {bound}, got {value!r}")


TRAIN_KEYS = {f.name for f in dataclasses.fields(TrainConfig)} - {"model_options"}
# The training keys that say how a model is trained, as a paper's preset sets them: what models
# compared on one task should agree on or differ in by their papers. The rest say where and how
# fast a trial runs, its seed, or what it reports besides (early_budget).
PROTOCOL_KEYS = (
    "optimizer",
    "lr",
    "lr_schedule",
    "momentum",
    "rmsprop_alpha",
    "weight_decay",
    "batch_size",
    "length_bucketed",
    "n_iters",
    "grad_clip",
    "grad_clip_by",
    "eval_every",
)
RMSPROP_KEYS = ("momentum", "rmsprop_alpha")  # read by the rmsprop optimizer only (make_optimizer)


def protocol_keys(optimizer: str | None) -> tuple[str, ...]:
    """The PROTOCOL_KEYS a trial with `optimizer` reads (None: not known, a search varies it)."""
    return tuple(k for k in PROTOCOL_KEYS if optimizer in (None, "rmsprop") or k not in RMSPROP_KEYS)


# What may differ between the members of one stack (trainables.batched): the rest of their configs
# is one. The rates live in tensors too: the optimizer's per member (batched.MemberOptimizer),
# dropout's and gate-drop's as stacked buffers (models.dropout).
RATE_KEYS = ("dropout", "attention_dropout", "query_dropout", "input_dropout", "gate_drop")
MEMBER_KEYS = ("seed", "lr", "weight_decay", "grad_clip", *RATE_KEYS)


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """A config dataclass's fields' types, read once per class (a dry run parses hundreds of
    configs, and typing.get_type_hints evaluates every annotation each time)."""
    return typing.get_type_hints(cls)


def coerce(cls: type, key: str, value: Any) -> Any:
    """Give a value its field's numeric type: YAML reads `1e-3` as a string, and `--set` input is text."""
    hint = str(type_hints(cls)[key])
    if hint == "<class 'bool'>":
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if value is None or isinstance(value, bool):
        return value
    try:
        if "float" in hint:
            return float(value)
        if "int" in hint and "float" not in hint:
            number = float(value)
            if not number.is_integer():
                raise ValueError
            return int(number)
    except (TypeError, ValueError):
        kind = "a number" if "float" in hint else "an integer"
        raise ConfigError(f"{key}: expected {kind}, got {value!r}") from None
    return value


def parse_trial_config(flat: dict[str, Any]) -> TrainConfig:
    if not isinstance(flat, dict):
        raise ConfigError(f"a trial config is a mapping of keys to values, got {flat!r}")
    for required in ("task", "model"):
        if required not in flat:
            raise ConfigError(f"{required}: missing")
        if not isinstance(flat[required], str):
            raise ConfigError(f"{required}: expected a name, got {flat[required]!r}")
    if not isinstance(flat.get("task_options") or {}, dict):
        raise ConfigError(f"task_options: expected a mapping, got {flat['task_options']!r}")
    if flat["task"] not in TASKS:
        raise ConfigError(
            f"task: unknown task {flat['task']!r}{closest(str(flat['task']), TASKS)}; "
            f"known: {', '.join(TASKS)}"
        )
    spec = model_of(flat["model"])
    own = model_fields(flat["model"])
    train, model = {}, {}
    for key, value in flat.items():
        if key in TRAIN_KEYS:
            train[key] = coerce(TrainConfig, key, value)
        elif key in own:
            model[key] = coerce(spec.config, key, value)
        else:
            raise ConfigError(
                f"{key}: not an option of model {flat['model']!r} "
                f"or of training{closest(key, TRAIN_KEYS | own)}"
            )
    try:
        task_config(train["task"], train.get("task_options"))
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"task_options: {e.args[0]}") from None
    for key, allowed in CHOICES.items():
        # 1 is no `true`
        if key in train and not any(train[key] == a and type(train[key]) is type(a) for a in allowed):
            raise ConfigError(
                f"{key}: must be one of {', '.join(yaml_word(a) for a in allowed)}, got {train[key]!r}"
            )
    for key in RANGES.keys() & train.keys():
        check_range(key, train[key])
    hints = type_hints(spec.config)
    for key, value in model.items():
        if bounds := model_range(key, hints[key]):
            check_range(key, value, bounds, nullable=type(None) in typing.get_args(hints[key]))
    if "device" in train and not (isinstance(train["device"], str) and DEVICE.fullmatch(train["device"])):
        raise ConfigError(f"device: must be auto, cpu, cuda, cuda:N or mps, got {train['device']!r}")
    return TrainConfig(**train, model_options=model)


def model_of(name: str):
    """The registry's entry for `name` (models.model_spec), or ConfigError saying why there is none."""
    try:
        return model_spec(name)
    except ModelError as e:
        if is_file_model(name):
            raise ConfigError(f"model: {e}") from None
        raise ConfigError(
            f"model: unknown model {name!r}{closest(name, MODELS)}; known: {', '.join(MODELS)}, "
            "or a model file's class as path/to/file.py:Class"
        ) from None


BUILT: set[str] = set()  # what check_builds built already: a value a build does not read, checked once


def check_builds(cfg: TrainConfig) -> None:
    """Build what a trial of `cfg` would build (its task's config, its model) on the meta device:
    no data, no weights, a fraction of a second; a value the constructors reject (with whatever
    exception they raise: torch asserts too) is a ConfigError naming the first line of why."""
    built = repr((cfg.model, cfg.model_options, cfg.task, cfg.task_options))
    if built in BUILT:
        return
    try:
        task = TASKS[cfg.task].probe(task_config(cfg.task, cfg.task_options))
        with torch.device("meta"):
            build_model(cfg.model, cfg.model_options, task)
    except Exception as e:
        raise ConfigError((str(e) or type(e).__name__).splitlines()[0]) from None
    BUILT.add(built)


def parameter_count(cfg: TrainConfig) -> int:
    """The parameters of the model a trial of `cfg` trains, built on the meta device (no data, no
    weights): what a dry run scales a measured step time by."""
    task = TASKS[cfg.task].probe(task_config(cfg.task, cfg.task_options))
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(cfg.model, cfg.model_options, task).parameters())


def defaults(model: str) -> dict[str, Any]:
    """Every key a trial of `model` can take, with its default value."""
    out = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}
    out.update({f.name: f.default for f in dataclasses.fields(model_spec(model).config)})
    return out


def set_override(flat: dict[str, Any], assignment: str) -> None:
    """Apply one `key=value` (value parsed as YAML; `task_options.direction=backward` reaches inside)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected key=value")
    key, raw = assignment.split("=", 1)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {assignment!r}: the value is not YAML ({str(e).splitlines()[0]})") from None
    *parents, last = key.strip().split(".")
    target = flat
    for depth, p in enumerate(parents):
        target = target.setdefault(p, {})
        if not isinstance(target, dict):
            raise ConfigError(
                f"--set {assignment!r}: {'.'.join(parents[: depth + 1])} is {target!r}, "
                "not a mapping with keys"
            )
    target[last] = value


@functools.lru_cache(maxsize=1)
def _preset_files() -> tuple[dict, ...]:
    """Every file of trainables/presets/, parsed once per process."""
    folder = resources.files("trainables") / "presets"
    return tuple(yaml.safe_load(p.read_text()) for p in sorted(folder.iterdir()) if p.name.endswith(".yaml"))


def preset_models() -> dict[str, list[str]]:
    """Every task that has presets -> the models they cover (`orchestrator train task/model`)."""
    return {
        task: list(data["models"]) for data in _preset_files() for task in data.get("tasks") or [data["task"]]
    }


def presets(task: str) -> dict[str, Any]:
    """The papers' hyperparameters for one task, from the file in trainables/presets/ whose `task`
    is it or whose `tasks` list it (its per-task `overrides` under "overrides")."""
    for data in _preset_files():
        if task == data.get("task") or task in data.get("tasks", ()):
            out = copy.deepcopy({k: v for k, v in data.items() if k != "tasks"})
            out["overrides"] = out.get("overrides", {}).get(task, {})
            return {**out, "task": task}
    raise ConfigError(f"no preset for task {task!r}")


def preset(task: str, model: str, options: dict | None = None) -> dict[str, Any]:
    """The flat trial config of the paper's setting for one model on one task. A preset file's
    `variants` (rows for task options, e.g. Table 6's 4 searches x 8 retrievals) apply where every
    option they name has their value in `options` (the task's defaults where `options` is silent),
    each matching row in turn: its keys beside `options` for every model, then its model's row."""
    data = presets(task)
    if model not in data["models"]:
        raise ConfigError(
            f"preset {task}/{model}: no such model in the {task} presets{closest(model, data['models'])}; "
            f"have: {', '.join(data['models'])}"
        )
    shared = {k: v for k, v in data.items() if k not in ("models", "overrides", "variants")}
    variant: dict[str, Any] = {}
    if data.get("variants"):
        try:
            resolved = dataclasses.asdict(task_config(task, options))
        except (KeyError, TypeError, ValueError):
            # refused where the options are checked, with the file and key
            resolved = dict(options or {})
        for entry in data["variants"]:
            if all(resolved.get(k) == v for k, v in entry["options"].items()):
                variant.update({k: v for k, v in entry.items() if k not in ("options", "models")})
                variant.update(entry.get("models", {}).get(model, {}))
    # The task's own overrides (e.g. ID Sort's longer training) win over the model's row.
    return {**shared, "model": model, **data["models"][model], **variant, **data["overrides"]}
