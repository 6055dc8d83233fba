"""A validated file as values: the Study, its Pairs (a model on a task) and its sections."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

from trainables.config import PROTOCOL_KEYS
from trainables.models import label as model_label
from trainables.tasks import TASKS, task_config

from .space import Distribution
from .storage import TrialStorage


class FrozenDict(dict):
    """A mapping that cannot change once made: a frozen value's. Still a dict, so JSON, templates,
    `{**x}` and `x == {...}` read it as one; it pickles (Ray sends the plan to its workers) as its
    items, made frozen again."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("a frozen value's mapping cannot change: change a copy (dict(x), {**x})")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):
        return (type(self), (dict(self),))


def frozen_grid(grid) -> FrozenDict:
    """A grid (key -> its values) that cannot change: its values as tuples."""
    return FrozenDict({key: tuple(values) for key, values in grid.items()})


def freeze(value, **converters) -> None:
    """Sets each of a frozen dataclass's fields named in `converters` to its converted value: a
    value given lists and dicts (by the parser, a test, dataclasses.replace) holds tuples and
    FrozenDicts."""
    for name, convert in converters.items():
        object.__setattr__(value, name, convert(getattr(value, name)))


@dataclass(frozen=True)
class TaskEntry:
    task: str
    variant: str
    options: FrozenDict

    def __post_init__(self):
        freeze(self, options=FrozenDict)


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
    space: FrozenDict[str, Distribution]
    base: FrozenDict  # the flat trial config without the searched keys
    warm_start: FrozenDict | None  # the paper's setting (Tables 7-9), moved into the space where needed
    # Ablations: the grid keys this model has.
    grid: FrozenDict[str, tuple] = field(default_factory=FrozenDict)
    resources: Resources = field(default_factory=Resources)  # a trial's: the file's, or per_model's
    device_key: str = (
        "fixed.device"  # where the file names the trials' device: per_model's fixed, or the file's
    )
    # per_pair's fixed values the pair trains (not those its space or grid vary).
    own_values: FrozenDict = field(default_factory=FrozenDict)
    # The protocol keys (trainables.config.PROTOCOL_KEYS) the file neither sets nor varies, with their
    # values: those the paper's preset gives the pair, and those at the training defaults, the same
    # for every model (all of them where the model has no preset: a model of one's own).
    from_preset: FrozenDict = field(default_factory=FrozenDict)
    from_defaults: FrozenDict = field(default_factory=FrozenDict)

    def __post_init__(self):
        freeze(
            self,
            space=FrozenDict,
            base=FrozenDict,
            warm_start=lambda warm: None if warm is None else FrozenDict(warm),
            grid=frozen_grid,
            own_values=FrozenDict,
            from_preset=FrozenDict,
            from_defaults=FrozenDict,
        )

    @property
    def cuda_device(self) -> tuple[str, str] | None:
        """(the file's key, the value) where it names CUDA as a trial's device (fixed, or a value of
        the grid or the space); auto takes a GPU only where there is one."""
        space = self.space.get("device")
        named = [
            (self.device_key, self.base.get("device", "auto")),
            *(("grid.device", d) for d in self.grid.get("device", [])),
            *(("space.device", d) for d in (space.choices if space else ())),
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
    # which a measured throughput curve stops rising (preflight.measure_stack_sizes); on CPUs a
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
    pairs: tuple[Pair, ...]
    skipped: tuple[str, ...]  # incompatible pairs, with the reason
    budget: Budget
    scheduler: Scheduler
    resources: Resources
    tracking: Tracking
    warm_start: bool
    storage_path: str  # where launch folders live, on the driver
    storage: TrialStorage  # where Tune's experiment state and the trial checkpoints live
    grid: FrozenDict[str, tuple] = field(default_factory=FrozenDict)  # an ablation: every combination...
    seeds: tuple[int, ...] = ()  # ...times every seed, no search
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
    # Keys the file gives that this kind of study does not use, for the plan.
    unused: tuple[str, ...] = ()

    def __post_init__(self):
        freeze(self, pairs=tuple, skipped=tuple, grid=frozen_grid, seeds=tuple, unused=tuple)

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
