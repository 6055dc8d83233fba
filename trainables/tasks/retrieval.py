"""Contextual retrieval (Mittal et al., Compositional Attention, Sec. 4.1, App. C.1): set regression.

Each of N objects has S search features z, R retrieval features z~ (all ~ N(0, 1)) and, per search s,
a one-hot retrieval preference r_s over R. Search s of object i finds the closest other object on
feature s, j_s = argmin_{j != i} |z_s^i - z_s^j|, and retrieves that object's retrieval feature chosen
by r_s^i; the target is y_i = sum_s alpha_s v_s^i with fixed alpha_s ~ U(-1, 1). Training uses L1.

OoD: an object's preferences (r_1, ..., r_S) form one of R^S value combinations; some combinations
appear only in the OoD validation and test sets. For S=2, R=4 the held-out ones are Table 5's:
(2,1), (2,3), (3,1), (3,3); otherwise a seeded quarter of the combinations, chosen so that every
single value of every search still occurs in training.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from .base import Split, Task, cached

TABLE_5_HELD_OUT = ((2, 1), (2, 3), (3, 1), (3, 3))


@dataclass(frozen=True)
class RetrievalConfig:
    seed: int = 0
    searches: int = 2  # S
    retrievals: int = 4  # R
    n_objects: int = 10  # N
    train_size: int = 20_000
    eval_size: int = 1000
    held_out_fraction: float = 0.25


def held_out_combinations(config: RetrievalConfig, rng: np.random.Generator) -> list[tuple[int, ...]]:
    if (config.searches, config.retrievals) == (2, 4):
        return list(TABLE_5_HELD_OUT)
    combos = list(itertools.product(range(config.retrievals), repeat=config.searches))
    n_out = max(1, int(round(config.held_out_fraction * len(combos))))
    for _ in range(1000):
        chosen = [combos[k] for k in rng.choice(len(combos), n_out, replace=False)]
        kept = [c for c in combos if c not in chosen]
        if all({c[s] for c in kept} == set(range(config.retrievals)) for s in range(config.searches)):
            return chosen
    raise ValueError(f"cannot hold out {n_out} of {len(combos)} combinations and keep every value in training")


def targets_of(z: np.ndarray, z_tilde: np.ndarray, prefs: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """z (B, N, S), z~ (B, N, R), prefs (B, N, S) ints, alpha (S,) -> y (B, N)."""
    dist = np.abs(z[:, :, None, :] - z[:, None, :, :])  # (B, i, j, S)
    n = z.shape[1]
    dist[:, np.arange(n), np.arange(n), :] = np.inf
    winner = dist.argmin(axis=2)  # (B, N, S): j_s^i
    batch = np.arange(z.shape[0])[:, None, None]
    values = z_tilde[batch, winner, prefs]  # (B, N, S): z~ of the winner, at the preferred retrieval
    return (values * alpha).sum(-1)


def make_split(config: RetrievalConfig, rng: np.random.Generator, alpha: np.ndarray, combos: list, size: int, ood: bool) -> Split:
    S, R, N = config.searches, config.retrievals, config.n_objects
    z = rng.standard_normal((size, N, S)).astype(np.float32)
    z_tilde = rng.standard_normal((size, N, R)).astype(np.float32)
    prefs = np.asarray(combos)[rng.integers(len(combos), size=(size, N))]  # (size, N, S)
    one_hot = np.eye(R, dtype=np.float32)[prefs].reshape(size, N, S * R)
    return Split({
        "features": np.concatenate([z, z_tilde, one_hot], axis=-1),
        "targets": targets_of(z, z_tilde, prefs, alpha).astype(np.float32),
        "depths": np.full(size, int(ood), dtype=np.int16),  # 1: held-out combinations
    })


def build(config: RetrievalConfig) -> Task:
    rng = np.random.default_rng(config.seed)
    alpha = rng.uniform(-1, 1, size=config.searches)
    held_out = held_out_combinations(config, rng)
    seen = [c for c in itertools.product(range(config.retrievals), repeat=config.searches) if c not in held_out]
    splits = {
        "train": make_split(config, rng, alpha, seen, config.train_size, ood=False),
        "iid_valid": make_split(config, rng, alpha, seen, config.eval_size, ood=False),
        "ood_valid": make_split(config, rng, alpha, held_out, config.eval_size, ood=True),
        "test": make_split(config, rng, alpha, held_out, config.eval_size, ood=True),
    }
    n_features = config.searches + config.retrievals + config.searches * config.retrievals
    return Task(name="contextual_retrieval", kind="set_regression", splits=splits, n_features=n_features)


def load(config: RetrievalConfig) -> Task:
    return cached("contextual_retrieval", config, functools.partial(build, config))


def alpha_of(config: RetrievalConfig) -> np.ndarray:
    """The task's fixed search weights (the first draw of its generator), for independent checks."""
    return np.random.default_rng(config.seed).uniform(-1, 1, size=config.searches)
