"""Seconds per training step on this machine, evaluations left out: what a cost estimate and the
benchmarks time."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .config import TrainConfig
from .devices import setup_device, synchronize
from .learners import Single


def training_step(cfg: TrainConfig) -> tuple[Callable[[], None], torch.device]:
    """-> (one training step of `cfg` as `train` takes it, on fresh data each call; its device), with
    the task loaded and the model built: what a benchmark or the cost estimate times. The task's
    data are generated (or read from the cache) as for training: pass small sizes."""
    device = setup_device(cfg)
    return Single(cfg, device).step, device


def seconds_per_step(
    cfg: TrainConfig, steps: int = 3, before_timing: Callable[[], None] | None = None
) -> float:
    """Seconds per training step of `cfg` on this machine (step_seconds), evaluations left out: what
    `launch --dry-run` turns into a cost estimate. `before_timing` runs between the warm-up and the
    timing (a benchmark's barrier)."""
    step, device = training_step(cfg)
    return step_seconds(step, device, steps, before_timing)


def step_seconds(
    step: Callable[[], Any],
    device: torch.device,
    steps: int,
    before_timing: Callable[[], None] | None = None,
) -> float:
    """The median seconds of `steps` calls of `step`, each timed to its device's end, after one
    warm-up call. A median, so that one step slowed by other work on a shared machine does not
    move the estimate."""
    step()
    synchronize(device)
    if before_timing:
        before_timing()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
