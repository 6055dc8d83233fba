"""Stacking and cluster fit: which of a study's runs train together as one stacked trial
(trainables.batched trains them), how many members a stack holds, whether the cluster holds a
pair's trials and how many run at once.

A launch decides its stacking once (decide, then the stack sizes it measures) and keeps it in
launch.json (Stacking.record: batch_seeds, stack_sizes); a resume reads it back from there
(launched), so it repeats the same trials. The dry run and the plan printed before a launch ask
the same functions, before anything is measured.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from trainables.config import MEMBER_KEYS
from trainables.models import batchable

from ..plan.study import Pair, Study

# In a trial's config: the members it trains stacked (trainables.batched), each a seed and its own
# values of MEMBER_KEYS, instead of one "seed".
MEMBERS_KEY = "members"


def stack_cuts(members: int, size: int) -> list[int]:
    """The stacks `members` members train in, at most `size` each: full stacks, then the rest;
    where the rest would be one member alone, the last two stacks share it (4 + 1 becomes 3 + 2).
    A lone member trains as a plain trial, and on CUDA that is uncompiled and in TF32 where stacks
    train compiled in bf16 (TrainConfig.settled): one cell's seeds would differ in numerics."""
    full, rest = divmod(members, size)
    cuts = [size] * full + ([rest] if rest else [])
    if len(cuts) > 1 and cuts[-1] == 1 and size > 2:
        cuts[-2:] = [size - 1, 2]
    return cuts


def group_rate(curve: list[tuple[int, float]], members: int, size: int) -> float:
    """Member-steps/s of `members` members trained in stacks of at most `size` one after another
    (stack_cuts), each at its throughput read off the curve (between two measured sizes, on the
    line joining them)."""
    sizes, rates = zip(*sorted(curve))
    return members / sum(n / float(np.interp(n, sizes, rates)) for n in stack_cuts(members, size))


def knee(curve: list[tuple[int, float]], within: float = 0.9, members: int | None = None) -> int:
    """The smallest stack size whose throughput for a group of `members` (the curve's largest size
    unless given) is `within` of the best size's: a larger stack would cost memory and a longer
    wait per evaluation for little more. The group's throughput counts every stack it is cut
    into (group_rate), so five seeds do not split three and two where a stack of five trains them sooner."""
    members = members or max(n for n, _ in curve)
    rates = {n: group_rate(curve, members, n) for n, _ in curve if n <= members}
    best = max(rates.values())
    return min(n for n, rate in rates.items() if rate >= within * best)


@dataclass(frozen=True)
class Stacking:
    """How a study's runs stack. `batch_seeds`: the file's, auto decided where the launch knows
    whether trials get a GPU (the study keeps the file's own: auto stacks no pair whose own trials
    get no GPU); `stack_sizes`: budget.stack_size auto, as the launch measured it per pair."""

    study: Study
    batch_seeds: bool | str
    stack_sizes: dict[str, int] = field(default_factory=dict)

    def record(self) -> dict:
        """What launch.json keeps of it (LaunchState's fields; read back by `launched`)."""
        decided = self.batch_seeds if isinstance(self.batch_seeds, bool) else None
        return {"batch_seeds": decided, "stack_sizes": dict(self.stack_sizes)}

    def measured(self, pair: Pair, size: int) -> Stacking:
        """This stacking with the pair's stack size measured as `size`."""
        return dataclasses.replace(self, stack_sizes={**self.stack_sizes, pair.name: size})

    def unbatched_because(self, pair: Pair, cell: dict) -> str | None:
        """Why the seeds of one of the pair's cells (grid values, or a candidate's config) train one
        trial per seed; None where they train batched in one trial."""
        model_says = batchable({**pair.base, **cell})
        if model_says:
            return model_says
        if self.batch_seeds is True:
            if self.study.batch_seeds == "auto" and pair.resources.gpu == 0:
                return f"batch_seeds: auto, and per_model.{pair.model}.resources gives its trials no GPU"
            return None
        if self.batch_seeds == "auto":
            return "batch_seeds: auto, and trials get no GPU here"
        return "batch_seeds: false"

    def stack_limit(self, pair: Pair) -> int | None:
        """The most members one of the pair's stacked trials trains (budget.stack_size, or what the
        launch measured for the pair); None: no limit, an ablation's whole cell group."""
        stack_size = self.study.budget.stack_size
        return stack_size if isinstance(stack_size, int) else self.stack_sizes.get(pair.name)

    def search_stack(self, pair: Pair) -> int:
        """How many TPE suggestions one of a search pair's trials trains, stacked: more than one only
        where the model stacks, the search varies a value a member may have of its own (MEMBER_KEYS:
        the rest of a stack's config is one, its first suggestion's) and a stack size is set or measured."""
        return min(self.stack_limit(pair) or 1, self.most_stacked(pair))

    def measures_stack_size(self, pair: Pair, use_gpu: bool) -> bool:
        """Whether a launch times the pair's throughput curve for its stack size: budget.stack_size
        auto, where its trials get a GPU and some of them stack (preflight.measure_stack_sizes)."""
        auto = self.study.budget.stack_size == "auto"
        return auto and use_gpu and pair.resources.gpu > 0 and self.most_stacked(pair) > 1

    def most_stacked(self, pair: Pair) -> int:
        """The most members one trial of the pair could stack: the largest cell group of an
        ablation, a search's whole budget where its suggestions can stack; 1 where nothing stacks."""
        study = self.study
        if study.is_ablation:
            groups = self.stack_groups(pair, study.grid_cells(pair), study.seeds)
            return max(len(group.get(MEMBERS_KEY, [None])) for group in groups)
        stacks = self.search_can_stack(pair) and not self.unstacked_because_shared(pair)
        return study.budget.trials if stacks else 1

    def search_can_stack(self, pair: Pair) -> bool:
        """Whether a search pair's suggestions could share a stack: its model stacks and its space
        varies a value a member may have of its own."""
        return bool(set(pair.space) & set(MEMBER_KEYS)) and self.unbatched_because(pair, {}) is None

    def unstacked_because_shared(self, pair: Pair) -> list[str]:
        """The keys that keep a search from stacking under budget.stack_size auto (shared_keys):
        TPE would try one value of them per stack, and a measured stack can be the whole budget:
        one architecture for a search over architectures. A stack_size the file gives stacks them
        anyway."""
        return shared_keys(pair) if self.study.budget.stack_size == "auto" else []

    def trials(self, pair: Pair, cells: list[dict], seeds: list[int]) -> list[dict]:
        """The trials that run `cells` (grid values, or candidates' configs) over `seeds`, in the
        cells' order: stack_groups, each cut into trials of at most stack_limit members
        (stack_cuts: no member left alone where the limit allows); a stack of one is a plain
        trial of its cell and seed."""
        out = []
        for trial in self.stack_groups(pair, cells, seeds):
            members = trial.pop(MEMBERS_KEY, None)
            if members is None:
                out.append(trial)
                continue
            start = 0
            for n in stack_cuts(len(members), self.stack_limit(pair) or len(members)):
                part, start = members[start : start + n], start + n
                out.append({**trial, MEMBERS_KEY: part} if len(part) > 1 else {**trial, **part[0]})
        return out

    def stack_groups(self, pair: Pair, cells: list[dict], seeds: list[int]) -> list[dict]:
        """`cells` over `seeds` as groups that may stack. Where the model stacks (unbatched_because),
        cells that differ only in MEMBER_KEYS share one group whose MEMBERS_KEY lists every seed of
        each (the seed and the cell's own MEMBER_KEYS values); the group's config is its first
        cell's, which each member's values override in place (so a member's config keeps the grid's
        key order, as its run's `cell` tag must). Elsewhere a trial per cell and seed."""
        trials, stacks = [], {}
        for cell in cells:
            if self.unbatched_because(pair, cell) is not None:
                trials += [{**cell, "seed": seed} for seed in seeds]
                continue
            shared = repr(sorted((k, repr(v)) for k, v in cell.items() if k not in MEMBER_KEYS))
            if shared not in stacks:
                stacks[shared] = {**cell, MEMBERS_KEY: []}
                trials.append(stacks[shared])
            own = {k: cell[k] for k in MEMBER_KEYS if k in cell}
            stacks[shared][MEMBERS_KEY] += [{**own, "seed": seed} for seed in seeds]
        return trials

    def tune_trial_count(self, pair: Pair) -> int:
        """The Tune trials behind the pair's Study.trial_count: a stack of members is one trial."""
        if not self.study.is_ablation:
            return math.ceil(self.study.trial_count(pair) / self.search_stack(pair))
        return len(self.trials(pair, self.study.grid_cells(pair), self.study.seeds))

    def seed_batching(self, pair: Pair) -> str:
        """How an ablation pair's seeds train, in words for the plan. Whether they batch can depend
        on the grid values (act): the first cell stands for all."""
        why_not = self.unbatched_because(pair, self.study.grid_cells(pair)[0])
        if why_not is None:
            trials, runs = self.tune_trial_count(pair), self.study.trial_count(pair)
            if trials < runs:
                return f"stacked: {trials} trial(s) train its {runs} runs (trainables.batched)"
            return "one trial per run"
        if len(self.study.seeds) < 2:
            return "one seed"
        if self.batch_seeds == "auto" and why_not.startswith("batch_seeds"):
            return "seeds batched where trials get a GPU (batch_seeds: auto), else 1 trial per seed"
        return f"1 trial per seed: {why_not}"

    def search_stacking(self, pair: Pair) -> str:
        """How a search pair's trials stack its TPE suggestions, in words for the plan ("" for not at all)."""
        stacking, hedge = self, ""
        # The plan is printed before the launch knows its GPUs: what one would make of it.
        if self.batch_seeds == "auto":
            if not any(p.resources.gpu > 0 for p in self.study.pairs):
                return ""
            stacking = dataclasses.replace(self, batch_seeds=True)
            hedge = ", where trials get a GPU (batch_seeds: auto)"
        if not stacking.search_can_stack(pair):
            return ""
        if shared := stacking.unstacked_because_shared(pair):
            return (
                f"; one TPE suggestion per trial: stacked suggestions would share {', '.join(shared)}, "
                "one value a stack (budget.stack_size K stacks them anyway)"
            )
        own = ", ".join(k for k in pair.space if k in MEMBER_KEYS)
        n = stacking.search_stack(pair)
        if n > 1:
            shared = shared_keys(pair)
            theirs = f"; the stack's {', '.join(shared)} its first suggestion's)" if shared else ")"
            return f"; {n} TPE suggestions per trial, stacked (each with its own {own}{theirs}{hedge}"
        if self.study.budget.stack_size == "auto":
            return (
                f"; TPE suggestions stacked per trial, as many as the launch measures pays "
                f"(budget.stack_size auto; each with its own {own}){hedge}"
            )
        return ""


def decide(study: Study, use_gpu: bool | None, stack_sizes: dict[str, int] | None = None) -> Stacking:
    """The study's stacking where trials get GPUs or not (`use_gpu`; None before that is known, as
    for the plan printed before a launch: batch_seeds auto stays undecided), with budget.stack_size
    auto as measured per pair (`stack_sizes`, preflight.measure_stack_sizes)."""
    batch_seeds = study.batch_seeds
    if batch_seeds == "auto" and use_gpu is not None:
        # On CPUs a stacked model of N seeds steps slower than N runs in turn
        # (docs/performance.md#cpu-stacked-seeds-against-separate-runs).
        batch_seeds = use_gpu and any(pair.resources.gpu > 0 for pair in study.pairs)
    return Stacking(study, batch_seeds, dict(stack_sizes or {}))


def launched(study: Study, state) -> Stacking:
    """The stacking a launch decided, as its launch.json (record.state.LaunchState) keeps it; a
    launch from before batch_seeds was kept stacks as its file says."""
    batch_seeds = study.batch_seeds if state.batch_seeds is None else state.batch_seeds
    return Stacking(study, batch_seeds, dict(state.stack_sizes))


def shared_keys(pair: Pair) -> list[str]:
    """The keys a search pair's space varies that a stack's members share (the model's shapes and
    the like): one value per stack, its first suggestion's."""
    return [k for k in pair.space if k not in MEMBER_KEYS]


def resources_key(study: Study, pair: Pair, field: str | None = None) -> str:
    """Where the file set a pair's resources (or one field of them): its model's own entry or the file's."""
    if field:
        own = getattr(pair.resources, field) != getattr(study.resources, field)
    else:
        own = pair.resources != study.resources
    return f"per_model.{pair.model}.resources" if own else "resources"


def holds(pair: Pair, use_gpu: bool, nodes: list[dict[str, float]]) -> bool:
    """Whether one of `nodes` (each one's resources by Ray's names) can run a trial of the pair."""
    if pair.needs_gpu and not use_gpu:
        return False
    asks = pair.resources.asks(use_gpu)
    return any(all(node.get(name, 0) >= amount for name, amount in asks.items()) for node in nodes)


def misfits(study: Study, use_gpu: bool, nodes: list[dict[str, float]]) -> list[str]:
    """Why a cluster of `nodes` (each one's resources by Ray's names) cannot run a pair's trials:
    a line per reason, naming the file's key at fault (preflight.check_fits refuses the first)."""
    problems = []
    for pair in study.pairs:
        if holds(pair, use_gpu, nodes):
            continue
        if pair.needs_gpu and not use_gpu:
            problems.append("{}: {} needs a GPU, and the cluster has none".format(*pair.cuda_device))
            continue
        asks = pair.resources.asks(use_gpu)
        most = {name: max((node.get(name, 0) for node in nodes), default=0) for name in asks}
        short = [name for name, amount in asks.items() if most[name] < amount]
        if not short:
            whole = f"no node of the cluster holds a whole trial's {asks}"
            problems.append(f"{resources_key(study, pair)}: {whole}")
            continue
        name = short[0]
        field = {"CPU": "cpu", "GPU": "gpu"}.get(name, "custom")
        key = f"{resources_key(study, pair, field)}.{field}" + (f".{name}" if field == "custom" else "")
        problems.append(
            f"{key}: a trial asks for {asks[name]:g} {name}; "
            f"no node of the cluster has that much (the most on one node: {most[name]:g})"
        )
    return list(dict.fromkeys(problems))  # pairs that share the file's resources fail on one key


def slots_in(
    stacking: Stacking, total: dict[str, float], use_gpu: bool, trials: dict[str, int] | None = None
) -> int:
    """How many trials run at once on a cluster holding `total` (by Ray's resource names):
    budget.cluster_concurrent, else as many of the pair with the smallest trials as it holds
    (Ray starts what fits), never more than the pairs' own limits allow together. `trials`:
    each pair's Tune trials in the phase (a confirmation's), by default the search's or ablation's."""
    study = stacking.study
    trials = trials or {p.name: stacking.tune_trial_count(p) for p in study.pairs}
    limit = sum(min(study.budget.max_concurrent, trials[p.name]) for p in study.pairs)
    if study.budget.cluster_concurrent:
        return min(limit, study.budget.cluster_concurrent)
    fits = max(
        min(total.get(name, 0) / amount for name, amount in p.resources.asks(use_gpu).items())
        for p in study.pairs
    )
    return max(1, min(limit, math.floor(fits + 1e-9)))
