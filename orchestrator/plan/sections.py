"""A file's sections, each parsed on its own into a value of plan.study (or the plain data a pair
is made from): every key a file may hold, and each refusal of what it says."""

from __future__ import annotations

import dataclasses
import math
import re

from trainables.config import ConfigError, check_range
from trainables.fields import closest
from trainables.scores import LOWER_IS_BETTER, SCORES
from trainables.tasks import TASKS

from .source import SpecError, safe_name
from .space import repeats
from .storage import TrialStorage
from .study import Budget, Confirm, Pair, Report, Resources, Scheduler, TaskEntry, Tracking

TOP_KEYS = {  # each with what it holds: the search-space reference page (orchestrator.reference)
    "name": "the file's name: its MLflow experiment and launch folders (default: the file's stem)",
    "metric": "what a trial is selected by, e.g. best_ood_valid_acc (default) or best_ood_valid_token_acc",
    "mode": "max or min; follows the metric (max for *_acc, min for *_l1), a contrary one is refused",
    "seed": "a search's trials' seed (default 0)",
    "tasks": "the tasks, each a name or {task, variant, options}",
    "models": "the models (a list of names or path/file.py:Class), or all: those that run the tasks",
    "budget": "trials per pair, concurrency, steps per trial, restarts, stack size",
    "scheduler": "asha (early stopping, the default) or fifo",
    "resources": "one trial's CPUs, GPUs (a fraction shares one) and custom Ray resources",
    "tracking": "the MLflow store (uri) and experiment",
    "space": "what TPE searches: key -> {loguniform|uniform|int: [low, high]} or {choice: [...]}",
    "per_model": "a model's own space, fixed, grid and resources, over the file's",
    "fixed": "values every trial takes (the papers' presets otherwise)",
    "warm_start": "whether the first trial of a pair tries the paper's setting (default true)",
    "storage_path": "where launch folders go (default runs)",
    "storage": "where trial checkpoints go: a folder or s3://... (default: under storage_path)",
    "grid": "an ablation's grid: key -> list of values, every combination over every seed",
    "seeds": "an ablation's seeds: each grid cell trains once per seed",
    "report": "how reports and the nightly check read a cell's seeds, and the headline test split",
    "confirm": "a search's top_k trials trained again with new seeds: the answer is their mean",
    "batch_seeds": "stack trials (seeds, suggestions) in one model: auto (trials on GPUs), true or false",
    "per_pair": "one pair's own fixed values (a search's winners: orchestrator best --ablation)",
}


METRICS = tuple(
    f"{m}_{score}" for score in SCORES for m in ("best_ood_valid", "ood_valid", "iid_valid")
) + tuple(f"test_{score}_at_best" for score in SCORES)


PER_MODEL_KEYS = ("fixed", "grid", "resources", "space")


# Trial keys a file sets with keys of its own: in fixed, a space or a grid they would change what a
# pair trains (`fixed: {task: reverse}` trained every copy pair on reverse) or be overwritten
# (`fixed: {seed: abc}` was ignored).
SET_ELSEWHERE = {
    "task": "the file's tasks set it (a task entry's options for its settings)",
    "model": "the file's models set it (per_model.<model> for a model's own values)",
    "seed": "the file's seed (a search's trials) and seeds (an ablation's) set it",
}


def refuse_set_elsewhere(keys, where: str, path) -> None:
    for key in keys:
        if key in SET_ELSEWHERE:
            raise SpecError(path, f"{where}.{key}", SET_ELSEWHERE[key])


def parse_top(raw, path) -> dict:
    if not isinstance(raw, dict):
        raise SpecError(path, "file", "expected a mapping at the top level")
    for key, value in raw.items():
        if key not in TOP_KEYS:
            raise SpecError(
                path,
                str(key),
                f"unknown key{closest(str(key), TOP_KEYS)}; valid: {', '.join(sorted(TOP_KEYS))}",
            )
        _refuse_list_for_plural(key, value, TOP_KEYS, str(key), path)
    return raw


def _refuse_list_for_plural(key, value, keys, where: str, path) -> None:
    """A list given to a key of one value where `keys` has its plural (`seed: [0, 1]` for seeds)."""
    if isinstance(value, list) and f"{key}s" in keys:
        raise SpecError(path, where, f"expected one value, got a list {value!r} (did you mean '{key}s'?)")


def _section(cls, raw, key: str, path):
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise SpecError(path, key, f"expected a mapping, got {raw!r}")
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    for k, value in raw.items():
        if k not in types:
            raise SpecError(
                path, f"{key}.{k}", f"unknown key{closest(str(k), types)}; valid: {', '.join(sorted(types))}"
            )
        _refuse_list_for_plural(k, value, types, f"{key}.{k}", path)
        if not _has_type(value, types[k]):
            raise SpecError(
                path, f"{key}.{k}", f"expected {types[k].replace(' | None', ' or null')}, got {value!r}"
            )
    return cls(**raw)


def _has_type(value, hint: str) -> bool:
    """Whether a YAML value fits a section field's annotation (int, float, str, dict, "... | None")."""
    if value is None:
        return "None" in hint
    bases = hint.split(" | ")
    if isinstance(value, bool):
        return "bool" in bases
    fits = {
        "int": isinstance(value, int),
        "float": isinstance(value, (int, float)),
        "str": isinstance(value, str),
        "dict": isinstance(value, dict),
    }
    checked = [fits[base] for base in bases if base in fits]
    return any(checked) or not checked


def _positive(path, key: str, value, allow_zero=False):
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (isinstance(value, int) or math.isfinite(value))  # an int past a float's range is finite
        and (value >= 0 if allow_zero else value > 0)
    )
    if not ok:
        raise SpecError(
            path,
            key,
            f"must be a finite {'non-negative' if allow_zero else 'positive'} number, got {value!r}",
        )


def parse_metric(raw: dict, path) -> str:
    metric = raw.get("metric", "best_ood_valid_acc")
    if metric not in METRICS:
        raise SpecError(
            path,
            "metric",
            f"unknown metric {metric!r}{closest(str(metric), METRICS)}; valid: {', '.join(METRICS)}",
        )
    return metric


def metric_score(metric: str, tasks: list[TaskEntry], path) -> str:
    """The score the metric names (e.g. "token_acc"); every task of the file must report it."""
    score = max((s for s in SCORES if f"_{s}" in metric), key=len)  # rel_l1 rather than l1
    for task in tasks:
        reported = TASKS[task.task].kind.scores
        if score not in reported:
            raise SpecError(
                path,
                "metric",
                f"{metric} does not exist for task {task.task!r}, which reports "
                f"{', '.join(reported)} (e.g. best_ood_valid_{reported[0]})",
            )
    return score


def parse_mode(raw: dict, metric: str, score: str, path) -> str:
    """The file's mode, which must be the one its metric's score is ranked by."""
    expected = "min" if score in LOWER_IS_BETTER else "max"
    mode = raw.get("mode", expected)
    if mode != expected:
        raise SpecError(path, "mode", f"{metric} measures {score}, so mode must be {expected}, got {mode!r}")
    return mode


def parse_seed(raw: dict, path) -> int:
    seed = raw.get("seed", 0)
    if not isinstance(seed, int):
        raise SpecError(path, "seed", f"must be an integer, got {seed!r}")
    return seed


def parse_budget(raw, path) -> Budget:
    """A file's `budget` (or a nightly file's, which the files it lists take over their own: checked
    here, or a listed file would be blamed for its values)."""
    budget = _section(Budget, raw, "budget", path)
    _positive(path, "budget.trials", budget.trials)
    _positive(path, "budget.max_concurrent", budget.max_concurrent)
    for key in ("n_iters", "eval_every", "cluster_concurrent"):
        if getattr(budget, key) is not None:
            _positive(path, f"budget.{key}", getattr(budget, key))
    if (
        not isinstance(budget.max_failures, int)
        or isinstance(budget.max_failures, bool)
        or budget.max_failures < 0
    ):
        raise SpecError(
            path, "budget.max_failures", f"must be a non-negative integer, got {budget.max_failures!r}"
        )
    if budget.stack_size != "auto" and (
        not isinstance(budget.stack_size, int) or isinstance(budget.stack_size, bool) or budget.stack_size < 1
    ):
        raise SpecError(
            path, "budget.stack_size", f"must be a positive integer or auto, got {budget.stack_size!r}"
        )
    return budget


def parse_scheduler(raw, path) -> Scheduler:
    scheduler = _section(Scheduler, raw, "scheduler", path)
    if scheduler.name not in ("asha", "fifo"):
        hint = closest(str(scheduler.name), ["asha", "fifo"])
        raise SpecError(
            path, "scheduler.name", f"unknown scheduler {scheduler.name!r}{hint}; valid: asha, fifo"
        )
    _positive(path, "scheduler.grace_period", scheduler.grace_period)
    if not isinstance(scheduler.reduction_factor, (int, float)) or scheduler.reduction_factor <= 1:
        raise SpecError(
            path, "scheduler.reduction_factor", f"must be above 1, got {scheduler.reduction_factor!r}"
        )
    return scheduler


def parse_resources(raw, default: Resources, key: str, path) -> Resources:
    """A trial's resources: `raw`'s keys over `default`'s (the file's, for a per_model entry)."""
    given = _section(Resources, raw, key, path)
    resources = dataclasses.replace(default, **{k: getattr(given, k) for k in (raw or {})})
    _positive(path, f"{key}.cpu", resources.cpu)
    _positive(path, f"{key}.gpu", resources.gpu, allow_zero=True)
    if resources.gpu > 1:
        raise SpecError(path, f"{key}.gpu", f"a trial uses at most one GPU; got {resources.gpu}")
    if not isinstance(resources.custom, dict):
        raise SpecError(
            path, f"{key}.custom", f"expected a mapping of resource name -> amount, got {resources.custom!r}"
        )
    for name, amount in resources.custom.items():
        safe_name(name, path, f"{key}.custom")
        _positive(path, f"{key}.custom.{name}", amount, allow_zero=True)
    return resources


def parse_tracking(raw, path) -> Tracking:
    tracking = _section(Tracking, raw, "tracking", path)
    if tracking.experiment is not None:
        safe_name(tracking.experiment, path, "tracking.experiment")
    if not any(
        tracking.uri.startswith(s) for s in ("sqlite:///", "postgresql", "mysql", "http://", "https://")
    ):
        # Named by its scheme alone: the rest may hold a password that no pattern finds in a URI it
        # cannot parse.
        scheme = re.match(r"([a-zA-Z][\w+.-]*)://", tracking.uri)
        raise SpecError(
            path,
            "tracking.uri",
            "expected sqlite:///..., postgresql://..., mysql://... or http(s)://..., got "
            + (f"a {scheme[1]}:// URI" if scheme else "no scheme://"),
        )
    return tracking


def parse_per_model(raw, path) -> dict:
    """`per_model: {<model>: {space, fixed, grid, resources}}`, each entry's parts as mappings (the
    pairs parse their contents)."""
    per_model = raw or {}
    if not isinstance(per_model, dict):
        raise SpecError(
            path, "per_model", "expected a mapping of model name -> {space, fixed, grid, resources}"
        )
    for model, entry in per_model.items():
        if not isinstance(entry or {}, dict):
            raise SpecError(
                path,
                f"per_model.{model}",
                f"expected a mapping with space, fixed, grid or resources, got {entry!r}",
            )
        for k, value in (entry or {}).items():
            if k not in PER_MODEL_KEYS:
                raise SpecError(
                    path,
                    f"per_model.{model}.{k}",
                    f"unknown key{closest(str(k), PER_MODEL_KEYS)}; valid: {', '.join(PER_MODEL_KEYS)}",
                )
            if not isinstance(value or {}, dict):
                raise SpecError(path, f"per_model.{model}.{k}", f"expected a mapping, got {value!r}")
            if k != "resources":
                refuse_set_elsewhere(value or {}, f"per_model.{model}.{k}", path)
    return per_model


def parse_fixed(raw, path) -> dict:
    fixed = raw or {}
    if not isinstance(fixed, dict):
        raise SpecError(path, "fixed", "expected a mapping of trial config keys")
    refuse_set_elsewhere(fixed, "fixed", path)
    return fixed


def parse_grid(
    raw: dict, path, where: str = "grid", recorded: bool = False
) -> tuple[dict[str, list], list[int]]:
    """The grid and seeds; a `recorded` launch's grid without seeds ran seed 0 (when that was allowed)."""
    grid = raw.get("grid") or {}
    if not isinstance(grid, dict):
        raise SpecError(path, where, "expected a mapping of parameter -> list of values")
    refuse_set_elsewhere(grid, where, path)
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SpecError(path, f"{where}.{key}", "expected a non-empty list of values")
        if repeats(values):
            raise SpecError(
                path, f"{where}.{key}", f"repeated values in {values}: each would run the same cell again"
            )
        if key == "n_iters":  # a pair's trial length is the horizon of ASHA and of the cost estimate
            raise SpecError(
                path,
                f"{where}.n_iters",
                "a trial's length is not a grid key: set it in budget (or fixed, per_model.<model>.fixed), "
                "and early_budget for a column at an earlier length",
            )
    seeds = raw.get("seeds", [0] if recorded and grid else [])
    if "seeds" in raw:
        _seed_list(path, "seeds", seeds)
    return grid, seeds


def _seed_list(path, key: str, seeds) -> None:
    """A list of distinct seeds, each one a trial's `seed` accepts."""
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise SpecError(path, key, f"expected a non-empty list of distinct integers, got {seeds!r}")
    for seed in seeds:
        try:
            check_range("seed", seed)
        except ConfigError as e:
            raise SpecError(path, key, str(e)) from None


def is_ablation(grid: dict, seeds: list, space: dict, per_model: dict, path, needs_seeds: bool) -> bool:
    """Whether the file is an ablation (it names a grid or seeds); SpecError where it has a search
    space too, or (`needs_seeds`) no seeds: a grid without them would run one seed, a file with
    neither seeds nor a space a search of identical trials."""
    own = lambda part: any((per_model.get(m) or {}).get(part) for m in per_model)
    searched, gridded = bool(space or own("space")), bool(grid or own("grid"))
    if (grid or seeds) and searched:
        raise SpecError(
            path,
            "grid",
            "an ablation (grid/seeds) runs every combination; it cannot also have a search space",
        )
    if needs_seeds and not seeds and (gridded or not searched):
        raise SpecError(
            path,
            "seeds",
            "missing: an ablation trains each grid cell once per seed: name them, e.g. seeds: [0, 1, 2]"
            if gridded
            else "missing, and no space to search: every trial of a pair would be the same; "
            "an ablation names its seeds (e.g. seeds: [0, 1, 2]), a search its space",
        )
    return bool(seeds)


def parse_report(raw, grid: dict, path) -> Report:
    report = _section(Report, raw, "report", path)
    if not 0 < report.alpha < 1:
        raise SpecError(path, "report.alpha", f"must be in (0, 1), got {report.alpha!r}")
    _positive(path, "report.min_effect", report.min_effect, allow_zero=True)
    if report.test not in ("welch", "mannwhitney"):
        hint = closest(str(report.test), ["welch", "mannwhitney"])
        raise SpecError(path, "report.test", f"unknown test {report.test!r}{hint}; valid: welch, mannwhitney")
    if not re.fullmatch(r"test(_L|_x\d+|_depth\d+)?", str(report.headline)):
        raise SpecError(
            path,
            "report.headline",
            f"{report.headline!r} is not a test split: test, test_L, test_x<k> or test_depth<d>",
        )
    for key, value in report.baseline.items():
        if key not in grid:
            raise SpecError(
                path,
                f"report.baseline.{key}",
                f"not a grid key{closest(str(key), grid)}; the baseline names a grid cell",
            )
        if value not in grid[key]:
            raise SpecError(
                path, f"report.baseline.{key}", f"{value!r} is not one of the grid's values {grid[key]}"
            )
    return report


def check_detectable(path, report: Report, pairs: list[Pair], seeds: list) -> None:
    """Mann-Whitney's smallest one-sided p with n seeds a side is 1 / C(2n, n) (every seed of one
    side below every seed of the other): Holm over the file's cells multiplies it by their count,
    and where that reaches alpha no drop, however large, could ever be flagged."""
    if report.test != "mannwhitney" or len(seeds) < 2:
        return
    cells = sum(math.prod(len(values) for values in pair.grid.values()) for pair in pairs)
    smallest = 1 / math.comb(2 * len(seeds), len(seeds))
    if cells * smallest >= report.alpha:
        raise SpecError(
            path,
            "report.test",
            f"mannwhitney with {len(seeds)} seeds a side can flag no regression among {cells} "
            f"cell(s) at alpha {report.alpha:g}: its smallest p, "
            f"1/{math.comb(2 * len(seeds), len(seeds))}, "
            f"Holm-corrected over them is {min(1.0, cells * smallest):.3g}; "
            "use welch, more seeds or fewer cells",
        )


def parse_confirm(raw, budget: Budget, ablation: bool, path) -> Confirm:
    confirm = _section(Confirm, raw, "confirm", path)
    if (
        not isinstance(confirm.top_k, int)
        or isinstance(confirm.top_k, bool)
        or not 0 <= confirm.top_k <= budget.trials
    ):
        raise SpecError(
            path,
            "confirm.top_k",
            f"must be an integer from 0 to budget.trials ({budget.trials}), got {confirm.top_k!r}",
        )
    if confirm.top_k and ablation:
        raise SpecError(
            path,
            "confirm",
            "an ablation runs every seed of every cell already; confirm re-runs a search's best trials",
        )
    _seed_list(path, "confirm.seeds", confirm.seeds)
    return confirm


def parse_batch_seeds(raw: dict, path) -> bool | str:
    batch_seeds = raw.get("batch_seeds", "auto")
    if not isinstance(batch_seeds, bool) and batch_seeds != "auto":
        raise SpecError(path, "batch_seeds", f"must be true, false or auto, got {batch_seeds!r}")
    return batch_seeds


def parse_storage_path(raw: dict, path) -> str:
    storage_path = raw.get("storage_path", "runs")
    if not isinstance(storage_path, str) or "://" in storage_path:
        raise SpecError(
            path,
            "storage_path",
            f"must be a local folder for launch records, got {storage_path!r}; "
            "put trial checkpoints on shared or object storage with the `storage` key",
        )
    return storage_path


def parse_storage(raw, storage_path: str, path) -> TrialStorage:
    """`storage: <folder or s3://bucket/prefix>` or `storage: {uri: ..., endpoint: http://host:port}`;
    by default the launch folders' own `storage_path` (right for one machine only)."""
    if raw is None:
        return TrialStorage(storage_path)
    if isinstance(raw, str):
        raw = {"uri": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("uri"), str):
        raise SpecError(path, "storage", f"expected a folder, an s3:// URI or {{uri, endpoint}}, got {raw!r}")
    for key in raw:
        if key not in ("uri", "endpoint"):
            raise SpecError(
                path,
                f"storage.{key}",
                f"unknown key{closest(str(key), ['uri', 'endpoint'])}; valid: endpoint, uri",
            )
    storage = TrialStorage(raw["uri"], raw.get("endpoint"))
    try:
        storage.validate()
    except ValueError as e:
        raise SpecError(path, "storage", str(e)) from None
    return storage


def text_value(raw: dict, key: str, default: str, path) -> str:
    value = raw.get(key, default)
    if not isinstance(value, (str, int)) or isinstance(value, bool):  # a year is a name
        raise SpecError(path, key, f"expected a name, got {value!r}")
    return str(value)


def switch(raw: dict, key: str, default: bool, path) -> bool:
    value = raw.get(key, default)
    if value is not None and not isinstance(value, bool):  # an empty value (null) has always meant false
        raise SpecError(path, key, f"expected true or false, got {value!r}")
    return bool(value)


def unused_keys(raw: dict, ablation: bool) -> list[str]:
    """Keys of a search the file gives where it is an ablation, for the plan. Said, not refused: a
    search turned into an ablation by adding a grid keeps its file's other keys."""
    search_only = {
        "budget.trials": "a search's count of trials; an ablation trains every grid cell with every seed",
        "scheduler": "a search's early stopping; an ablation trains every trial to its end",
    }
    given = {
        *(f"budget.{key}" for key in raw.get("budget") or {}),
        *(["scheduler"] if "scheduler" in raw else []),
    }
    return [f"{key}: {why}" for key, why in search_only.items() if key in given and ablation]
