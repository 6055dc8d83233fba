"""What a training step costs without timing one: the step rates the benchmarks measured
(step_rates.csv, beside this module), scaled to a trial's size. A step's work is taken as its
model's parameters times its batch (a step's FLOPs grow with both); on a GPU a smaller step is taken
to cost no less than the measured one (small steps leave a GPU waiting on kernel launches, not on
arithmetic), so the figure there is an upper bound.

Which measurement prices a trial, in order: the model on the same task and device (of the rows,
the largest stack not larger than the trial's); the model on another task; on a GPU with no GPU row
of the model, its CPU row times the median GPU speed-up of the models measured on both; with no row
of the model at all, the median cost per parameter-sample of the models measured on the device. The
basis is said beside each figure."""

from __future__ import annotations

import csv
import dataclasses
import statistics
from functools import cache
from pathlib import Path

RATES_FILE = Path(__file__).with_name("step_rates.csv")


@dataclasses.dataclass(frozen=True)
class Measured:
    model: str
    task: str
    device: str  # cpu or cuda
    members: int
    batch: int
    params: int
    steps_per_s: float

    @property
    def seconds_per_work(self) -> float:
        """Seconds per parameter-sample of one member: what scales to another size."""
        return 1 / (self.steps_per_s * self.params * self.batch)

    def words(self) -> str:
        stack = f" (member-steps/s of stacks of {self.members})" if self.members > 1 else ""
        return (
            f"{self.model} on {self.task}: {self.steps_per_s:g} steps/s{stack} at {self.params:,} "
            f"parameters x batch {self.batch} on {self.device} ({RATES_FILE.name})"
        )


@cache
def measured() -> tuple[Measured, ...]:
    with RATES_FILE.open() as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return tuple(
            Measured(
                r["model"],
                r["task"],
                r["device"],
                int(r["members"]),
                int(r["batch"]),
                int(r["params"]),
                float(r["steps_per_s"]),
            )
            for r in rows
        )


def closest(rows: list[Measured], task: str, members: int, work: float) -> Measured:
    """Of one model's rows on a device: the same task first, then the largest stack not larger
    than `members`, then the size nearest `work`."""
    return min(
        rows,
        key=lambda r: (
            r.task != task,
            r.members > members,
            -r.members,
            abs(r.params * r.batch - work) / work,
        ),
    )


def gpu_speedup() -> float:
    """The median, over models measured alone on both, of a GPU's seconds per parameter-sample
    against a CPU's at the GPU row's size."""
    ratios = []
    for gpu in (r for r in measured() if r.device == "cuda" and r.members == 1):
        cpus = [r for r in measured() if (r.model, r.task, r.device) == (gpu.model, gpu.task, "cpu")]
        if cpus:
            cpu = closest(cpus, gpu.task, 1, gpu.params * gpu.batch)
            ratios.append(cpu.seconds_per_work / gpu.seconds_per_work)
    return statistics.median(ratios)


def seconds_per_step(
    model: str, task: str, device: str, params: int, batch: int, members: int = 1
) -> tuple[float | None, str]:
    """(seconds per training step of one member of a trial of `model` on `task` with `params`
    parameters and `batch`, on `device`; the basis in words)."""
    work = params * batch
    own = [r for r in measured() if r.model == model and r.device == device]
    if own:
        row = closest(own, task, members, work)
        per_work, basis = row.seconds_per_work, row.words()
    elif device == "cuda" and (cpu := [r for r in measured() if r.model == model and r.device == "cpu"]):
        row, speedup = closest(cpu, task, 1, work), gpu_speedup()
        per_work = row.seconds_per_work / speedup
        basis = f"no GPU measurement of {model}: {row.words()}, / {speedup:.0f} (median GPU speed-up)"
    else:
        on_device = [r for r in measured() if r.device == device]
        if not on_device:
            return None, f"no measured step rate on {device}"
        row = min(on_device, key=lambda r: abs(r.params * r.batch - work))
        per_work = statistics.median(r.seconds_per_work for r in on_device)
        basis = (
            f"no measurement of {model}: the median cost per parameter-sample of {len(on_device)} measured"
        )
    scale = max(work, row.params * row.batch) if device == "cuda" else work
    if work != row.params * row.batch:
        basis += f", scaled to {params:,} parameters x batch {batch}"
    return per_work * scale, f"cost model from {basis}"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def training_cost(model: str, task: str, device: str, params: int, batch: int, steps: int) -> str:
    """One line for `orchestrator train` before it starts: the steps, and their time by the cost model."""
    per_step, basis = seconds_per_step(model, task, device, params, batch)
    if per_step is None:
        return f"cost: {steps:,} training steps; {basis}"
    return (
        f"cost: {steps:,} training steps at about {1 / per_step:.1f} steps/s on {device} = "
        f"{hours(steps * per_step)} (evaluations left out; by the {basis})"
    )
