"""A launch's plan in words, as `launch` prints it before it starts (and `--dry-run` with its cost)."""

from __future__ import annotations

import math

from trainables.fields import yaml_word
from trainables.models import label

from ..record.secrets import redact
from ..record.state import SEED_STRIDE
from ..run.cost import describe_cost, on_cluster
from ..run.stacking import decide


def print_plan(study, night: int | None) -> None:
    """The plan of a launch, and for a night of the nightly job its seeds and its baseline."""
    print(describe_study(study), flush=True)
    if night is not None:
        compared = (
            "the first night: nothing to compare with yet; the nights after it compare with it"
            if night == 0
            else "compared with the last finished night that flagged no regression "
            f"({study.report.test}, alpha {study.report.alpha:g})"
        )
        print(
            f"  night {night + 1} of {study.experiment}: seeds + {night * SEED_STRIDE}; {compared}",
            flush=True,
        )


def print_cost(study, args) -> None:
    """`--dry-run`'s estimate of what the launch of `study` will cost, a line at a time."""
    if args.calibrate:
        where = f", on nodes of the cluster at {args.address}" if on_cluster(args.address) else ""
        print(
            "  calibrating: a few training steps of each pair's typical trial "
            f"({len(study.pairs)} pairs){where}",
            flush=True,
        )
    for line in describe_cost(study, args.calibrate, args.address):
        print(line, flush=True)


def describe_study(study) -> str:

    stacking = decide(study, use_gpu=None)  # printed before the launch knows whether trials get GPUs
    if study.is_ablation:
        cells = [math.prod(len(v) for v in p.grid.values()) for p in study.pairs]
        lines = [
            f"{study.path}: ablation of {len(study.pairs)} model/task pairs, {sum(cells)} grid cells in "
            f"all x {len(study.seeds)} seeds, "
            f"{study.budget.max_concurrent} at a time per pair; MLflow {redact(study.tracking.uri)}"
        ]
        lines += [
            f"  pair {p.name}: grid over {', '.join(p.grid) or 'seeds only'} ({n} cells; "
            f"{stacking.seed_batching(p)}){own_resources(study, p)}{own_values(p)}"
            for p, n in zip(study.pairs, cells)
        ]
    else:
        lines = [
            f"{study.path}: {len(study.pairs)} model/task pairs x {study.budget.trials} trials, "
            f"{study.budget.max_concurrent} at a time per pair; optimising {study.metric} ({study.mode}); "
            f"MLflow {redact(study.tracking.uri)}"
        ]
        lines += [
            f"  pair {p.name}: searching {', '.join(p.space) or 'nothing'}{stacking.search_stacking(p)}"
            f"{unstopped(study, p)}{own_resources(study, p)}{own_values(p)}"
            for p in study.pairs
        ]
        if study.confirm.top_k:
            lines.append(
                f"  then confirming: each pair's {study.confirm.top_k} best trials again with seeds "
                f"{', '.join(map(str, study.confirm.seeds))}; "
                "the pair's answer is the best candidate's mean"
            )
    lines += training_lines(study)
    lines.append(
        f"  trial checkpoints in {study.storage.uri}; a trial restarts up to {study.budget.max_failures} "
        "times from its last one"
    )
    lines += [f"  skipped (incompatible): {s}" for s in study.skipped]
    lines += [f"  unused: {u}" for u in study.unused]
    return "\n".join(lines)


def own_resources(study, pair) -> str:
    """A pair's trial resources in words for the plan, where per_model sets them ("" for the file's)."""
    if pair.resources == study.resources:
        return ""
    gpu = f", {pair.resources.gpu:g} GPU" if pair.resources.gpu else ""
    return f"; each trial {pair.resources.cpu:g} CPU{gpu}" + "".join(
        f", {v:g} {k}" for k, v in pair.resources.custom.items() if v
    )


def own_values(pair) -> str:
    """A pair's per_pair values in words for the plan ("" where it has none)."""
    return (
        "; its own values (per_pair): " + ", ".join(f"{k}={v}" for k, v in pair.own_values.items())
        if pair.own_values
        else ""
    )


def training_lines(study) -> list[str]:
    """Per pair, the protocol keys its paper's preset gives it and those at the training defaults
    (the file's fixed, space and grid aside); per task variant whose models differ in them, a line
    saying so (a model without a preset beside the papers' baselines)."""

    def listed(values: dict) -> str:
        return ", ".join(f"{k}={yaml_word(v)}" for k, v in values.items()) or "none"

    def by_value(models: dict) -> str:
        grouped: dict[str, list[str]] = {}
        for model, value in models.items():
            grouped.setdefault(yaml_word(value), []).append(label(model))
        return ", ".join(f"{value} ({', '.join(names)})" for value, names in grouped.items())

    lines = [
        f"  training of {p.name}: from its paper's preset: {listed(p.from_preset)}; "
        f"at the training defaults: {listed(p.from_defaults)}"
        for p in study.pairs
    ]
    for variant in dict.fromkeys(p.task.variant for p in study.pairs):
        if unlike := study.unlike_training(variant):
            differences = "; ".join(
                f"{key} {by_value(fallen)} at the defaults, {by_value(papers)} from their papers"
                for key, (papers, fallen) in unlike.items()
            )
            lines.append(f"  {variant}: its models train unlike: {differences} (`fixed:` sets one for all)")
    return lines


def unstopped(study, pair) -> str:
    """Where ASHA could stop none of a search pair's trials (they end by its first rung), in words
    for the plan ("" otherwise): the file asks for early stopping that would never happen."""
    n_iters = int(pair.base["n_iters"])
    if not study.uses_asha or n_iters > study.scheduler.grace_period:
        return ""
    return (
        f"; ASHA stops none of its trials: they end at {n_iters} iterations, within "
        f"scheduler.grace_period {study.scheduler.grace_period}"
    )
