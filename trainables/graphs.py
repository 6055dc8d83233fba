"""A whole training step as one CUDA graph replay (issue 21, item 1).

On a GPU the small models' steps are launch-bound: thousands of small kernels, each queued by the
host, leave the device idle most of the step. Captured once as a CUDA graph, the step (forward,
loss, backward, clipping, the optimizer's update and the on-device score sums) is one launch.

A graph replays fixed shapes at fixed addresses, so:
- each batch is padded to one of a few fixed widths (`bucket_widths`: a graph per width), with the
  pad token the models already mask, so every sample's result is unchanged (the models that allow
  this are trainables.batched's: the same property lets members share a padded stack);
- each batch is copied into the captured step's own input tensors before the replay;
- the optimizer is made capturable (its step count on the device);
- dropout draws fresh masks every replay (CUDA's generator is graph-safe: each replay advances it).

A capture needs a few warm-up steps first (on a side stream); they would train the model, so the
weights and the optimizer's state are saved before and copied back in place after (the captured
graphs read those very tensors). `eager_replay` runs the same machinery with the step called
instead of replayed: that is how the CPU tests check everything but the capture itself.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch

from .models import batchable

WARMUP_STEPS = 3  # what torch's CUDA-graph docs warm a capture with (cuBLAS and the allocator settle)
N_BUCKETS = 4
MOST_GRAPHS = 16  # shapes past these (a task whose every batch has a width of its own) step eagerly


def graphs_unused_because(cfg, device: torch.device, stacked: bool = False) -> str | None:
    """Why `cfg` trains eagerly (one launch per kernel), or None where its step is graphed.
    `stacked`: the step of a stack (batched.Stack), whose compiled kernels keep the graph: on an
    H200 a compiled stack, captured, trained as the eager one and drew fresh dropout masks each
    replay (tests/test_graphs.py, 2026-11-27). Without the graph a compiled stack of 5 paper NDRs
    kept the GPU 41% busy (the host launching its kernels;
    docs/performance.md#gpu-how-busy-the-gpu-is)."""
    cfg = cfg.settled(device.type)  # as a single trial; a stack passes its own, settled for its members
    if cfg.cuda_graphs is False:
        return "cuda_graphs: false"
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, not {device.type}"
    if cfg.compile_mode in ("reduce-overhead", "max-autotune"):
        return f"compile: {cfg.compile_mode} captures CUDA graphs of its own"
    if cfg.compile and not stacked:
        return (
            f"compile: {cfg.compile_mode} on a single trial: its compiled kernels under a capture are "
            "checked on a GPU for stacks only (a single paper NDR's compile did not finish in 150 s there)"
        )
    if cfg.lr_schedule != "constant":
        return (
            f"lr_schedule: {cfg.lr_schedule} sets the learning rate every step; "
            "a graph replays the one it captured"
        )
    return batchable({**cfg.flat(), "model": cfg.model})


def bucket_widths(longest: int, n: int = N_BUCKETS) -> list[int]:
    """`n` widths up to `longest` in equal steps: a batch is padded to the first that holds it."""
    step = math.ceil(longest / n)
    return sorted({min(step * k, longest) for k in range(1, n + 1)})


def pick_width(width: int, widths: list[int]) -> int:
    return next((w for w in widths if w >= width), width)


def restore_in_place(
    weights: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer, saved: tuple[dict, dict]
) -> None:
    """Weights and optimizer state back to `saved`, written into the tensors that are there (a
    captured graph holds their addresses; load_state_dict would put new tensors in their place)."""
    saved_weights, state = saved
    with torch.no_grad():
        for name, tensor in weights.items():
            tensor.copy_(saved_weights[name])
        for p, entry in optimizer.state.items():
            for key, value in entry.items():
                if torch.is_tensor(value):
                    value.copy_(state[p][key]) if p in state else value.zero_()


def module_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


class GraphedStep:
    """`step(batch)` -> what `run(batch)` returns (tensors), from a replay of its capture for the
    batch's shapes. `run` trains one step of `weights` (every tensor it updates but the optimizer's
    state): it must leave nothing but tensors behind and read no value on the host.
    `eager_replay`: call `run` on the static inputs instead of replaying (CPU). The graphs of every
    width share one memory pool, so a step's outputs (and the gradients) hold until the next step
    only: callers read them at once, as train and batched.Stack add them to their sums."""

    def __init__(
        self,
        run: Callable[[dict], tuple],
        weights: dict[str, torch.Tensor],
        optimizer: torch.optim.Optimizer,
        eager_replay: bool = False,
    ):
        self.run, self.weights, self.optimizer, self.eager_replay = run, weights, optimizer, eager_replay
        self.captured: dict[tuple, tuple] = {}  # shapes -> (static inputs, graph or None, static outputs)
        self.pool = None  # one memory pool for every graph: they never run at once

    def __call__(self, batch: dict[str, torch.Tensor]):
        key = tuple((name, tuple(t.shape), t.dtype) for name, t in batch.items())
        if key not in self.captured:
            if len(self.captured) >= MOST_GRAPHS:
                return self.run(batch)
            self.captured[key] = self.capture(batch)
        inputs, graph, outputs = self.captured[key]
        for name, tensor in batch.items():
            inputs[name].copy_(tensor)
        if graph is None:
            return self.run(inputs)
        graph.replay()
        return outputs

    def capture(self, batch: dict[str, torch.Tensor]) -> tuple:
        inputs = {name: t.clone() for name, t in batch.items()}
        # The optimizer's state is keyed by the parameters themselves: copy the values only.
        saved = (
            copy.deepcopy(self.weights),
            {p: copy.deepcopy(entry) for p, entry in self.optimizer.state.items()},
        )
        # The warm-up's random draws are undone as its updates are: a run resumed from a checkpoint
        # captures its widths at other steps than the run it resumes, and must draw as that run did.
        if self.eager_replay:
            with torch.random.fork_rng(devices=[]):
                for _ in range(WARMUP_STEPS):
                    self.run(inputs)
            restore_in_place(self.weights, self.optimizer, saved)
            return inputs, None, None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.random.fork_rng(devices=[torch.cuda.current_device()]):
            for _ in range(WARMUP_STEPS):
                self.run(inputs)
        torch.cuda.current_stream().wait_stream(side)
        restore_in_place(self.weights, self.optimizer, saved)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = self.run(inputs)
        self.pool = graph.pool()
        return inputs, graph, outputs
