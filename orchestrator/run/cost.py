"""What a launch will cost, for `launch --dry-run`: trials and training steps per pair and the
hours. By default nothing trains: a pair's step time is the step rate earlier trials of its model
logged in the tracking store, else the cost model's (cost_model: the benchmarks' measured rates
scaled to the pair's size); trials that ask for GPUs are priced on a GPU even where this machine has
none. `--calibrate` times a few training steps of each pair's typical trial instead, on this
machine or on a node of the cluster at --address with a trial's resources. A trial's evaluations
are priced from that step time and its task's evaluation sets' sizes (cost_model.evaluation_seconds)."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import statistics
from collections.abc import Iterator

import torch

from trainables.batched import member_steps_per_second
from trainables.config import parameter_count, parse_trial_config
from trainables.fields import yaml_word
from trainables.models import batchable
from trainables.tasks import eval_sizes, small_copy_options
from trainables.tasks.base import throwaway_data_cache
from trainables.timing import seconds_per_step as train_seconds_per_step

from ..plan.storage import last_line
from ..plan.study import Pair, Study
from ..record.runs import step_rates
from ..record.secrets import redact, redact_text
from . import cost_model
from .cluster import join, measurement, one_gpu
from .cost_model import hours
from .stacking import MEMBERS_KEY, Stacking, decide, group_rate, holds, knee, misfits, slots_in

CALIBRATION_TRAIN_SIZE = 4  # batches' worth of training data: data generation stays a second or two
CALIBRATION_EVAL_SIZE = 64
CALIBRATION_STEPS = 5  # timed one by one; their median is the estimate
CALIBRATION_WAIT_S = (
    600  # on a cluster, for a node with a trial's resources free: other work may hold its GPUs for hours
)


def typical_config(stacking: Stacking, pair: Pair, stacked: bool = False) -> dict:
    """The pair's middle grid cell (each key's middle value: a grid's first cell is often its
    cheapest, PANM's heads ablation's H^a = H^c = 0), or its search's warm start or middle.
    `stacked`: one whose trials stack, for a stack-size curve: the cell of the largest stacking
    group (an ablation's first cell may be one that cannot stack, `act: graves`), a search's typical
    config with the first value of a choice that lets it stack where the typical one cannot."""
    study = stacking.study
    if study.is_ablation:
        if stacked:
            groups = [
                g
                for g in stacking.stack_groups(pair, study.grid_cells(pair), study.seeds)
                if MEMBERS_KEY in g
            ]
            if groups:
                largest = max(groups, key=lambda group: len(group[MEMBERS_KEY]))
                return {**pair.base, **{k: v for k, v in largest.items() if k != MEMBERS_KEY}}
        return {**pair.base, **{k: v[len(v) // 2] for k, v in pair.grid.items()}}
    searched = (
        pair.warm_start
        if study.warm_start and pair.warm_start
        else {k: d.typical() for k, d in pair.space.items()}
    )
    flat = {**pair.base, **searched}
    if stacked and batchable(flat) is not None:
        stacking = [{**flat, k: v} for k, d in pair.space.items() for v in d.choices]
        flat = next((c for c in stacking if batchable(c) is None), flat)
    return flat


def calibration_config(stacking: Stacking, pair: Pair, stacked: bool = False) -> dict:
    """The pair's typical trial (typical_config) on a small copy of its task: what a calibration times."""
    flat = typical_config(stacking, pair, stacked)
    batch = int(flat.get("batch_size", 64))
    flat["task_options"] = small_copy_options(
        pair.task.task, flat.get("task_options", {}), CALIBRATION_TRAIN_SIZE * batch, CALIBRATION_EVAL_SIZE
    )
    return {**flat, "threads": max(1, int(pair.resources.cpu))}


def seconds_per_step(stacking: Stacking, pair: Pair) -> float:
    """Training steps of the pair's typical trial, timed here on a small copy of its task whose data
    go to a temporary cache (nothing of the calibration stays)."""
    with throwaway_data_cache():
        return train_seconds_per_step(
            parse_trial_config(calibration_config(stacking, pair)), CALIBRATION_STEPS
        )


def stack_curve(flat: dict, sizes: list[int]) -> list[tuple[int, float]]:
    """The throughput curve (trainables.batched.member_steps_per_second) of a calibration config,
    its data in a temporary cache."""
    # Uncompiled, even where the stack will train compiled (compile: auto on CUDA): a compile per
    # size tried would take minutes each, and on an H100 NDR's compiled stack levels off where its
    # graphed one does (about 20 members; docs/performance.md#gpu-members-stacked-in-one-trial).
    cfg = parse_trial_config({**flat, "compile": False})
    with throwaway_data_cache():
        return member_steps_per_second(cfg, sizes, CALIBRATION_STEPS)


def stack_sizes_to_try(most: int) -> list[int]:
    """1, 2, 4, ... up to `most` members, and `most` itself."""
    return sorted({*(2**k for k in range(most.bit_length()) if 2**k <= most), most})


def reason(e: Exception) -> str:
    """An error in one line, for a line of the estimate."""
    return (str(e) or type(e).__name__).splitlines()[0]


def resource_hours(seconds: float) -> str:
    """GPU- or core-hours to two significant digits under 10, so that 3 minutes is not "0.0"."""
    return f"{seconds / 3600:.1f}" if seconds >= 36000 else f"{seconds / 3600:.2g}"


def on_cluster(address: str | None) -> bool:
    return bool(address) and address != "local"


def resources(address: str | None) -> tuple[str, dict[str, float], list[dict[str, float]]]:
    """(where, its resources by Ray's names, each node's) of what will train the trials: the Ray
    cluster at `address`, joined (describe_cost leaves it when done), else this machine."""
    if on_cluster(address):
        import ray  # noqa: PLC0415 - seconds to import: a dry run on this machine runs without Ray

        join(address, log_to_driver=False, logging_level=logging.WARNING)
        return (
            f"the cluster at {address}",
            ray.cluster_resources(),
            [node["Resources"] for node in ray.nodes() if node.get("Alive")],
        )
    machine = {
        "CPU": os.cpu_count() or 1,
        "GPU": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    return "this machine", machine, [machine]


def device_kind(pair: Pair, on_gpu: bool) -> str:
    """Where the pair's trials train, cpu or cuda: a GPU where trials get one (Ray hides the GPUs
    from a trial that asks for none), unless the config names its device."""
    named = str(pair.base.get("device", "auto"))
    return named.split(":")[0] if named != "auto" else "cuda" if on_gpu else "cpu"


def stored_rate(rates: list[dict], model: str, task: str, device: str) -> tuple[float | None, str]:
    """(the median steps/s of earlier trials of `model` on `device`, of `task` where there are any,
    else of any task; where it comes from), or (None, why there is none)."""
    of_model = [r["rate"] for r in rates if r["model"] == model and r["device"] == device]
    of_task = [
        r["rate"] for r in rates if r["model"] == model and r["device"] == device and r["task"] == task
    ]
    if not of_model:
        return None, f"no stored step rate for {model} on {device}"
    found, what = (of_task, f"{model} on {task}") if of_task else (of_model, f"{model} (other tasks)")
    return statistics.median(found), f"from {len(found)} earlier trials of {what} on {device}"


def on_node(needs_cuda: bool, measure, *args) -> tuple:
    """A Ray task's body: (measure(*args), the node's name), or (None, its name) where the trials
    train on CUDA and torch there finds none (a CPU's time is no estimate of a GPU's)."""
    if needs_cuda and not torch.cuda.is_available():
        return None, socket.gethostname()
    return measure(*args), socket.gethostname()


class Calibration:
    """Where a dry run times trials: here, one measurement after another, or on the nodes of the
    joined cluster (`cluster`) as Ray tasks with a trial's CPUs and custom resources and, where its
    trials train on GPUs, a whole GPU (as preflight.measure_stack_sizes: a measurement beside others is
    timed by them), since the cluster's nodes, not the driver's machine, train them. There, every
    measurement is submitted first (submit), so that a cluster's GPUs take them side by side, and
    collected in the plan's order (result)."""

    def __init__(self, cluster: bool):
        self.cluster, self.jobs, self.whole_gpu = cluster, {}, None

    def submit(self, pair: Pair, device: str, measure, *args) -> None:
        if not self.cluster:
            return
        if device == "cuda" and self.whole_gpu is None:
            self.whole_gpu = one_gpu()  # asked of Ray once, not per measurement
        gpus = max(pair.resources.gpu, self.whole_gpu) if device == "cuda" else 0
        measured = measurement(
            on_node, num_cpus=pair.resources.cpu, num_gpus=gpus, resources=pair.resources.custom or None
        )
        self.jobs[(pair.name, measure.__name__)] = measured.remote(device == "cuda", measure, *args)

    def result(self, pair: Pair, device: str, measure, *args) -> tuple:
        """(measure(*args), where it ran in words), or (None, why it did not run)."""
        if not self.cluster:
            if device == "cuda" and not cuda_here():
                return (
                    None,
                    "this machine has none (run the dry run on a GPU node or with --address of a cluster "
                    "with GPUs, or --no-calibrate)",
                )
            return measure(*args), "here"
        # Seconds to import: a calibration on this machine runs without Ray
        import ray  # noqa: PLC0415
        from ray.exceptions import GetTimeoutError, RayTaskError  # noqa: PLC0415

        if (pair.name, measure.__name__) not in self.jobs:
            self.submit(pair, device, measure, *args)
        job = self.jobs.pop((pair.name, measure.__name__))
        try:
            result, node = ray.get(job, timeout=CALIBRATION_WAIT_S)
        except GetTimeoutError:
            ray.cancel(job)
            raise TimeoutError(
                f"not done within {CALIBRATION_WAIT_S} s: other work may hold the nodes with a trial's "
                "resources"
            ) from None
        except RayTaskError as e:  # its first line names Ray's worker; the cause ends it
            raise RuntimeError(last_line(e)) from None
        return (
            (None, f"torch on {node}, a node with GPUs, finds no CUDA")
            if result is None
            else (result, f"on {node}")
        )


def step_time(
    stacking: Stacking,
    pair: Pair,
    rates: list[dict] | None,
    device: str,
    calibration: Calibration | None = None,
) -> tuple[float | None, str]:
    """(seconds per training step of the pair's trials, in words), or (None, why there is no estimate):
    calibrated (here, or where `calibration` says) where `rates` is None, else from the stored rates."""
    if rates is None:
        try:
            per_step, where = (calibration or Calibration(False)).result(
                pair, device, seconds_per_step, stacking, pair
            )
        except Exception as e:  # an estimate not made is no reason to refuse the launch
            return None, f"no time estimate ({reason(e)})"
        if per_step is None:
            return None, f"not timed: its trials train on GPUs and {where}"
        return per_step, f"{per_step:.3f} s per step {where}"
    rate, source = stored_rate(rates, pair.model, pair.task.task, device)
    return (None, source) if rate is None else (1 / rate, f"{rate:.1f} steps/s ({source})")


def modelled_step_time(stacking: Stacking, pair: Pair, device: str, members: int) -> tuple[float | None, str]:
    """(seconds per member-step of the pair's typical trial, stacked `members` high, by the cost
    model; in words), or (None, why there is no estimate)."""
    try:
        cfg = parse_trial_config(typical_config(stacking, pair, stacked=members > 1))
        params = parameter_count(cfg)
    except Exception as e:  # as a failed calibration: no estimate, no refusal
        return None, f"no estimate ({reason(e)})"
    per_step, basis = cost_model.seconds_per_step(
        pair.model, pair.task.task, device, params, cfg.batch_size, members
    )
    if per_step is None:
        return None, basis
    return per_step, f"{1 / per_step:.1f} steps/s by the {basis}"


def evaluation_time(stacking: Stacking, pair: Pair, per_step: float) -> tuple[float | None, str]:
    """(seconds of the evaluations of one of the pair's typical trials, which trains at `per_step`
    seconds per step; in words), or (None, why they are not priced)."""
    try:
        cfg = parse_trial_config(typical_config(stacking, pair))
        sizes = eval_sizes(cfg.task, cfg.task_options)
    except Exception as e:  # as a failed calibration: no estimate, no refusal
        return None, f"evaluations not priced ({reason(e)})"
    if sizes is None:
        return None, "evaluations not priced: their sets' sizes come with the data"
    count = cost_model.evaluations(cfg.n_iters, cfg.eval_every)
    seconds = count * cost_model.evaluation_seconds(per_step, cfg.batch_size, sizes)
    return seconds, f"{count:,} evaluation(s) a trial, at most {hours(seconds)}"


def cuda_here() -> bool:
    return torch.cuda.is_available()


def launch_stack_size(stacking: Stacking, pair: Pair, use_gpu: bool) -> int | None:
    """The members a launch stacks in one of the pair's trials (the largest of its stacks): 1 where
    nothing of the pair stacks, else at most budget.stack_size and the pair's own most; with auto,
    None where the launch measures the throughput curve's knee (trials on a GPU), else an
    ablation's whole cell group and a search's single suggestion."""
    limit, most = stacking.stack_limit(pair), stacking.most_stacked(pair)
    if most <= 1:  # nothing of the pair stacks: its trials are timed as plain trials
        return 1
    if limit:
        return min(limit, most)
    if stacking.measures_stack_size(pair, use_gpu):
        return None
    return most if stacking.study.is_ablation else 1


def curve_args(stacking: Stacking, pair: Pair, size: int | None) -> tuple[dict, list[int]]:
    """What stack_curve times for a pair whose trials stack `size` members (None: the knee)."""
    return calibration_config(stacking, pair, stacked=True), stack_sizes_to_try(
        size or stacking.most_stacked(pair)
    )


def stacked_step_time(
    stacking: Stacking, pair: Pair, size: int | None, device: str, calibration: Calibration | None = None
) -> tuple[float | None, str, int]:
    """Where the pair's trials stack `size` members (None: the throughput curve's knee, as
    preflight.measure_stack_sizes takes it): (seconds per member-step, in words, the size), from the
    curve measured here or where `calibration` says. None where the stack does not fit the device."""
    (flat, sizes), most = curve_args(stacking, pair, size), stacking.most_stacked(pair)
    measured_curve, where = (calibration or Calibration(False)).result(pair, device, stack_curve, flat, sizes)
    if measured_curve is None:
        return None, f"not timed: {where}", size
    curve = dict(measured_curve)
    size = size or knee(list(curve.items()), members=most)
    if size not in curve:
        return (
            None,
            f"no memory {where} for stacks of {size} (the most that fit: {max(curve, default=0)})",
            size,
        )
    words = f"stacks of {size}: {curve[size]:.1f} member-steps/s {where}"
    if parse_trial_config(flat).settled(device, size).compile is not False:
        asked = (
            "compile: auto on CUDA"
            if flat.get("compile", "auto") == "auto"
            else f"compile: {yaml_word(flat['compile'])}"
        )
        words += (
            f", uncompiled; they train compiled ({asked}), so the time is an upper bound (NDR's compiled "
            "bf16 stack ran 2.03x the uncompiled one on an H100, after 1.5-3 min of compiling)"
        )
    return 1 / group_rate(list(curve.items()), most, size), words, size


def busy_note() -> str | None:
    """A line saying this machine is busy, where it is: a calibration's threads share its cores with
    the other work (on 2 busy cores, a review timed an LSTM step of search_spaces/arithmetic.yaml
    at 7.85 s that takes 0.29 s on idle ones)."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load < cores:
        return None
    return (
        f"  this machine is busy (load average {load:.1f} on {cores} CPUs): the calibrated step times below "
        "may be many times too long"
    )


def describe_cost(study: Study, calibrate: bool = False, address: str | None = None) -> Iterator[str]:
    """Lines for `launch --dry-run`, each as soon as it is known: per pair, runs x steps and the
    trial time (from the store's step rates, else the cost model; with `calibrate`, timed here, or
    with `address` on the cluster's nodes (Calibration), where trials stack at the rate of a stack's
    members measured so); in all,
    the GPU-hours (or CPU core-hours) and the wall time with as many trials at once as the cluster
    or this machine holds. Reads only: a dry run writes nothing, not even a new store."""
    try:
        yield from cost_lines(study, calibrate, on_cluster(address), *resources(address))
    finally:
        if on_cluster(address):
            import ray  # noqa: PLC0415 - as in resources: imported where the dry run joined a cluster

            ray.shutdown()


def cost_lines(
    study: Study,
    calibrate: bool,
    cluster: bool,
    where: str,
    total: dict[str, float],
    nodes: list[dict[str, float]],
) -> Iterator[str]:
    """describe_cost's lines, on `where` with `total` resources and `nodes`."""
    use_gpu = total.get("GPU", 0) > 0
    for problem in misfits(study, use_gpu, nodes):  # priced all the same, for a cluster that will hold them
        yield f"  a launch on {where} would be refused: {problem}"
    if not calibrate and not cluster and not use_gpu and (gpu_node := gpu_machine(study)):
        where, total, nodes, use_gpu = "one GPU (this machine has none)", gpu_node, [gpu_node], True
    stacking = decide(study, use_gpu)  # as the launch would: batch_seeds auto stacks where trials get a GPU
    if calibrate and not cluster and (note := busy_note()):
        yield note
    rates = None
    if not calibrate:
        rates, problem = stored_rates(study)
        if problem:
            yield problem
    calibration = Calibration(cluster)
    if rates is None and cluster:
        submit_calibrations(calibration, stacking, use_gpu, nodes)
    tally = Tally()
    for pair in study.pairs:
        line, stacking = pair_cost(stacking, pair, rates, calibration, use_gpu, nodes, tally)
        yield line
    yield summary_line(stacking, tally, where, total, use_gpu)


def gpu_machine(study: Study) -> dict[str, float] | None:
    """Where trials ask for GPUs this machine lacks: a machine to price them on, one GPU (or as
    many as a trial asks) with the CPUs beside it that its trials ask for; else None."""
    on_gpus = [p.resources for p in study.pairs if p.resources.gpu > 0]
    if not on_gpus:
        return None
    gpus = max(1.0, *(r.gpu for r in on_gpus))
    return {"CPU": max(math.ceil(r.cpu * gpus / r.gpu) for r in on_gpus), "GPU": gpus}


def stored_rates(study: Study) -> tuple[list[dict], str | None]:
    """The step rates of earlier trials in the study's store, and a line where it cannot be read."""
    try:
        return step_rates(study.tracking.uri), None
    except Exception as e:  # as a failed calibration: no estimate, no refusal
        return [], (
            f"  cannot read step rates from {redact(study.tracking.uri)}: "
            f"{redact_text(reason(e), study.tracking.uri)}"
        )


def submit_calibrations(
    calibration: Calibration, stacking: Stacking, use_gpu: bool, nodes: list[dict[str, float]]
) -> None:
    """Every measurement of the pairs a node of the cluster holds, submitted before any is awaited."""
    for pair in stacking.study.pairs:
        if holds(pair, use_gpu, nodes):
            device, size = (
                device_kind(pair, use_gpu and pair.resources.gpu > 0),
                launch_stack_size(stacking, pair, use_gpu),
            )
            calibration.submit(pair, device, seconds_per_step, stacking, pair)
            if size != 1:
                calibration.submit(pair, device, stack_curve, *curve_args(stacking, pair, size))


@dataclasses.dataclass
class Tally:
    """What cost_lines adds up over the pairs, for its last line."""

    steps: int = 0
    seconds: float = 0.0
    unestimated: int = 0
    unpriced_evaluations: int = 0
    shared_timed_alone: int = 0
    # resource -> seconds of trial time x the amount trials hold of it
    held_s: dict[str, float] = dataclasses.field(default_factory=dict)
    # each pair's trial time over the trials it runs at once (budget.max_concurrent)
    pair_walls: list[float] = dataclasses.field(default_factory=list)


def pair_cost(
    stacking: Stacking,
    pair: Pair,
    rates: list[dict] | None,
    calibration: Calibration,
    use_gpu: bool,
    nodes: list[dict[str, float]],
    tally: Tally,
) -> tuple[str, Stacking]:
    """The pair's line (counted into `tally`), and the stacking with its stack size where the
    launch would measure it."""
    study = stacking.study
    on_gpu = use_gpu and pair.resources.gpu > 0
    trials, steps = study.trial_count(pair) + study.confirm_count(), int(pair.base["n_iters"])
    tally.steps += trials * steps
    confirming = f" (with {study.confirm_count()} confirmation trials)" if study.confirm_count() else ""
    line = (
        f"  cost of {pair.name}: {trials} trials{confirming} x {steps:,} steps = {trials * steps:,} "
        "training steps"
    )
    per_step, words, stacking = pair_step_time(stacking, pair, rates, calibration, use_gpu, nodes)
    if per_step is None:
        tally.unestimated += 1
        return f"{line}; {words}", stacking
    evaluating, evaluated = evaluation_time(stacking, pair, per_step)
    if evaluating is None:
        tally.unpriced_evaluations += 1
    trial_s = steps * per_step + (evaluating or 0.0)
    tally.seconds += trials * trial_s
    tally.pair_walls.append(
        trials * trial_s / min(study.budget.max_concurrent, stacking.tune_trial_count(pair))
    )
    for name, amount in pair.resources.asks(use_gpu).items():
        tally.held_s[name] = tally.held_s.get(name, 0.0) + trials * trial_s * amount
    alone = ""
    if rates is None and device_kind(pair, on_gpu) == "cuda" and pair.resources.gpu <= 0.5:
        # Timed alone, they train beside others: four Transformer stacks of 5 on an H200 each ran
        # at 0.55 of their speed alone (docs/performance.md#gpu-stacks-sharing-a-gpu). Stored rates
        # come from trials as they shared, so they need no such word.
        alone = (
            " if its trials did not slow each other (timed alone; they share a GPU, "
            f"{pair.resources.gpu:g} each)"
        )
        tally.shared_timed_alone += 1
    return (
        f"{line}; {words}; {evaluated} -> at most {hours(trials * trial_s)} of trial time{alone}",
        stacking,
    )


def pair_step_time(
    stacking: Stacking,
    pair: Pair,
    rates: list[dict] | None,
    calibration: Calibration,
    use_gpu: bool,
    nodes: list[dict[str, float]],
) -> tuple[float | None, str, Stacking]:
    """(seconds per step of the pair's trials, or of a stack's member where they stack, or None;
    in words; the stacking with the size measured where budget.stack_size is auto): from the stored
    rates, else the cost model, where `rates` is given; else calibrated."""
    device = device_kind(pair, use_gpu and pair.resources.gpu > 0)
    size = launch_stack_size(stacking, pair, use_gpu)
    if rates is not None:
        # Stored rates are per run (a stacked run's share of its stack's): a stack's members cost that each.
        per_step, words = step_time(stacking, pair, rates, device)
        if per_step is None:
            per_step, words = modelled_step_time(stacking, pair, device, size or stacking.most_stacked(pair))
        return per_step, words, stacking
    if calibration.cluster and not holds(pair, use_gpu, nodes):
        # a task for it would wait for no node
        return None, "not timed: no node of the cluster holds its trials (above)", stacking
    per_step, words = step_time(stacking, pair, rates, device, calibration)
    if per_step is not None and size != 1:
        try:
            per_step, stacked, size = stacked_step_time(stacking, pair, size, device, calibration)
            if stacking.study.budget.stack_size == "auto":
                # as the launch records the knee: its trial count follows
                stacking = stacking.measured(pair, size)
        except Exception as e:  # as with step_time: no estimate, no refusal
            per_step, stacked = None, f"no stack estimate ({reason(e)})"
        words = f"{words}; {stacked}"
    return per_step, words, stacking


def summary_line(stacking: Stacking, tally: Tally, where: str, total: dict[str, float], use_gpu: bool) -> str:
    """The last line: the training steps in all and, where any pair has an estimate, the GPU- or
    core-hours and the wall time on `where`."""
    summary = f"  cost in all: {tally.steps:,} training steps"
    if not tally.seconds:
        return summary
    held_s = tally.held_s
    slots = slots_in(stacking, total, use_gpu)
    # Trials of several sizes (per_model resources) fill the cluster unevenly: no sooner than
    # the busiest resource allows either, nor than the longest pair at its own concurrency.
    wall = max(
        tally.seconds / slots,
        *(held_s[name] / total[name] for name in held_s if total.get(name)),
        *tally.pair_walls,
    )
    used = (
        f"{resource_hours(held_s['GPU'])} GPU-hours"
        if "GPU" in held_s
        else f"{resource_hours(held_s['CPU'])} CPU core-hours"
    )
    held = f"{total.get('CPU', 0):g} CPUs" + (f", {total['GPU']:g} GPUs" if use_gpu else "")
    left_out = (
        f"evaluations of {tally.unpriced_evaluations} pair(s) left out"
        if tally.unpriced_evaluations
        else "tests priced at every evaluation"
    )
    summary += (
        f" = {used}; on {where} ({held}, {slots} trial(s) at once) at most {hours(wall)}"
        f" ({left_out}{'; ASHA stops poor trials sooner' if stacking.study.uses_asha else ''})"
    )
    if tally.shared_timed_alone:
        summary += (
            f"; longer in fact: {tally.shared_timed_alone} pair(s) were timed alone though their trials "
            "share a GPU and slow each other"
        )
    if tally.unestimated:
        summary += f"; {tally.unestimated} pair(s) without an estimate left out"
    return summary
