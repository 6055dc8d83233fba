"""What a training step costs without timing one: the step rates the benchmarks measured
(step_rates.csv, beside this module), scaled to a trial's size. A step's work is taken as its
model's parameters times its batch (a step's FLOPs grow with both); on a GPU a smaller step is taken
to cost no less than the measured one (small steps leave a GPU waiting on kernel launches, not on
arithmetic), so the figure there is an upper bound.

Which measurement prices a trial, in order: the model on the same task and device (of the rows,
the largest stack not larger than the trial's; between two of its sizes, interpolated in log-log);
the model on another task; on a GPU with no GPU row of the model, its CPU row times the median GPU
speed-up of the models measured on both; with no row of the model at all, the median cost per
parameter-sample of the models measured on the device. The basis is said beside each figure.
Evaluations are priced from the step time and the sizes of the sets they score
(evaluation_seconds)."""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # trainables.tasks imports torch, which `orchestrator --help` and `status` go without
    from trainables.tasks.sizes import EvalSizes

RATES_FILE = Path(__file__).with_name("step_rates.csv")
# What an evaluated position costs against a trained one (a training step's time per sample over its
# mean length): its forward pass alone, with no backward pass or optimizer step. Measured set by set
# with benchmarks/bench_evaluation.py --price: 0.16-0.94 over six models and four tasks, PANM's
# 80-token Copy tests the dearest (docs/performance.md#step-rates-for-the-dry-run).
FORWARD_SHARE = 0.35


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


def bracketing(rows: list[Measured], row: Measured, work: float) -> Measured | None:
    """The row of `row`'s task and stack size nearest `work` on its other side: with `row`, the two
    measured sizes a step between them is interpolated from; None where `work` lies beyond them."""
    side = row.params * row.batch - work
    across = [
        r
        for r in rows
        if (r.task, r.members) == (row.task, row.members) and (r.params * r.batch - work) * side < 0
    ]
    return min(across, key=lambda r: abs(r.params * r.batch - work), default=None)


def interpolated(row: Measured, other: Measured, work: float) -> float:
    """Seconds per step at `work`, on the straight line through two measured sizes in log-log: a
    small model's step is more overhead than arithmetic, so its time grows slower than its work
    (the LSTM's 9.7x the work on CTL took 2.6x the time, PANM's 27x on Copy 4.8x)."""
    slope = math.log(row.steps_per_s / other.steps_per_s) / math.log(
        (other.params * other.batch) / (row.params * row.batch)
    )
    return (work / (row.params * row.batch)) ** slope / row.steps_per_s


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
        if other := bracketing(own, row, work):
            return interpolated(row, other, work), (
                f"cost model between {row.words()} and {other.steps_per_s:g} steps/s at "
                f"{other.params:,} parameters x batch {other.batch}, interpolated to {params:,} "
                f"parameters x batch {batch}"
            )
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
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def evaluations(n_iters: int, eval_every: int) -> int:
    """A trial's evaluations: every `eval_every` iterations and at its last (train.run)."""
    return math.ceil(n_iters / eval_every)


def evaluation_seconds(per_step: float, batch: int, sizes: EvalSizes) -> float:
    """Seconds of one evaluation of a trial that trains at `per_step` seconds per step of `batch`
    samples: each set's rows x their length (x their outputs, where the kind decodes), a position
    at FORWARD_SHARE of a trained one. Its tests are counted in every evaluation, as where each
    evaluation keeps a new best checkpoint (a run whose OOD score stops rising scores them less
    often): an upper bound."""
    per_position = FORWARD_SHARE * per_step / (batch * sizes.train_length)
    positions = sum(
        s.rows * s.length * (s.outputs if sizes.decodes else 1) for s in (*sizes.validation, *sizes.tests)
    )
    return per_position * positions


def training_cost(
    model: str,
    task: str,
    device: str,
    params: int,
    batch: int,
    steps: int,
    eval_every: int,
    sizes: EvalSizes | None,
) -> str:
    """One line for `orchestrator train` before it starts: the steps and the evaluations, and their
    time by the cost model."""
    per_step, basis = seconds_per_step(model, task, device, params, batch)
    if per_step is None:
        return f"cost: {steps:,} training steps of batch {batch}; {basis}"
    training = steps * per_step
    line = (
        f"cost: {steps:,} training steps of batch {batch} at about {1 / per_step:.1f} steps/s on {device} = "
        f"{hours(training)}"
    )
    if sizes is None:
        return f"{line} (evaluations left out: their sets' sizes come with the data; by the {basis})"
    count = evaluations(steps, eval_every)
    evaluating = count * evaluation_seconds(per_step, batch, sizes)
    return (
        f"{line}, and {count:,} evaluation(s) = at most {hours(evaluating)}: at most "
        f"{hours(training + evaluating)} (by the {basis})"
    )
