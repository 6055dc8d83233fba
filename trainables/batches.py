"""A split's rows as tensors on the device, and the training batches' order: uniform draws, the
authors' length buckets, or a fresh batch every step for tasks that generate online."""

from __future__ import annotations

import numpy as np
import torch

from .config import ConfigError, TrainConfig
from .graphs import bucket_widths, pick_width
from .tasks.base import HOST_ONLY, Split, Task


def resident(split: Split, device: torch.device) -> dict[str, torch.Tensor]:
    """The split's arrays on `device`, in their stored (narrow) dtypes, made once per split and
    device: every later batch is gathered where the model runs, with no copy of data from the host.
    On the CPU they share the arrays' memory."""
    cache = split.__dict__.setdefault("_resident", {})
    if device not in cache:
        cache[device] = {
            name: torch.from_numpy(array).to(device)
            for name, array in split.arrays.items()
            if name not in HOST_ONLY
        }
    return cache[device]


def batch_tensors(
    split: Split, index: np.ndarray, device: torch.device, bucketed: bool = False
) -> dict[str, torch.Tensor]:
    """The arrays of `split` at `index` as tensors on `device` (int64 or float32), token rows
    trimmed to the batch's longest, or with `bucketed` padded up to the first of a few fixed widths
    that holds it (graphs.bucket_widths: a CUDA graph replays fixed shapes; the pad is the pad
    token the models mask). The width comes from the host's copy of the lengths, so nothing waits
    for the device. Images (one per several questions) are gathered through the questions'
    `image_ids` and stay uint8, a quarter of float32's traffic: the model scales them."""
    widths = {"tokens": "lengths", "token_features": "lengths", "targets": "target_lengths"}
    rows = torch.from_numpy(np.asarray(index, dtype=np.int64)).to(device, non_blocking=True)
    arrays = resident(split, device)
    out = {}
    for name, tensor in arrays.items():
        if name == "images":
            continue
        batch = tensor[rows]
        if name in widths and widths[name] in split.arrays:
            width = int(split.arrays[widths[name]][index].max())
            batch = batch[:, : pick_width(width, bucket_widths(tensor.shape[1])) if bucketed else width]
        out[name] = batch.float() if batch.is_floating_point() else batch.long()
    if "images" in arrays:
        out["images"] = arrays["images"][out["image_ids"]]
    return out


class LengthBuckets:
    """The authors' length-bucketed batches: each pass over the data shuffles it, drops the remainder
    of a batch, stable-sorts by input length, cuts consecutive batches and serves them in random
    order. Batches need little padding, and short ones run fast. Resumable from `state()`."""

    def __init__(self, lengths: np.ndarray, batch_size: int, rng: np.random.Generator):
        self.lengths, self.batch_size, self.rng = lengths, batch_size, rng
        self.epoch_start, self.batches, self.position = None, [], 0

    def new_epoch(self) -> None:
        self.epoch_start = self.rng.bit_generator.state
        order = self.rng.permutation(len(self.lengths))
        width = min(self.batch_size, len(order))
        order = order[: len(order) - len(order) % width]
        order = order[np.argsort(self.lengths[order], kind="stable")]
        batches = order.reshape(-1, width)
        self.batches, self.position = batches[self.rng.permutation(len(batches))], 0

    def __call__(self) -> np.ndarray:
        if self.position >= len(self.batches):
            self.new_epoch()
        self.position += 1
        return self.batches[self.position - 1]

    def state(self) -> dict:
        return {"epoch_start": self.epoch_start, "position": self.position}

    def restore(self, state: dict) -> None:
        if state["epoch_start"] is not None:
            self.rng.bit_generator.state = state["epoch_start"]
            self.new_epoch()
            self.position = state["position"]


def batch_source(cfg: TrainConfig, task: Task, rng: np.random.Generator):
    """-> (next batch's Split and row indices, bucket sampler or None). Online tasks draw a fresh
    batch from `rng`, so the data follow the training seed and resume with the rng's state."""
    if task.draw_train is not None:
        if cfg.length_bucketed:
            raise ConfigError(
                f"length_bucketed: task {cfg.task!r} draws a fresh batch every step (task_options.online); "
                "there is no training set to bucket"
            )
        whole = np.arange(cfg.batch_size)
        return (lambda: (task.draw_train(rng, cfg.batch_size), whole)), None
    split = task.splits["train"]
    if cfg.length_bucketed:
        if "lengths" not in split.arrays:
            raise ConfigError(f"length_bucketed: task {cfg.task!r} has no input lengths to bucket by")
        buckets = LengthBuckets(split.lengths, cfg.batch_size, rng)
        return (lambda: (split, buckets())), buckets
    return (lambda: (split, rng.integers(len(split), size=cfg.batch_size))), None
