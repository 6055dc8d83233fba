"""What a launch will cost, for `launch --dry-run`: trials and training steps per pair and, from a
short calibration (a few training steps of each pair's typical trial on this machine), the hours."""
from __future__ import annotations

import math
import os
import tempfile
from typing import Iterator
from unittest import mock

from .spec import Distribution, Pair, Study

CALIBRATION_TRAIN_SIZE = 4  # batches' worth of training data: data generation stays a second or two
CALIBRATION_EVAL_SIZE = 64


def typical(d: Distribution):
    """The middle of a searched range: what a calibration trains when there is no paper setting."""
    if d.kind == "choice":
        return d.values[len(d.values) // 2]
    low, high = d.values
    middle = math.sqrt(low * high) if d.kind == "loguniform" else (low + high) / 2
    return d.nearest(middle)


def typical_config(study: Study, pair: Pair) -> dict:
    if study.is_ablation:
        return {**pair.base, **{k: v[0] for k, v in pair.grid.items()}}
    searched = pair.warm_start if study.warm_start and pair.warm_start else {k: typical(d) for k, d in pair.space.items()}
    return {**pair.base, **searched}


def seconds_per_step(study: Study, pair: Pair) -> float:
    """Training steps of the pair's typical trial, timed here on a small copy of its task whose data
    go to a temporary cache (nothing of the calibration stays)."""
    from trainables.config import parse_trial_config
    from trainables.train import seconds_per_step as timed

    flat = typical_config(study, pair)
    batch = int(flat.get("batch_size", 64))
    options = flat.get("task_options", {})
    flat["task_options"] = {**options, "train_size": min(options.get("train_size", math.inf), CALIBRATION_TRAIN_SIZE * batch),
                            "eval_size": min(options.get("eval_size", math.inf), CALIBRATION_EVAL_SIZE)}
    cfg = parse_trial_config(flat)
    cfg.threads = max(1, int(study.resources.cpu))
    with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, {"SYSGEN_DATA_CACHE": cache}):
        return timed(cfg)


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def describe_cost(study: Study, calibrate: bool = True) -> Iterator[str]:
    """Lines for `launch --dry-run`, each as soon as it is known: per pair, trials x steps and
    (calibrated) trial time; in all, the wall time with as many trials at once as this machine's
    CPUs hold."""
    total_steps, total_s = 0, 0.0
    for pair in study.pairs:
        trials, steps = study.trial_count(pair) + study.confirm_count(), int(pair.base["n_iters"])
        total_steps += trials * steps
        confirming = f" (with {study.confirm_count()} confirmation trials)" if study.confirm_count() else ""
        line = f"  cost of {pair.name}: {trials} trials{confirming} x {steps:,} steps = {trials * steps:,} training steps"
        if calibrate:
            try:
                per_step = seconds_per_step(study, pair)
            except Exception as e:  # noqa: BLE001 - an estimate that cannot be made is no reason to refuse the launch
                line += f"; no time estimate ({(str(e) or type(e).__name__).splitlines()[0]})"
            else:
                total_s += trials * steps * per_step
                line += f"; {per_step:.3f} s per step here -> at most {hours(trials * steps * per_step)} of trial time"
        yield line
    slots = sum(min(study.budget.max_concurrent, study.tune_trial_count(p)) for p in study.pairs)
    slots = min(slots, study.budget.cluster_concurrent or slots, max(1, math.floor((os.cpu_count() or 1) / study.resources.cpu)))
    summary = f"  cost in all: {total_steps:,} training steps"
    if total_s:
        summary += (f"; on this machine ({os.cpu_count()} CPUs, {slots} trial(s) at once) at most {hours(total_s / slots)} "
                    "(evaluations left out; ASHA stops poor trials sooner)")
    yield summary
