"""A trial's config: one flat mapping (what a search space and `--set` speak) -> typed parts.

Flat keys are either training keys (TrainConfig's fields), keys of the chosen model's config
dataclass, or `task_options` (a mapping given to the task's config dataclass).

What a trial's config may hold is judged here, once, without building anything:

    check(flat) -> [(key, reason), ...]   every problem of a flat trial config; [] where none
    problem_text(key, reason) -> str      a problem's line (trainables.fields): `key: reason`, or
                                          the reason alone where key is "" (a rule between keys,
                                          e.g. "d_model=128 is not divisible by n_heads=3")
    parse_trial_config(flat)              TrainConfig, or ConfigError(problem_text of check's first)
    keys_of(model) -> set[str]            the keys a trial of `model` can take
    task_problem(name), model_problem(name) -> str | None
                                          why a name names no task / no model, or None

Each value is judged by its own field (TrainConfig's and each model config's ranges and choices,
stated as field metadata: trainables.fields), then by its config's rules between keys (a model
config's `joint_problems`); each config checks itself so in `__post_init__` too. What only a build
finds (a model's kind against its task's, torch's own checks) is check_builds'.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from .fields import (
    MOST_SAMPLES,
    chosen,
    closest,
    hints,
    matching,
    problem_text,
    problems,
    ranged,
    refusal,
    validate,
)
from .fields import defaults as field_defaults
from .models import ModelError, build_model, model_fields, model_spec, unknown_model
from .tasks import TASKS, task_config, unknown_task


class ConfigError(ValueError):
    """A config key or value that cannot work; the message names the key and the reason."""


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class TrainConfig:
    task: str
    model: str
    task_options: dict = field(default_factory=dict)
    model_options: dict = field(default_factory=dict)
    lr: float = ranged(1e-4, 0)
    # "cosine": lr x (1 + cos(pi t / n_iters)) / 2 at step t (0-based), down to 0 at the end; the
    # compositional-attention authors anneal so on their triangles (per epoch, of 200).
    lr_schedule: str = chosen("constant", ("constant", "cosine"))
    weight_decay: float = ranged(0.0, 0)
    batch_size: int = ranged(512, 1, MOST_SAMPLES)
    # batches of similar input lengths (the authors' sampler; see batches.LengthBuckets)
    length_bucketed: bool = False
    n_iters: int = ranged(30_000, 1)
    optimizer: str = chosen("adamw", ("adamw", "adam", "rmsprop"))  # rmsprop: the PANM authors'
    momentum: float = ranged(0.0, 0)  # rmsprop only
    # rmsprop's smoothing constant (torch's default; the PANM authors use 0.95)
    rmsprop_alpha: float = ranged(0.99, 0, 1)
    # 5 for CTL, 1 for arithmetic and ListOps (App. C.3); null turns clipping off
    grad_clip: float | None = ranged(5.0, 0, low_inclusive=False)
    # "norm" (the NDR authors') or "value" (each entry into [-c, c]; the PANM authors')
    grad_clip_by: str = chosen("norm", ("norm", "value"))
    eval_every: int = ranged(1000, 1)
    # also report the best checkpoint within this many iterations (Table 2: 50K)
    early_budget: int | None = ranged(None, 1)
    eval_batch_size: int = ranged(1024, 1, MOST_SAMPLES)
    seed: int = ranged(0, 0, 2**32 - 1)
    # "auto" picks CUDA when there is one
    device: str = matching("auto", r"auto|cpu|cuda(:\d+)?|mps", "auto, cpu, cuda, cuda:N or mps")
    # bf16 autocast, on any device (tests check it against float32 on the CPU); auto: where the step is
    # compiled on CUDA. Compiled, NDR's stacked learning curves at the paper's setting stay within seed
    # noise of TF32's and the step runs 1.36x faster; uncompiled, its casts stay unfused and it is no
    # faster than TF32 (H100, docs/performance.md#gpu-precision-and-learning-curves).
    bf16: bool | str = chosen("auto", ("auto", False, True))
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
    compile: bool | str = chosen("auto", ("auto", False, True, *COMPILE_MODES))
    # auto: each training step one CUDA graph replay where the model allows (graphs.py); false: eager
    cuda_graphs: str | bool = chosen("auto", ("auto", False))
    threads: int | None = ranged(None, 1, 1024)  # torch CPU threads; None leaves torch's default

    def __post_init__(self):
        validate(self)

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


def check_range(key: str, value) -> None:
    """ConfigError where training key `key`'s field refuses `value` (a seed list's seeds)."""
    f = next(f for f in dataclasses.fields(TrainConfig) if f.name == key)
    if reason := refusal(f, hints(TrainConfig)[key], value):
        raise ConfigError(problem_text(key, reason))


def coerce(cls: type, key: str, value: Any) -> tuple[Any, str | None]:
    """(the value in its field's numeric type, or why it has none): YAML reads `1e-3` as a string,
    and `--set` input is text."""
    hint = str(hints(cls)[key])
    if hint == "<class 'bool'>":
        return value, None if isinstance(value, bool) else f"expected true or false, got {value!r}"
    if value is None or isinstance(value, bool):
        return value, None
    try:
        if "float" in hint:
            return float(value), None
        if "int" in hint and "float" not in hint:
            number = float(value)
            if not number.is_integer():
                raise ValueError
            return int(number), None
    except (TypeError, ValueError):
        return value, f"expected {'a number' if 'float' in hint else 'an integer'}, got {value!r}"
    return value, None


def task_problem(name) -> str | None:
    """Why `name` names no task (tasks.unknown_task), or None where it names one."""
    return None if isinstance(name, str) and name in TASKS else unknown_task(name)


def model_problem(name) -> str | None:
    """Why `name` names no model (models.model_spec: one of MODELS, a model file's class or an entry
    point), or None where it names one: a model file's own fault, else the names there are."""
    if not isinstance(name, str):
        return unknown_model(name)
    try:
        model_spec(name)
        return None
    except ModelError as e:
        return str(e)


def keys_of(model: str) -> set[str]:
    """The keys a trial of `model` can take: the training keys and its config's fields."""
    return TRAIN_KEYS | model_fields(model)


def _named_problems(flat: dict) -> list[tuple[str, str]]:
    """The problems of a flat config's task, model and task_options themselves."""
    found = [
        (key, "missing" if key not in flat else f"expected a name, got {flat[key]!r}")
        for key in ("task", "model")
        if not isinstance(flat.get(key), str)
    ]
    if not isinstance(flat.get("task_options") or {}, dict):
        found.append(("task_options", f"expected a mapping, got {flat['task_options']!r}"))
    for key, problem in (("task", task_problem), ("model", model_problem)):
        if isinstance(flat.get(key), str) and (reason := problem(flat[key])):
            found.append((key, reason))
    return found


def _typed(flat: dict, known_model: bool) -> tuple[dict, dict, list[tuple[str, str]]]:
    """(training values, model values, problems): each key of `flat` in its field's type, or why
    it is no key of training or of the model, or has no value of its type (model keys only where
    the model is `known_model`)."""
    train, model, found = {}, {}, []
    own = model_fields(flat["model"]) if known_model else set()
    config = model_spec(flat["model"]).config if known_model else None
    for key, value in flat.items():
        if key in TRAIN_KEYS:
            target, cls = train, TrainConfig
        elif key in own:
            target, cls = model, config
        elif known_model:
            hint = closest(key, keys_of(flat["model"]))
            found.append((key, f"not an option of model {flat['model']!r} or of training{hint}"))
            continue
        else:
            continue
        target[key], reason = coerce(cls, key, value)
        if reason:
            found.append((key, reason))
            del target[key]
    return train, model, found


def _checked(flat: dict) -> tuple[dict, dict, list[tuple[str, str]]]:
    """check's problems of `flat`, with its training and model values (typed) where it has none."""
    if not isinstance(flat, dict):
        return {}, {}, [("", f"a trial config is a mapping of keys to values, got {flat!r}")]
    found = _named_problems(flat)
    bad = {key for key, _ in found}
    train, model, typing_problems = _typed(flat, known_model="model" not in bad)
    found += typing_problems
    if not bad & {"task", "task_options"}:
        try:
            task_config(flat["task"], flat.get("task_options"))
        except (KeyError, TypeError, ValueError) as e:
            found.append(("task_options", e.args[0]))
    found += problems(TrainConfig, train)
    if "model" not in bad:
        found += problems(model_spec(flat["model"]).config, model)
    return train, model, found


def check(flat: dict) -> list[tuple[str, str]]:
    """Every (key, reason) problem of a flat trial config (its task and model, training keys, model
    keys, task_options), without building anything; `problem_text(key, reason)` is its line, which
    parse_trial_config raises for the first."""
    return _checked(flat)[2]


def parse_trial_config(flat: dict[str, Any]) -> TrainConfig:
    """The typed config of a flat trial config, or ConfigError with the line of its first problem."""
    train, model, found = _checked(flat)
    if found:
        raise ConfigError(problem_text(*found[0]))
    return TrainConfig(**train, model_options=model)


BUILT: set[str] = set()  # what check_builds built already: a value a build does not read, checked once


def check_builds(cfg: TrainConfig) -> None:
    """Build what a trial of `cfg` would build (its task's config, its model) on the meta device:
    no data, no weights, a fraction of a second; a value the constructors reject (with whatever
    exception they raise: torch asserts too) is a ConfigError naming the first line of why."""
    built = repr((cfg.model, cfg.model_options, cfg.task, cfg.task_options))
    if built in BUILT:
        return
    try:
        _built_on_meta(cfg)
    except Exception as e:
        raise ConfigError((str(e) or type(e).__name__).splitlines()[0]) from None
    BUILT.add(built)


def parameter_count(cfg: TrainConfig) -> int:
    """The parameters of the model a trial of `cfg` trains, built on the meta device (no data, no
    weights): what a dry run scales a measured step time by."""
    return sum(p.numel() for p in _built_on_meta(cfg).parameters())


def _built_on_meta(cfg: TrainConfig):
    """The model a trial of `cfg` trains, built for its task's probe on the meta device."""
    # torch is imported by a build alone: judging a config (check) and reading a launch go without.
    import torch  # noqa: PLC0415

    task = TASKS[cfg.task].probe(task_config(cfg.task, cfg.task_options))
    with torch.device("meta"):
        return build_model(cfg.model, cfg.model_options, task)


def defaults(model: str) -> dict[str, Any]:
    """Every key a trial of `model` can take, with its default value."""
    train = {
        k: v for k, v in field_defaults(TrainConfig).items() if k not in ("task_options", "model_options")
    }
    return {**train, **field_defaults(model_spec(model).config)}


def set_override(flat: dict[str, Any], assignment: str) -> None:
    """Apply one `key=value` (value parsed as YAML; `task_options.direction=backward` reaches inside)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected key=value")
    key, raw = assignment.split("=", 1)
    try:
        value = yaml.safe_load(raw)
    except (yaml.YAMLError, RecursionError) as e:  # nested past Python's limit: PyYAML's recursion
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
