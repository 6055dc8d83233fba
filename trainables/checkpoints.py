"""A run's resumable checkpoint: what `snapshot` keeps at an evaluation (weights, optimizer state,
torch's generators, each member's batch generator, length buckets and selection), and `resume`
puts back."""

from __future__ import annotations

import copy

import torch

from .evaluation import Selection
from .learners import Learner


def random_states(device: torch.device) -> dict:
    """What a checkpoint keeps of torch's generators: the CPU's, and on CUDA the device's, which
    dropout there draws from (without it a resumed trial drew its first steps' masks again)."""
    return {
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def restore_random_states(saved: dict, device: torch.device) -> None:
    """`saved`'s generators; a checkpoint from another kind of device (or from before the CUDA one
    was kept) leaves the device's as the trial's seed set it."""
    torch.set_rng_state(saved["torch_rng"])
    if device.type == "cuda" and saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(saved["cuda_rng"], device)


def snapshot(learner: Learner, selections: list[Selection], iteration: int) -> dict:
    """A resumable checkpoint of the run at `iteration` (resume reads it)."""
    members = [
        {
            "batch_rng": rng.bit_generator.state,
            **selection.state(),
            "buckets": buckets.state() if buckets else None,
        }
        for rng, buckets, selection in zip(learner.rngs, learner.buckets, selections)
    ]
    common = {**learner.weights(), "iteration": iteration, **random_states(learner.device)}
    # Deep copy: state_dict() holds live tensors that the next optimizer step overwrites.
    return copy.deepcopy(learner.pack(common, members))


def resume(learner: Learner, selections: list[Selection], saved: dict) -> int:
    """`learner` and `selections` as `saved` left them; -> the iteration it was taken at."""
    learner.load_weights(saved)
    restore_random_states(saved, learner.device)
    for rng, buckets, selection, member in zip(
        learner.rngs, learner.buckets, selections, learner.unpack(saved)
    ):
        rng.bit_generator.state = member["batch_rng"]
        selection.restore(member)
        if buckets:
            buckets.restore(member["buckets"])
    return saved["iteration"]
