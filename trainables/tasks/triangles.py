"""Equilateral triangle detection (Ahmad & Omohundro, 2009), as the Compositional Attention paper
runs it (Sec. 4.3, App. C.3) with the authors' generator (sarthmit/Compositional-Attention,
`Equilateral-Detection/dataset.py`), rendered by our numpy code.

A 64 x 64 one-channel image holds three clusters of 8 points; the label says whether the clusters'
centres form an equilateral triangle. Per image a fair coin picks the class:
  equilateral: two centres uniform on the integer grid [1, 63]^2, the third the second rotated by
      60 degrees about the first, truncated to integers (drawn again if it leaves [1, 63]^2);
  other: three centres uniform on [1, 63]^2 (nothing keeps them from being nearly equilateral).
A cluster is 4 points, each an integer offset of at most 1 from the centre per coordinate, with
their mirror images through the centre; each point is a filled disc of radius 2 at 255 (the
authors draw it with OpenCV, whose raster of a radius-2 disc is the same 13 pixels).

The authors draw fresh images at every access (50,000 per training epoch, 10,000 per test); here
training batches are fresh every step (`online`, from the training seed) and the validation and
test sets are fixed draws of `eval_size`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from ..kinds import IMAGE_CLASSIFICATION
from .base import Split, Task, cached, check_values

KIND = IMAGE_CLASSIFICATION  # the probe's and the registry's (tasks.TASKS)

IMAGE_SIZE = 64
CLUSTER_RADIUS = 1
POINT_RADIUS = 2
PAIRS_PER_CLUSTER = 4
CLASSES = ["equilateral", "other"]  # the authors' labels 0 and 1
# The pixel offsets of a filled disc: dx^2 + dy^2 <= r^2 (13 pixels at r = 2).
DISC = np.array(
    [
        (dx, dy)
        for dx in range(-POINT_RADIUS, POINT_RADIUS + 1)
        for dy in range(-POINT_RADIUS, POINT_RADIUS + 1)
        if dx * dx + dy * dy <= POINT_RADIUS**2
    ]
)


@dataclass(frozen=True)
class TrianglesConfig:
    seed: int = 0
    eval_size: int = 10_000  # per validation and test set
    online: bool = True  # a fresh training batch every step; false: a fixed set of train_size
    train_size: int = 50_000

    def __post_init__(self):
        check_values(self)


def third_vertex(p1: np.ndarray, p2: np.ndarray) -> np.ndarray:
    """The authors' get_point: p2 rotated by 60 degrees about p1 (image axes), truncated toward zero."""
    d = p2 - p1
    c, s = math.cos(math.pi / 3), math.sin(math.pi / 3)
    return np.trunc(
        np.stack([p1[:, 0] + c * d[:, 0] + s * d[:, 1], p1[:, 1] - s * d[:, 0] + c * d[:, 1]], 1)
    ).astype(np.int64)


def draw_centres(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, 3, 2) integer centres (x, y) and (n,) labels (0: equilateral)."""
    low, high = CLUSTER_RADIUS, IMAGE_SIZE - CLUSTER_RADIUS
    labels = rng.integers(0, 2, size=n)
    centres = rng.integers(low, high + 1, size=(n, 3, 2))
    todo = np.flatnonzero(labels == 0)
    while len(todo):
        p1, p2 = rng.integers(low, high + 1, size=(2, len(todo), 2))
        p3 = third_vertex(p1, p2)
        inside = ((p3 >= low) & (p3 <= high)).all(1)
        centres[todo[inside]] = np.stack([p1, p2, p3], 1)[inside]
        todo = todo[~inside]
    return centres, labels


def render(rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    """(n, 3, 2) centres -> (n, 64, 64, 1) uint8 images of their point clusters."""
    n = len(centres)
    offsets = rng.integers(-CLUSTER_RADIUS, CLUSTER_RADIUS + 1, size=(n, 3, PAIRS_PER_CLUSTER, 2))
    points = np.concatenate([centres[:, :, None] + offsets, centres[:, :, None] - offsets], 2).reshape(
        n, -1, 2
    )
    pixels = (points[:, :, None] + DISC[None, None]).reshape(n, -1, 2)  # (n, points x disc, 2): x, y
    keep = ((pixels >= 0) & (pixels < IMAGE_SIZE)).all(-1)
    images = np.zeros((n, IMAGE_SIZE, IMAGE_SIZE, 1), dtype=np.uint8)
    rows = np.broadcast_to(np.arange(n)[:, None], keep.shape)
    images[rows[keep], pixels[..., 1][keep], pixels[..., 0][keep]] = 255
    return images


def make_split(rng: np.random.Generator, n: int) -> Split:
    centres, labels = draw_centres(rng, n)
    return Split(
        {
            "images": render(rng, centres),
            "image_ids": np.arange(n, dtype=np.int64),
            "labels": labels.astype(np.int16),
            "centres": centres.astype(np.int16),
            "depths": np.ones(n, dtype=np.int16),
        }
    )


def probe(config: TrianglesConfig) -> Task:
    return Task(name="triangles", kind=KIND, splits={}, classes=CLASSES, n_features=1)


def build(config: TrianglesConfig) -> Task:
    rng = np.random.default_rng(config.seed)
    validation = make_split(rng, config.eval_size)
    splits = {"iid_valid": validation, "ood_valid": validation, "test": make_split(rng, config.eval_size)}
    if not config.online:
        splits["train"] = make_split(rng, config.train_size)
    return dataclasses.replace(probe(config), splits=splits)


def load(config: TrianglesConfig) -> Task:
    task = cached("triangles", config, functools.partial(build, config))
    if config.online:
        task.draw_train = make_split
    return task
