"""Search-space files (search_spaces/*.yaml) -> a validated Study.

Everything that can be wrong with a file is found here, before Ray starts or MLflow is written:
each error is one line naming the file, the key and the reason.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainables.config import (
    PROTOCOL_KEYS,
    TRAIN_KEYS,
    ConfigError,
    check_builds,
    check_range,
    closest,
    defaults,
    parse_trial_config,
    preset,
    presets,
    protocol_keys,
)
from trainables.models import MODELS, ModelError, model_fields, model_spec
from trainables.models import canonical as canonical_model
from trainables.models import label as model_label
from trainables.scores import LOWER_IS_BETTER, SCORES
from trainables.tasks import TASKS, task_config

from .storage import TrialStorage


class SpecError(ValueError):
    def __init__(self, path, key: str, reason: str):
        super().__init__(f"{path}: {key}: {reason}")
        self.path, self.key, self.reason = path, key, reason


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML where a key given twice in one mapping is an error, not "the last one wins"."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (list, dict, set)):
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a name or a number, not a list or mapping", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str):
    """A file's YAML (UniqueKeyLoader), with what PyYAML lets through as other errors (nesting too
    deep for the recursion limit, an integer too long to convert) raised as YAML errors too."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except (RecursionError, ValueError) as e:
        raise yaml.YAMLError(
            "nested too deep" if isinstance(e, RecursionError) else str(e).splitlines()[0]
        ) from None


# Names that end up in MLflow filter strings, run names, Optuna study names and folder names.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def name_problem(text: str) -> str | None:
    if SAFE_NAME.fullmatch(text) and ".." not in text:
        return None
    return (
        f"{text!r} must be 1-100 letters, digits, '_', '-' or '.' (not '..'), starting with a letter or digit"
    )


def yaml_number(value: float) -> str:
    """`value` as YAML 1.1 reads a float (a dot in the mantissa, a signed exponent): 1.25e-04, not 125e-6."""
    mantissa, exponent = f"{value:e}".split("e")
    mantissa = mantissa.rstrip("0")
    return f"{mantissa}0e{exponent}" if mantissa.endswith(".") else f"{mantissa}e{exponent}"


def safe_name(value, path, key: str) -> str:
    """`value` if it can go into a filter string or a path unquoted; else SpecError."""
    problem = name_problem(str(value))
    if problem:
        raise SpecError(path, key, problem)
    return str(value)


@dataclass(frozen=True)
class Distribution:
    """One searched parameter: loguniform/uniform [low, high], int [low, high] (inclusive), or choice."""

    kind: str
    values: tuple

    KINDS = ("loguniform", "uniform", "int", "choice")

    @classmethod
    def parse(cls, raw, where: str, path) -> Distribution:
        if not isinstance(raw, dict) or len(raw) != 1:
            raise SpecError(path, where, f"expected one of {{{', '.join(cls.KINDS)}: ...}}, got {raw!r}")
        ((kind, values),) = raw.items()
        if kind not in cls.KINDS:
            raise SpecError(path, where, f"unknown distribution {kind!r}{closest(str(kind), cls.KINDS)}")
        if not isinstance(values, list) or not values:
            raise SpecError(path, f"{where}.{kind}", "expected a non-empty list")
        if kind == "choice":
            if repeats(values):
                raise SpecError(path, f"{where}.choice", f"repeated values in {values}")
            return cls(kind, tuple(values))
        if len(values) != 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
        ):
            texts = [
                v for v in values if isinstance(v, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", v)
            ]
            hint = f" (YAML reads {texts[0]} as text: write {yaml_number(float(texts[0]))})" if texts else ""
            raise SpecError(
                path, f"{where}.{kind}", f"expected [low, high] finite numbers, got {values}{hint}"
            )
        low, high = values
        if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
            raise SpecError(path, f"{where}.int", f"bounds must be integers, got {values}")
        if not low < high:
            raise SpecError(
                path, f"{where}.{kind}", f"empty or inverted range [{low}, {high}]: low must be below high"
            )
        if kind == "loguniform" and low <= 0:
            raise SpecError(path, f"{where}.loguniform", f"low must be positive for a log scale, got {low}")
        return cls(kind, (low, high))

    def to_optuna(self):
        import optuna.distributions as d  # noqa: PLC0415 - a second of imports, paid by a search alone

        if self.kind == "choice":
            return d.CategoricalDistribution(list(self.values))
        if self.kind == "int":
            return d.IntDistribution(int(self.values[0]), int(self.values[1]))
        return d.FloatDistribution(
            float(self.values[0]), float(self.values[1]), log=self.kind == "loguniform"
        )

    def nearest(self, value):
        """The value itself if the distribution can produce it, else the closest value it can."""
        if self.kind == "choice":
            if value in self.values:
                return value
            numeric = [v for v in self.values if isinstance(v, (int, float))]
            if isinstance(value, (int, float)) and numeric:
                return min(numeric, key=lambda v: abs(v - value))
            return self.values[0]
        low, high = self.values
        if not isinstance(value, (int, float)) or isinstance(
            value, bool
        ):  # a paper setting of null (threads, grad_clip)
            value = low
        clipped = min(max(value, low), high)
        return int(round(clipped)) if self.kind == "int" else float(clipped)


@dataclass(frozen=True)
class TaskEntry:
    task: str
    variant: str
    options: dict


@dataclass(frozen=True)
class Resources:
    cpu: float = 1.0
    gpu: float = 0.0  # a fraction lets several small trials share one GPU; used only where GPUs exist
    custom: dict = field(default_factory=dict)  # e.g. {trial_slot: 1} to spread trials over nodes

    def asks(self, use_gpu: bool) -> dict[str, float]:
        """What one trial asks Ray for, by Ray's resource names (nothing of zero; no GPU where trials
        get none)."""
        return {
            "CPU": self.cpu,
            **({"GPU": self.gpu} if use_gpu and self.gpu else {}),
            **{k: v for k, v in self.custom.items() if v},
        }


@dataclass(frozen=True)
class Pair:
    """One model on one task variant: its own Tune run, Optuna study and ASHA bracket."""

    task: TaskEntry
    model: str
    space: dict[str, Distribution]
    base: dict  # the flat trial config without the searched keys
    warm_start: dict | None  # the paper's setting (Tables 7-9), moved into the space where needed
    grid: dict[str, list] = field(default_factory=dict)  # ablations: the grid keys this model has
    resources: Resources = field(default_factory=Resources)  # a trial's: the file's, or per_model's
    device_key: str = (
        "fixed.device"  # where the file names the trials' device: per_model's fixed, or the file's
    )
    own_values: dict = field(
        default_factory=dict
    )  # per_pair's fixed values the pair trains (not those its space or grid vary)
    # The protocol keys (trainables.config.PROTOCOL_KEYS) the file neither sets nor varies, with their
    # values: those the paper's preset gives the pair, and those at the training defaults, the same
    # for every model (all of them where the model has no preset: a model of one's own).
    from_preset: dict = field(default_factory=dict)
    from_defaults: dict = field(default_factory=dict)

    @property
    def cuda_device(self) -> tuple[str, str] | None:
        """(the file's key, the value) where it names CUDA as a trial's device (fixed, or a value of
        the grid or the space); auto takes a GPU only where there is one."""
        space = self.space.get("device")
        named = [
            (self.device_key, self.base.get("device", "auto")),
            *(("grid.device", d) for d in self.grid.get("device", [])),
            *(("space.device", d) for d in (space.values if space and space.kind == "choice" else [])),
        ]
        return next(((key, str(d)) for key, d in named if str(d).startswith("cuda")), None)

    @property
    def needs_gpu(self) -> bool:
        return self.cuda_device is not None

    @property
    def name(self) -> str:
        return f"{self.task.variant}__{model_label(self.model)}"

    @property
    def chosen(self) -> frozenset[str]:
        """Keys whose values a search picks (its space) or picked (per_pair's tuned values): a row
        of them is the model at its best, which the papers' headline tables report."""
        return frozenset(self.space) | frozenset(self.own_values)

    def chance(self, score: str) -> str:
        """What guessing scores on the pair's task, by `score`, in words."""
        return TASKS[self.task.task].probe(task_config(self.task.task, self.task.options)).chance(score)


@dataclass(frozen=True)
class Budget:
    trials: int = 8  # per model/task pair
    max_concurrent: int = 2
    n_iters: int | None = None  # per trial; None keeps the paper's (preset) value
    eval_every: int | None = None
    cluster_concurrent: int | None = None  # trials of all pairs at once; None: as many as the cluster holds
    max_failures: int = 3  # times a trial restarts from its last checkpoint after its node or process died
    # The most members one stacked trial trains (batch_seeds): a search's TPE suggestions, an
    # ablation's or a confirmation's seeds and cells. auto: where trials get a GPU, the size past
    # which a measured throughput curve stops rising (launch.measure_stack_sizes); on CPUs a
    # search stacks nothing and an ablation stacks whole cell groups.
    stack_size: int | str = "auto"


@dataclass(frozen=True)
class Scheduler:
    name: str = "asha"  # or "fifo" (no early stopping)
    grace_period: int = 5000  # iterations before ASHA may stop a trial
    reduction_factor: int = 3


@dataclass(frozen=True)
class Tracking:
    uri: str = "sqlite:///runs/mlflow.db"
    experiment: str | None = None  # default: the file's name


@dataclass(frozen=True)
class Confirm:
    """A search's confirmation: its `top_k` best trials per pair trained again with each of `seeds`;
    the pair's answer is the best candidate's mean over those seeds, not one lucky seed."""

    top_k: int = 0  # 0: no confirmation
    seeds: list = field(default_factory=lambda: [1, 2, 3])


@dataclass(frozen=True)
class Report:
    """How reports and the nightly check read the seeds of a cell (stats.py)."""

    # A seed "solves" a cell at or past this score (e.g. 0.95); None: no solved rate.
    solved_at: float | None = None
    baseline: dict = field(default_factory=dict)  # grid values of the cell every other cell is tested against
    # Nightly: a regression's level, Holm-corrected over the file's cells (a nightly of k files: alpha / k
    # each).
    alpha: float = 0.05
    min_effect: float = 0.01  # nightly: and the mean must have moved at least this much
    # Or "mannwhitney" (refused where its smallest p, Holm-corrected, cannot get below alpha).
    test: str = "welch"
    # The test split a launch's closing line leads with, e.g. test_x2 (PANM's 2(L+1)).
    headline: str = "test"


@dataclass(frozen=True)
class Study:
    """A validated file, as a value: where a value must differ (a night's seeds, a --storage flag),
    the one place that decides it makes a new one (dataclasses.replace). How its runs stack and
    what a cluster holds of them are run.stacking's."""

    path: Path
    name: str
    metric: str
    mode: str
    score: str  # what the metric measures, shared by all the file's tasks: see trainables.kinds
    seed: int
    pairs: list[Pair]
    skipped: list[str]  # incompatible pairs, with the reason
    budget: Budget
    scheduler: Scheduler
    resources: Resources
    tracking: Tracking
    warm_start: bool
    storage_path: str  # where launch folders live, on the driver
    storage: TrialStorage  # where Tune's experiment state and the trial checkpoints live
    grid: dict[str, list] = field(default_factory=dict)  # an ablation: every combination...
    seeds: list[int] = field(default_factory=list)  # ...times every seed, no search
    report: Report = field(default_factory=Report)
    confirm: Confirm = field(default_factory=Confirm)
    # An ablation cell's seeds, or a confirmed candidate's, trained together as one stacked model
    # in one trial where the model allows (trainables.batched), with every other cell that differs
    # from it only in values a stack's members may have of their own (learning rate, weight decay,
    # gradient clipping: trainables.config.MEMBER_KEYS); false: one trial per seed. "auto"
    # batches where trials get a GPU: on CPUs a stacked model of N seeds steps slower than N runs
    # in turn (docs/performance.md#cpu-stacked-seeds-against-separate-runs), and separate trials use
    # more cores. The file's value: a launch decides auto once (run.stacking.decide) and keeps the
    # answer in launch.json, so a resume repeats the same trials.
    batch_seeds: bool | str = "auto"
    unused: list[str] = field(
        default_factory=list
    )  # keys the file gives that this kind of study does not use, for the plan

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or self.name

    @property
    def is_ablation(self) -> bool:
        return bool(self.grid or self.seeds)

    @property
    def headline(self) -> str:
        """The one test score the console, the answer, `status` and the report lead with: the
        file's report.headline split at the best checkpoint, e.g. test_x2_token_acc_at_best."""
        return f"{self.report.headline}_{self.score}_at_best"

    @property
    def uses_asha(self) -> bool:
        """Whether ASHA may stop trials early: a search with scheduler asha (an ablation trains every
        trial to its end)."""
        return self.scheduler.name == "asha" and not self.is_ablation

    def confirm_count(self) -> int:
        """Each pair's confirmation trials: its top_k candidates times the confirmation seeds."""
        return self.confirm.top_k * len(self.confirm.seeds)

    def trial_count(self, pair: Pair) -> int:
        """The pair's trials: its grid cells times the seeds for an ablation, else the search budget."""
        if not self.is_ablation:
            return self.budget.trials
        return math.prod(len(values) for values in pair.grid.values()) * len(self.seeds)

    def unlike_training(self, variant: str) -> dict[str, tuple[dict, dict]]:
        """The protocol keys that some of the task variant's models take from their papers' presets
        and others from the training defaults, at another value (a model of one's own beside the
        papers' baselines): key -> ({model: its paper's value}, {model: the default})."""
        pairs = [p for p in self.pairs if p.task.variant == variant]
        out = {}
        for key in PROTOCOL_KEYS:
            papers = {p.model: p.from_preset[key] for p in pairs if key in p.from_preset}
            fallen = {p.model: p.from_defaults[key] for p in pairs if key in p.from_defaults}
            if any(value != paper for value in fallen.values() for paper in papers.values()):
                out[key] = (papers, fallen)
        return out

    def grid_cells(self, pair: Pair) -> list[dict]:
        """Every combination of an ablation pair's grid values, in order."""
        keys = list(pair.grid)
        return [dict(zip(keys, values)) for values in itertools.product(*(pair.grid[k] for k in keys))]


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


def _parse_resources(raw, default: Resources, key: str, path) -> Resources:
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
        and math.isfinite(value)
        and (value >= 0 if allow_zero else value > 0)
    )
    if not ok:
        raise SpecError(
            path,
            key,
            f"must be a finite {'non-negative' if allow_zero else 'positive'} number, got {value!r}",
        )


def read_spec(path: str | Path) -> str:
    """A spec file's text; SpecError where it is missing, a folder, unreadable or not UTF-8."""
    path = Path(path)
    if not path.exists():
        raise SpecError(path, "file", "no such file")
    try:
        return path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise SpecError(path, "file", "a folder, not a file") from None
    except UnicodeDecodeError as e:
        raise SpecError(path, "file", f"not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise SpecError(path, "file", e.strerror or str(e)) from None


def read_yaml(path: str | Path, text: str | None = None):
    """A YAML file's data (of `text`, read as that file), or a SpecError naming the file, the line and
    the parser's reason."""
    try:
        return parse_yaml(read_spec(Path(path)) if text is None else text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "file"
        raise SpecError(path, where, f"malformed YAML: {getattr(e, 'problem', None) or e}") from None


def load_study(path: str | Path, text: str | None = None, recorded: bool = False) -> Study:
    """The Study of a file (or of `text`, read as that file): each section parsed on its own, in the
    order that decides which of a file's errors is its first, then the pairs they make. `recorded`:
    the text a launch ran, read again as it ran (a file refused now as meaningless, a listed model
    that cannot run a task, a grid without seeds, once ran: its launch stays readable)."""
    path = Path(path)
    raw = _parse_top(read_yaml(path, text), path)
    metric, seed = _parse_metric(raw, path), _parse_seed(raw, path)
    budget = parse_budget(raw.get("budget"), path)
    scheduler = _parse_scheduler(raw.get("scheduler"), path)
    resources = _parse_resources(raw.get("resources"), Resources(), "resources", path)
    tracking = _parse_tracking(raw.get("tracking"), path)
    tasks = _parse_tasks(raw.get("tasks"), path)
    score = _metric_score(metric, tasks, path)
    mode = _parse_mode(raw, metric, score, path)
    models = _parse_models(raw.get("models"), path)
    incompatible = _incompatible(tasks, models, raw.get("models") != "all" and not recorded, path)
    space = _parse_space(raw.get("space") or {}, "space", path)
    _refuse_set_elsewhere(space, "space", path)
    per_model = _parse_per_model(raw.get("per_model"), path)
    fixed = _parse_fixed(raw.get("fixed"), path)
    per_pair = _parse_per_pair(raw.get("per_pair"), tasks, models, path)
    grid, seeds = _parse_grid(raw, path, recorded=recorded)
    ablation = _is_ablation(grid, seeds, space, per_model, path, needs_seeds=not recorded)
    report = _parse_report(raw.get("report"), grid, path)
    confirm = _parse_confirm(raw.get("confirm"), budget, ablation, path)
    batch_seeds = _parse_batch_seeds(raw, path)
    storage_path = _parse_storage_path(raw, path)
    shared = _Shared(space, fixed, grid, resources, budget, seed)
    pairs = _parse_pairs(tasks, models, per_model, per_pair, shared, incompatible, path)
    _check_named_keys(models, per_model, space, fixed, grid, path)
    skipped = _skipped(incompatible, pairs, path)
    _check_detectable(path, report, pairs, seeds)
    name = safe_name(_text(raw, "name", path.stem, path), path, "name")
    return Study(
        path=path,
        name=name,
        metric=metric,
        mode=mode,
        score=score,
        seed=seed,
        pairs=pairs,
        skipped=skipped,
        budget=budget,
        scheduler=scheduler,
        resources=resources,
        tracking=tracking,
        warm_start=_switch(raw, "warm_start", True, path),
        storage_path=storage_path,
        storage=_parse_storage(raw.get("storage"), storage_path, path),
        grid=grid,
        seeds=seeds,
        report=report,
        confirm=confirm,
        batch_seeds=batch_seeds,
        unused=_unused(raw, ablation),
    )


def _skipped(incompatible: dict, pairs: list, path) -> list[str]:
    """The pairs left out as incompatible, in words; SpecError where no pair is left."""
    skipped = [f"{variant} x {model}: {reason}" for (variant, model), reason in incompatible.items()]
    if not pairs:
        raise SpecError(
            path, "models", f"no model in this file can run any of its tasks: {'; '.join(skipped)}"
        )
    return skipped


def _is_ablation(grid: dict, seeds: list, space: dict, per_model: dict, path, needs_seeds: bool) -> bool:
    """Whether the file is an ablation (it names a grid or seeds); SpecError where it has a search
    space too, or (`needs_seeds`) no seeds: a grid without them would run one seed, a file with
    neither seeds nor a space a search of identical trials."""
    own = lambda part: any((per_model.get(m) or {}).get(part) for m in per_model)  # noqa: E731
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


def _parse_top(raw, path) -> dict:
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


def _parse_metric(raw: dict, path) -> str:
    metric = raw.get("metric", "best_ood_valid_acc")
    if metric not in METRICS:
        raise SpecError(
            path,
            "metric",
            f"unknown metric {metric!r}{closest(str(metric), METRICS)}; valid: {', '.join(METRICS)}",
        )
    return metric


def _parse_seed(raw: dict, path) -> int:
    seed = raw.get("seed", 0)
    if not isinstance(seed, int):
        raise SpecError(path, "seed", f"must be an integer, got {seed!r}")
    return seed


def _parse_mode(raw: dict, metric: str, score: str, path) -> str:
    """The file's mode, which must be the one its metric's score is ranked by."""
    expected = "min" if score in LOWER_IS_BETTER else "max"
    mode = raw.get("mode", expected)
    if mode != expected:
        raise SpecError(path, "mode", f"{metric} measures {score}, so mode must be {expected}, got {mode!r}")
    return mode


def _parse_scheduler(raw, path) -> Scheduler:
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


def _parse_tracking(raw, path) -> Tracking:
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


PER_MODEL_KEYS = ("fixed", "grid", "resources", "space")


def _parse_per_model(raw, path) -> dict:
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
                _refuse_set_elsewhere(value or {}, f"per_model.{model}.{k}", path)
    return per_model


def _parse_fixed(raw, path) -> dict:
    fixed = raw or {}
    if not isinstance(fixed, dict):
        raise SpecError(path, "fixed", "expected a mapping of trial config keys")
    _refuse_set_elsewhere(fixed, "fixed", path)
    return fixed


def _parse_report(raw, grid: dict, path) -> Report:
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


def _parse_confirm(raw, budget: Budget, ablation: bool, path) -> Confirm:
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


def _parse_batch_seeds(raw: dict, path) -> bool | str:
    batch_seeds = raw.get("batch_seeds", "auto")
    if not isinstance(batch_seeds, bool) and batch_seeds != "auto":
        raise SpecError(path, "batch_seeds", f"must be true, false or auto, got {batch_seeds!r}")
    return batch_seeds


def _parse_storage_path(raw: dict, path) -> str:
    storage_path = raw.get("storage_path", "runs")
    if not isinstance(storage_path, str) or "://" in storage_path:
        raise SpecError(
            path,
            "storage_path",
            f"must be a local folder for launch records, got {storage_path!r}; "
            "put trial checkpoints on shared or object storage with the `storage` key",
        )
    return storage_path


def _check_named_keys(models: list[str], per_model: dict, space: dict, fixed: dict, grid: dict, path) -> None:
    """Each per_model entry names one of the file's models, and each key of the file's space, fixed
    and grid a parameter of one of them."""
    for model in per_model:
        if model not in models:
            raise SpecError(
                path, f"per_model.{model}", f"model is not in this file's models{closest(str(model), models)}"
            )
    valid = TRAIN_KEYS.union(*(model_fields(m) for m in models))
    for section, keys in (("space", space), ("fixed", fixed), ("grid", grid)):
        for key in keys:
            if key not in valid:
                raise SpecError(
                    path,
                    f"{section}.{key}",
                    f"no model in this file has this parameter{closest(str(key), valid)}",
                )


def _unused(raw: dict, ablation: bool) -> list[str]:
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


def _text(raw: dict, key: str, default: str, path) -> str:
    value = raw.get(key, default)
    if not isinstance(value, (str, int)) or isinstance(value, bool):  # a year is a name
        raise SpecError(path, key, f"expected a name, got {value!r}")
    return str(value)


def _switch(raw: dict, key: str, default: bool, path) -> bool:
    value = raw.get(key, default)
    if value is not None and not isinstance(value, bool):  # an empty value (null) has always meant false
        raise SpecError(path, key, f"expected true or false, got {value!r}")
    return bool(value)


def _parse_storage(raw, storage_path: str, path) -> TrialStorage:
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


def _metric_score(metric: str, tasks: list[TaskEntry], path) -> str:
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


def repeats(values: list) -> bool:
    """Whether a list of a file's values holds one value twice: 1 and 1.0 alike (a trial takes them
    as one), true and 1 not; values that do not hash (task_options) by their text."""

    def key(v):
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else repr(v)

    return len(set(map(key, values))) != len(values)


def _parse_grid(
    raw: dict, path, where: str = "grid", recorded: bool = False
) -> tuple[dict[str, list], list[int]]:
    """The grid and seeds; a `recorded` launch's grid without seeds ran seed 0 (when that was allowed)."""
    grid = raw.get("grid") or {}
    if not isinstance(grid, dict):
        raise SpecError(path, where, "expected a mapping of parameter -> list of values")
    _refuse_set_elsewhere(grid, where, path)
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


def _parse_tasks(raw, path) -> list[TaskEntry]:
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
        if not isinstance(name, str) or name not in TASKS:
            raise SpecError(
                path,
                f"{where}.task",
                f"unknown task {name!r}{closest(str(name), TASKS)}; known: {', '.join(TASKS)}",
            )
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


def _check_model(name, path, key: str) -> None:
    """A model the registry finds: one of the package's, a model file's class or an entry point
    (trainables.models.model_spec), stated rightly."""
    if isinstance(name, str) and name in MODELS:
        return
    try:
        if not isinstance(name, str):
            raise ModelError("")
        model_spec(name)
    except ModelError as e:
        if isinstance(name, str) and ":" in name:
            raise SpecError(path, key, str(e)) from None
        raise SpecError(
            path,
            key,
            f"unknown model {name!r}{closest(str(name), MODELS)}; known: {', '.join(MODELS)}, "
            "or a model of your own as path/to/file.py:Class",
        ) from None


def _parse_models(raw, path) -> list[str]:
    if raw == "all":
        return list(MODELS)
    if not raw or not isinstance(raw, list):
        raise SpecError(path, "models", "expected a list of model names or 'all'")
    for k, name in enumerate(raw):
        _check_model(name, path, f"models[{k}]")
        if name in raw[:k] or model_label(name) in map(model_label, raw[:k]):
            raise SpecError(
                path, f"models[{k}]", f"{name} appears twice: its pairs would share one name, study and runs"
            )
    return list(raw)


def _parse_space(raw, where: str, path) -> dict[str, Distribution]:
    if not isinstance(raw, dict):
        raise SpecError(path, where, "expected a mapping of parameter -> distribution")
    if "n_iters" in raw:  # a pair's trial length is the horizon of ASHA and of the cost estimate
        raise SpecError(
            path,
            f"{where}.n_iters",
            "a trial's length is not searched: set it in budget (or fixed, per_model.<model>.fixed)",
        )
    return {str(k): Distribution.parse(v, f"{where}.{k}", path) for k, v in raw.items()}


# Trial keys a file sets with keys of its own: in fixed, a space or a grid they would change what a
# pair trains (`fixed: {task: reverse}` trained every copy pair on reverse) or be overwritten
# (`fixed: {seed: abc}` was ignored).
SET_ELSEWHERE = {
    "task": "the file's tasks set it (a task entry's options for its settings)",
    "model": "the file's models set it (per_model.<model> for a model's own values)",
    "seed": "the file's seed (a search's trials) and seeds (an ablation's) set it",
}


def _refuse_set_elsewhere(keys, where: str, path) -> None:
    for key in keys:
        if key in SET_ELSEWHERE:
            raise SpecError(path, f"{where}.{key}", SET_ELSEWHERE[key])


WHOLE_INT_RANGE = (
    64  # an int range this short is built at every value: 3 heads of d_model 128 sit inside [1, 8]
)


def _probe_values(d: Distribution) -> list:
    """The values of a searched key a build check tries, low end first: every value of a choice or
    of a short int range, else both ends and, for a float range, a fraction TPE may draw (2.5 of
    uniform [1, 4], which a whole-number key such as batch_size refuses)."""
    if d.kind == "choice":
        return list(d.values)
    low, high = d.values
    if d.kind == "int":
        return list(range(int(low), int(high) + 1)) if high - low < WHOLE_INT_RANGE else [int(low), int(high)]
    return [float(low), low + 0.5 if high - low > 1 else (low + high) / 2, float(high)]


def _check_detectable(path, report: Report, pairs: list[Pair], seeds: list) -> None:
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


def _check_builds(path, pair: Pair) -> None:
    """Build what a trial would build (its config, its task's config, its model, on the meta device:
    no data, no weights) in every grid cell, each with the space at its first values, and at every
    value _probe_values tries, one key at a time, in the first cell: so that a cell or a value a
    trial would reject is rejected before launch (a grid's keys combine: d_model 12 builds, 8 heads
    build, the two together do not). The line names the grid and space values the reason names."""
    tried = {k: _probe_values(d) for k, d in pair.space.items()}
    first_values = {k: values[0] for k, values in tried.items()}
    cells = [dict(zip(pair.grid, values)) for values in itertools.product(*pair.grid.values())]
    # (what the probe varies, where a reason that names no key points: the cell, the space's value, or
    # fixed first)
    probes = [
        (cell, first_values, "fixed" if k == 0 else ", ".join(f"grid.{key}={v!r}" for key, v in cell.items()))
        for k, cell in enumerate(cells)
    ]
    probes += [
        (cells[0], {**first_values, key: v}, f"space.{key}={v!r}")
        for key, values in tried.items()
        for v in values[1:]
    ]
    for cell, searched, where in probes:
        try:
            check_builds(parse_trial_config({**pair.base, **searched, **cell}))
        except ConfigError as e:
            # the grid and space values the reason names (a bad low end of a range, a bad first cell),
            # else `where`
            named = [f"grid.{k}={v!r}" for k, v in cell.items()] + [
                f"space.{k}={v!r}" for k, v in searched.items()
            ]
            at_fault = [
                n for n in named if re.search(rf"\b{re.escape(n.split('.', 1)[1].split('=')[0])}\b", str(e))
            ]
            raise SpecError(path, f"{', '.join(at_fault) or where} ({pair.name})", str(e)) from None


def _parse_per_pair(raw, tasks: list[TaskEntry], models: list[str], path) -> dict[str, dict]:
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
        model = name.rsplit("__", 1)[1]
        _refuse_set_elsewhere(entry.get("fixed") or {}, f"per_pair.{name}.fixed", path)
        for key in entry.get("fixed") or {}:
            if key not in TRAIN_KEYS | model_fields(model):
                raise SpecError(
                    path,
                    f"per_pair.{name}.fixed.{key}",
                    f"not a parameter of {model}{closest(str(key), model_fields(model))}",
                )
        out[name] = dict(entry.get("fixed") or {})
    return out


@dataclass(frozen=True)
class _Shared:
    """The file's sections every pair starts from, which a model's per_model entry adds to."""

    space: dict[str, Distribution]
    fixed: dict
    grid: dict[str, list]
    resources: Resources
    budget: Budget
    seed: int


def _incompatible(tasks: list[TaskEntry], models: list[str], named: bool, path) -> dict[tuple[str, str], str]:
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


def _parse_pairs(
    tasks: list[TaskEntry],
    models: list[str],
    per_model: dict,
    per_pair: dict[str, dict],
    shared: _Shared,
    incompatible: dict,
    path,
) -> list[Pair]:
    """Each model on each task it runs (not those `incompatible` holds)."""
    pairs = []
    for model in models:
        overrides = per_model.get(model) or {}
        own_space = _parse_space(overrides.get("space") or {}, f"per_model.{model}.space", path)
        space = {**shared.space, **_model_keys(own_space, model, f"per_model.{model}.space", path)}
        for task in tasks:
            if (task.variant, model) in incompatible:
                continue
            own_fixed = per_pair.get(f"{task.variant}__{model}", {})
            pairs.append(_make_pair(task, model, space, overrides, own_fixed, shared, path))
    return pairs


def _model_keys(values: dict, model: str, where: str, path) -> dict:
    """`values` (a model's own space or grid), each key a parameter the model has: the file's may
    hold keys one of its models lacks, a model's own may not."""
    for key in values:
        if key not in TRAIN_KEYS | model_fields(model):
            hint = closest(key, model_fields(model))
            raise SpecError(path, f"{where}.{key}", f"not a parameter of {model}{hint}")
    return values


def _make_pair(
    task: TaskEntry, model: str, space: dict, overrides: dict, own_fixed: dict, shared: _Shared, path
) -> Pair:
    """One model on one task: its config and space (_pair_config) under its model's fixed values
    and then its own (per_pair), its model's resources and grid; built in every grid cell and at
    its space's extremes (_check_builds)."""
    model_fixed = overrides.get("fixed") or {}
    base, own_space, warm = _pair_config(
        task, model, space, shared.fixed, {**model_fixed, **own_fixed}, shared.budget, shared.seed, path
    )
    resources = _parse_resources(
        overrides.get("resources"), shared.resources, f"per_model.{model}.resources", path
    )
    # A grid key the model lacks (heads of an LSTM) does not apply to it; a model's own grid
    # (Table 6's head counts for multi-head attention only) adds to the file's.
    where = f"per_model.{model}.grid"
    own_grid = _model_keys(_parse_grid({"grid": overrides.get("grid")}, path, where)[0], model, where, path)
    grid = {k: v for k, v in {**shared.grid, **own_grid}.items() if k in TRAIN_KEYS | model_fields(model)}
    base = {k: v for k, v in base.items() if k not in grid}
    from_preset, from_defaults = _protocol_origins(
        task, model, base, {**shared.fixed, **model_fixed, **own_fixed}, {*own_space, *grid}, shared.budget
    )
    # The threads a trial runs on are in its config, recorded and re-run with it (best/<pair>.yaml):
    # on a CPU they change the sums' order, hence the numbers. The file's, else its CPU share.
    if base.get("threads") is None:
        base["threads"] = max(1, int(resources.cpu))
    device_key = f"per_model.{model}.fixed.device" if "device" in model_fixed else "fixed.device"
    pair = Pair(
        task=task,
        model=model,
        space=own_space,
        base=base,
        warm_start=warm,
        grid=grid,
        resources=resources,
        device_key=device_key,
        own_values={k: v for k, v in own_fixed.items() if k in base},
        from_preset=from_preset,
        from_defaults=from_defaults,
    )
    if pair.needs_gpu and pair.resources.gpu == 0:
        asked = f"per_model.{model}.resources" if "gpu" in (overrides.get("resources") or {}) else "resources"
        key, device = pair.cuda_device
        raise SpecError(
            path,
            key,
            f"{device} needs a GPU, and {asked}.gpu gives its trials none "
            "(Ray hides the GPUs from a trial that asks for none)",
        )
    _check_builds(path, pair)
    return pair


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
    task: TaskEntry, model: str, space, fixed: dict, model_fixed: dict, budget: Budget, seed: int, path
) -> tuple[dict, dict[str, Distribution], dict | None]:
    """(the pair's flat trial config without its searched keys, its space: the keys of `space` the
    model has, the paper's setting of them moved into the space, or None)."""
    valid = TRAIN_KEYS | model_fields(model)
    own_space = {k: v for k, v in space.items() if k in valid}  # e.g. an LSTM has no heads
    try:
        base = (
            preset(task.task, model, task.options)
            if model in presets(task.task)["models"]
            else {"task": task.task, "model": canonical_model(model)}
        )
    except ConfigError as e:
        raise SpecError(path, "models", str(e)) from None
    model_defaults = defaults(model)
    paper_setting = {k: base.get(k, model_defaults.get(k)) for k in own_space}
    base.update({k: v for k, v in fixed.items() if k in valid})
    base.update(model_fixed)
    if not isinstance(base.get("task_options", {}), dict):
        raise SpecError(
            path,
            f"fixed ({task.variant}__{model})",
            f"task_options: expected a mapping of task options, got {base['task_options']!r}",
        )
    base.update(task_options={**base.get("task_options", {}), **task.options}, seed=seed)
    if budget.n_iters:
        base["n_iters"] = budget.n_iters
    if budget.eval_every:
        base["eval_every"] = budget.eval_every
    try:  # every value of `fixed` passes a trial's checks, one the pair's space replaces too
        trial = parse_trial_config(base)
    except ConfigError as e:
        raise SpecError(path, f"fixed ({task.variant}__{model})", str(e)) from None
    # A pair without a paper setting (no preset) trains the trial's default length: ASHA's horizon,
    # the cost and the report need it said.
    base.setdefault("n_iters", trial.n_iters)
    for key in list(own_space):
        base.pop(key, None)
    warm = {k: own_space[k].nearest(v) for k, v in paper_setting.items()}
    # Wrong keys and values in `fixed` are found by _check_builds, which builds every trial's extremes.
    if (
        "d_model" in own_space
        and "n_heads" in own_space
        and own_space["d_model"].kind == own_space["n_heads"].kind == "choice"
    ):
        # Other values fail the build check.
        whole = lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0  # noqa: E731
        bad = [
            (d, h)
            for d in own_space["d_model"].values
            for h in own_space["n_heads"].values
            if whole(d) and whole(h) and d % h
        ]
        if bad:
            raise SpecError(path, "space.n_heads", f"{bad[0][1]} heads do not divide d_model {bad[0][0]}")
    return base, own_space, warm or None
