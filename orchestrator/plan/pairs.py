"""The pairs of a file: its tasks and models, which model runs which task, and each pair's
config, space and grid (what its trials train), judged and built before launch (plan.probes)."""

from __future__ import annotations

from dataclasses import dataclass

from trainables.config import (
    ConfigError,
    check,
    defaults,
    keys_of,
    model_problem,
    parse_trial_config,
    preset,
    presets,
    protocol_keys,
    task_problem,
)
from trainables.fields import closest
from trainables.models import MODELS, model_spec
from trainables.models import canonical as canonical_model
from trainables.models import label as model_label
from trainables.tasks import TASKS, task_config

from .probes import check_trials, refuse
from .sections import parse_grid, parse_resources, refuse_set_elsewhere
from .source import SpecError, safe_name
from .space import Distribution, parse_space
from .study import Budget, Pair, Resources, TaskEntry


def parse_tasks(raw, path) -> list[TaskEntry]:
    if not raw:
        raise SpecError(path, "tasks", "missing or empty: name at least one task")
    if not isinstance(raw, list):
        raise SpecError(path, "tasks", "expected a list")
    out, variants = [], set()
    for k, entry in enumerate(raw):
        where = f"tasks[{k}]"
        if isinstance(entry, str):
            entry = {"task": entry}
        if not isinstance(entry, dict) or "task" not in entry:
            raise SpecError(path, where, "expected a task name or {task, variant, options}")
        for key in entry:
            if key not in ("task", "variant", "options"):
                raise SpecError(
                    path,
                    f"{where}.{key}",
                    f"unknown key{closest(str(key), ['task', 'variant', 'options'])}; "
                    "valid: task, variant, options",
                )
        name = entry["task"]
        if reason := task_problem(name):
            raise SpecError(path, f"{where}.task", reason)
        options = entry.get("options") or {}
        if not isinstance(options, dict):
            raise SpecError(path, f"{where}.options", f"expected a mapping of task options, got {options!r}")
        try:
            task_config(name, options)
        except (TypeError, ValueError) as e:
            raise SpecError(path, f"{where}.options", str(e.args[0])) from None
        variant = safe_name(entry.get("variant", name), path, f"{where}.variant")
        if variant in variants:
            raise SpecError(
                path,
                f"{where}.variant",
                f"variant {variant!r} appears twice; give each task entry its own variant name",
            )
        variants.add(variant)
        out.append(TaskEntry(name, variant, options))
    return out


def parse_models(raw, path) -> list[str]:
    if raw == "all":
        return list(MODELS)
    if not raw or not isinstance(raw, list):
        raise SpecError(path, "models", "expected a list of model names or 'all'")
    for k, name in enumerate(raw):
        if reason := model_problem(name):
            raise SpecError(path, f"models[{k}]", reason)
        if name in raw[:k] or model_label(name) in map(model_label, raw[:k]):
            raise SpecError(
                path, f"models[{k}]", f"{name} appears twice: its pairs would share one name, study and runs"
            )
    return list(raw)


def incompatible_pairs(
    tasks: list[TaskEntry], models: list[str], named: bool, path
) -> dict[tuple[str, str], str]:
    """The (variant, model) pairs whose model cannot run the task's kind, each with the reason:
    `models: all` skips them; a model the file names is refused, or a comparison would quietly
    lose it (its baseline)."""
    out = {}
    for k, model in enumerate(models):
        kinds = model_spec(model).kinds
        for task in tasks:
            kind = TASKS[task.task].kind
            if kind in kinds:
                continue
            names = [str(k) for k in kinds]
            runs = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
            reason = f"{model} runs {runs}; {task.task} is {kind}"
            if named:
                runners = ", ".join(m for m, spec in MODELS.items() if kind in spec.kinds)
                raise SpecError(
                    path,
                    f"models[{k}]",
                    f"{model} cannot run task {task.task!r}: {reason}, which {runners} run; each listed "
                    "model must run every task of the file (`models: all` takes those that can)",
                )
            out[(task.variant, model)] = reason
    return out


def skipped_pairs(incompatible: dict, pairs: list, path) -> list[str]:
    """The pairs left out as incompatible, in words; SpecError where no pair is left."""
    skipped = [f"{variant} x {model}: {reason}" for (variant, model), reason in incompatible.items()]
    if not pairs:
        raise SpecError(
            path, "models", f"no model in this file can run any of its tasks: {'; '.join(skipped)}"
        )
    return skipped


def parse_per_pair(raw, tasks: list[TaskEntry], models: list[str], path) -> dict[str, dict]:
    """`per_pair: {<variant>__<model>: {fixed: {...}}}`: one pair's values over the file's and its
    model's `fixed` (a search's winners, as `orchestrator best --ablation` writes them); a grid
    still sweeps its own keys."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpecError(path, "per_pair", "expected a mapping of pair name (<variant>__<model>) -> {fixed}")
    names = [f"{task.variant}__{model}" for model in models for task in tasks]
    out = {}
    for name, entry in raw.items():
        if name not in names:
            raise SpecError(
                path,
                f"per_pair.{name}",
                f"not a pair of this file{closest(str(name), names)}; its pairs: {', '.join(names)}",
            )
        if (
            not isinstance(entry, dict)
            or set(entry) - {"fixed"}
            or not isinstance(entry.get("fixed") or {}, dict)
        ):
            raise SpecError(
                path, f"per_pair.{name}", f"expected {{fixed: {{key: value, ...}}}}, got {entry!r}"
            )
        refuse_set_elsewhere(entry.get("fixed") or {}, f"per_pair.{name}.fixed", path)
        out[name] = dict(entry.get("fixed") or {})
    return out


@dataclass(frozen=True)
class Shared:
    """The file's sections every pair starts from, which a model's per_model entry adds to."""

    space: dict[str, Distribution]
    fixed: dict
    grid: dict[str, list]
    resources: Resources
    budget: Budget
    seed: int


def parse_pairs(
    tasks: list[TaskEntry],
    models: list[str],
    per_model: dict,
    per_pair: dict[str, dict],
    shared: Shared,
    incompatible: dict,
    path,
    recorded: bool,
) -> list[Pair]:
    """Each model on each task it runs (not those `incompatible` holds); a `recorded` launch's
    pairs are judged, not built (check_trials)."""
    pairs = []
    for model in models:
        overrides = per_model.get(model) or {}
        own_space = parse_space(overrides.get("space") or {}, f"per_model.{model}.space", path)
        for task in tasks:
            if (task.variant, model) in incompatible:
                continue
            own_fixed = per_pair.get(f"{task.variant}__{model}", {})
            pairs.append(_make_pair(task, model, overrides, own_space, own_fixed, shared, path, recorded))
    return pairs


def check_named_keys(models: list[str], per_model: dict, space: dict, fixed: dict, grid: dict, path) -> None:
    """Each per_model entry names one of the file's models, and each key of the file's space, fixed
    and grid a parameter of one of them."""
    for model in per_model:
        if model not in models:
            raise SpecError(
                path, f"per_model.{model}", f"model is not in this file's models{closest(str(model), models)}"
            )
    valid = set().union(*map(keys_of, models))
    for section, keys in (("space", space), ("fixed", fixed), ("grid", grid)):
        for key in keys:
            if key not in valid:
                raise SpecError(
                    path,
                    f"{section}.{key}",
                    f"no model in this file has this parameter{closest(str(key), valid)}",
                )


def _taken(values: dict, model: str) -> dict:
    """The keys of the file's own section (space, fixed, grid) that `model` has: the file's may hold
    keys one of its models lacks (heads of an LSTM), a model's own sections may not."""
    return {k: v for k, v in values.items() if k in keys_of(model)}


def _make_pair(
    task: TaskEntry,
    model: str,
    overrides: dict,
    own_space: dict,
    own_fixed: dict,
    shared: Shared,
    path,
    recorded: bool,
) -> Pair:
    """One model on one task: its config and space (_pair_config) under its model's fixed values
    and then its own (per_pair), its model's resources and grid; its trials judged in every grid
    cell and at its space's extremes (check_trials)."""
    name = f"{task.variant}__{model}"
    where = f"per_model.{model}.grid"
    # A model's own grid (Table 6's head counts for multi-head attention only) adds to the file's.
    own_grid = parse_grid({"grid": overrides.get("grid")}, path, where)[0]
    # The file's key of each key a model's own section gives that the model lacks: the judge's
    # reason is said there.
    given = [
        (own_fixed, f"per_pair.{name}.fixed"),
        (own_space, f"per_model.{model}.space"),
        (own_grid, where),
    ]
    labels = {k: f"{section}.{k}" for values, section in given for k in values if k not in keys_of(model)}
    space = {**_taken(shared.space, model), **own_space}
    model_fixed = overrides.get("fixed") or {}
    base, warm = _pair_config(
        task, model, space, _taken(shared.fixed, model), {**model_fixed, **own_fixed}, shared, labels, path
    )
    resources = parse_resources(
        overrides.get("resources"), shared.resources, f"per_model.{model}.resources", path
    )
    grid = {**_taken(shared.grid, model), **own_grid}
    base = {k: v for k, v in base.items() if k not in grid}
    from_preset, from_defaults = _protocol_origins(
        task, model, base, {**shared.fixed, **model_fixed, **own_fixed}, {*space, *grid}, shared.budget
    )
    # The threads a trial runs on are in its config, recorded and re-run with it (best/<pair>.yaml):
    # on a CPU they change the sums' order, hence the numbers. The file's, else its CPU share.
    if base.get("threads") is None:
        base["threads"] = max(1, int(resources.cpu))
    device_key = f"per_model.{model}.fixed.device" if "device" in model_fixed else "fixed.device"
    pair = Pair(
        task=task,
        model=model,
        space=space,
        base=base,
        warm_start=warm,
        grid=grid,
        resources=resources,
        device_key=device_key,
        own_values={k: v for k, v in own_fixed.items() if k in base},
        from_preset=from_preset,
        from_defaults=from_defaults,
    )
    _check_gpu(pair, overrides, path)
    check_trials(path, pair, labels, build=not recorded)
    return pair


def _check_gpu(pair: Pair, overrides: dict, path) -> None:
    """A pair whose device is CUDA has a GPU per trial (`overrides`: its model's per_model entry)."""
    if pair.needs_gpu and pair.resources.gpu == 0:
        given = "gpu" in (overrides.get("resources") or {})
        asked = f"per_model.{pair.model}.resources" if given else "resources"
        key, device = pair.cuda_device
        raise SpecError(
            path,
            key,
            f"{device} needs a GPU, and {asked}.gpu gives its trials none "
            "(Ray hides the GPUs from a trial that asks for none)",
        )


def _protocol_origins(
    task: TaskEntry, model: str, base: dict, fixed: dict, varied: set, budget: Budget
) -> tuple[dict, dict]:
    """({key: value} of the protocol keys the paper's preset gives the pair, {key: value} of those at
    the training defaults), of the keys its optimizer reads that neither the budget nor the file
    sets (`fixed`: the file's fixed values, its model's and its pair's; `varied`: its space and
    grid); `base` holds their values."""
    paper = preset(task.task, model, task.options) if model in presets(task.task)["models"] else {}
    set_by_file = {*fixed, *varied, *(k for k in ("n_iters", "eval_every") if getattr(budget, k))}
    model_defaults = defaults(model)
    optimizer = None if "optimizer" in varied else base.get("optimizer", model_defaults["optimizer"])
    left = [key for key in protocol_keys(optimizer) if key not in set_by_file]
    return (
        {key: base[key] for key in left if key in paper},
        {key: base.get(key, model_defaults[key]) for key in left if key not in paper},
    )


def _pair_config(
    task: TaskEntry,
    model: str,
    space: dict,
    fixed: dict,
    model_fixed: dict,
    shared: Shared,
    labels: dict,
    path,
) -> tuple[dict, dict | None]:
    """(the pair's flat trial config without its searched keys, the paper's setting of its space's
    keys moved into the space, or None); `fixed`: the file's fixed values the model has,
    `model_fixed` its model's and its own (per_pair)."""
    try:
        base = (
            preset(task.task, model, task.options)
            if model in presets(task.task)["models"]
            else {"task": task.task, "model": canonical_model(model)}
        )
    except ConfigError as e:
        raise SpecError(path, "models", str(e)) from None
    model_defaults = defaults(model)
    paper_setting = {k: base.get(k, model_defaults.get(k)) for k in space}
    base.update(fixed)
    base.update(model_fixed)
    where = f"fixed ({task.variant}__{model})"
    if not isinstance(base.get("task_options", {}), dict):
        raise SpecError(
            path, where, f"task_options: expected a mapping of task options, got {base['task_options']!r}"
        )
    base.update(task_options={**base.get("task_options", {}), **task.options}, seed=shared.seed)
    if shared.budget.n_iters:
        base["n_iters"] = shared.budget.n_iters
    if shared.budget.eval_every:
        base["eval_every"] = shared.budget.eval_every
    # Every value of `fixed` passes the judge, one the pair's space replaces too.
    refuse(path, f"{task.variant}__{model}", check(base), labels, {}, {}, "fixed")
    # A pair without a paper setting (no preset) trains the trial's default length: ASHA's horizon,
    # the cost and the report need it said.
    base.setdefault("n_iters", parse_trial_config(base).n_iters)
    for key in space:
        base.pop(key, None)
    warm = {k: space[k].nearest(v) for k, v in paper_setting.items()}
    return base, warm or None
