"""What a launch checks of the cluster before anything of it is written: that some node holds each
trial, that every node sees the trial storage, whether torch on a GPU node finds CUDA, and, where
trials stack on a GPU, each pair's stack size measured on one.
"""

from __future__ import annotations

import socket

import ray
import torch

from ..plan.storage import TrialStorage, check_cluster_sees, last_line
from ..plan.study import Study
from .cluster import measurement, one_gpu
from .cost import calibration_config, stack_curve, stack_sizes_to_try
from .stacking import Stacking, knee, misfits


class ClusterMismatch(RuntimeError):
    """The launch asks for what the cluster cannot give; refused before anything is written."""


def check_fits(study: Study, use_gpu: bool) -> None:
    """A trial that no node can hold would wait for ever (Ray queues it silently), and one told to
    train on CUDA where the cluster has no GPU would fail at its first step: refused, with the key
    at fault, before anything of the launch is written."""
    problems = misfits(study, use_gpu, [node["Resources"] for node in ray.nodes() if node.get("Alive")])
    if problems:
        raise ClusterMismatch(problems[0])


CUDA_CHECK_S = 120  # a worker's start and torch's import take seconds; the task waits for a free GPU


def torch_cuda() -> dict:
    """What torch on this node makes of its GPU (a Ray task's body)."""
    return {
        "available": torch.cuda.is_available(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "node": socket.gethostname(),
    }


def without_cuda(seen: dict) -> str | None:
    """A warning where a GPU node's torch finds no CUDA: its trials would hold a GPU and train on the
    CPU (device auto), many times slower, with nothing but their runs' `device` tag to say so."""
    if seen["available"]:
        return None
    why = (
        "a CPU-only build"
        if seen["cuda"] is None
        else f"built for CUDA {seen['cuda']}; the driver or the GPU does not answer"
    )
    return (
        f"[launch] warning: on {seen['node']}, a node with GPUs, torch {seen['torch']} finds no CUDA "
        f"({why}): trials that "
        "hold a GPU there train on its CPU; install a CUDA build of torch on the GPU nodes"
    )


def check_cuda(study: Study) -> None:
    """Asks one GPU of the cluster, with a trial's CPUs, whether torch there finds CUDA (a few
    seconds) and says so where it does not; the launch goes on (a GPU declared to Ray, as tests
    do, is no error)."""
    if not any(p.resources.gpu > 0 for p in study.pairs):
        return
    cpus = min(p.resources.cpu for p in study.pairs if p.resources.gpu > 0)
    asked = measurement(torch_cuda, num_cpus=cpus, num_gpus=one_gpu()).remote()
    try:  # a GPU that other work holds for minutes is no reason to wait for the answer
        seen = ray.get(asked, timeout=CUDA_CHECK_S)
    except Exception as e:  # a check that cannot be made is no reason to refuse the launch
        ray.cancel(asked)
        print(
            f"[launch] could not ask a GPU node whether torch there finds CUDA: {last_line(e)[:200]}",
            flush=True,
        )
        return
    if warning := without_cuda(seen):
        print(warning, flush=True)


def measure_stack_sizes(stacking: Stacking) -> dict[str, int]:
    """budget.stack_size auto, where trials get a GPU: for each pair whose trials would stack on one, the
    knee of its throughput curve (stacking.knee), measured on a whole GPU of the cluster
    with a trial's CPUs, on a small copy of the pair's task (cost.calibration_config). A whole one
    even where trials share a GPU: curves timed side by side on one GPU timed each other (four pairs
    at a quarter of an H100 each: one curve gave 234.4 member-steps/s at 4 members, 156.0 at 5)."""

    most = {
        p.name: stacking.most_stacked(p)
        for p in stacking.study.pairs
        if stacking.measures_stack_size(p, use_gpu=True)
    }
    pairs = [p for p in stacking.study.pairs if p.name in most]
    if not pairs:
        return {}
    gpu = one_gpu()
    pending = [
        measurement(
            stack_curve,
            num_cpus=p.resources.cpu,
            num_gpus=max(p.resources.gpu, gpu),
            resources=p.resources.custom or None,
        ).remote(calibration_config(stacking, p, stacked=True), stack_sizes_to_try(most[p.name]))
        for p in pairs
    ]
    sizes = {}
    for pair, job in zip(pairs, pending):
        try:
            curve, why = ray.get(job), "not even one member fits the device"
        except Exception as e:  # a measurement that failed is no reason to refuse the launch
            curve, why = [], last_line(e)[:200]
        if not curve:  # the trials train one run each; where that fails too, the trial says why
            sizes[pair.name] = 1
            print(
                f"[launch] stack size of {pair.name}: 1, its throughput could not be measured ({why})",
                flush=True,
            )
            continue
        sizes[pair.name] = knee(curve, members=most[pair.name])
        shown = ", ".join(f"{n}: {rate:.1f}" for n, rate in curve)
        print(
            f"[launch] stack size of {pair.name}: {sizes[pair.name]}, where the member-steps/s of its "
            f"{most[pair.name]} members (a stack of "
            f"the rest included) level off ({shown})",
            flush=True,
        )
    return sizes


def check_storage(storage: TrialStorage, key: str) -> None:
    """On a cluster of several nodes, every node must see the trial storage: checked by reading a
    marker back on each node, before anything of the launch is written."""
    n_nodes = check_cluster_sees(storage, key)
    if n_nodes > 1:
        print(f"[launch] trial storage {storage.uri}: seen by all {n_nodes} nodes", flush=True)
