"""Contextual retrieval (Mittal et al., Compositional Attention, Sec. 4.1, App. C.1): set regression.

Each of N objects has S search features z, R retrieval features z~ (all ~ N(0, 1)) and, per search s,
a one-hot retrieval preference r_s over R. Search s of object i finds the closest other object on
feature s, j_s = argmin_{j != i} |z_s^i - z_s^j|, and retrieves that object's retrieval feature chosen
by r_s^i; the target is y_i = sum_s alpha_s v_s^i (Eq. 15). The alphas were drawn once from U(-1, 1)
by the authors, whose code fixes them as constants (ALPHAS); we use the same ones, so that the
targets have the paper's scale (predicting zero: L1 0.742 for S = 2, 1.039 for S = 4).

OoD (the default): an object's preferences (r_1, ..., r_S) form one of R^S value combinations; the
authors' code lists them in lexicographic order, trains on the even-indexed ones topped up to 80%
with the first odd-indexed ones, and tests on the remaining 20% (for S = 2, R = 4 Table 5's (2,1),
(2,3), (3,1), (3,3); for S = 4, R = 8, 820 of 4096). `in_distribution: true` trains and tests on all
combinations (Table 6's in-distribution column).

The authors train on a fresh batch every step (`online`, the default) and report the final model,
with no validation set. Our `ood_valid` split is drawn from the test combinations by default (the
authors' curve); `validation_combinations: k` instead moves k training combinations into a
validation set disjoint from the test one, so that checkpoints and hyperparameters can be selected
without seeing a test combination.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass

import numpy as np

from ..kinds import SET_REGRESSION
from .base import Split, Task, cached, check_values

KIND = SET_REGRESSION  # the probe's and the registry's (tasks.TASKS)

# The authors' alpha_s (drawn from U(-1, 1) once), in search order; S searches use the first S.
ALPHAS = (-0.71347752, -0.6062312, 0.66062073, -0.61213017, -0.82631877, 0.75908621, -0.36274866, 0.84383333)
TRAIN_FRACTION = 0.8


@dataclass(frozen=True)
class RetrievalConfig:
    seed: int = 0
    searches: int = 2  # S
    retrievals: int = 4  # R
    n_objects: int = 10  # N
    online: bool = True  # a fresh training batch every step (the authors' protocol)
    train_size: int = 20_000  # the fixed training set, when not online
    eval_size: int = 5000  # sets per validation/test split
    in_distribution: bool = False  # train and test on every combination
    # training combinations moved to a validation set disjoint from the test one
    validation_combinations: int = 0

    def __post_init__(self):
        check_values(self)

    def check(self) -> None:
        if self.searches > len(ALPHAS):
            raise ValueError(
                f"searches: at most {len(ALPHAS)} (the authors' fixed alphas), got {self.searches}"
            )
        if self.n_objects < 2:
            raise ValueError(f"n_objects: a search needs another object, got {self.n_objects}")
        training = int(TRAIN_FRACTION * self.retrievals**self.searches)
        if self.validation_combinations and self.validation_combinations >= training:
            raise ValueError(
                f"validation_combinations: must leave training some of its {training} combinations, "
                f"got {self.validation_combinations}"
            )


def combinations(config: RetrievalConfig) -> list[tuple[int, ...]]:
    return list(itertools.product(range(config.retrievals), repeat=config.searches))


def held_out_combinations(config: RetrievalConfig) -> list[tuple[int, ...]]:
    """The authors' held-out 20%: the last odd-indexed combinations."""
    every = combinations(config)
    odd = every[1::2]
    return odd[len(odd) - (len(every) - int(TRAIN_FRACTION * len(every))) :]


@functools.lru_cache(maxsize=8)
def split_combinations(config: RetrievalConfig) -> dict[str, list[tuple[int, ...]]]:
    """Combinations per split: train (and iid_valid), ood_valid and test."""
    every = combinations(config)
    if config.in_distribution:
        return {"train": every, "ood_valid": every, "test": every}
    test = held_out_combinations(config)
    held_out = set(test)
    train = [c for c in every if c not in held_out]
    if not config.validation_combinations:
        return {"train": train, "ood_valid": test, "test": test}
    rng = np.random.default_rng([config.seed, 1])
    for _ in range(1000):
        chosen = [train[k] for k in rng.choice(len(train), config.validation_combinations, replace=False)]
        taken = set(chosen)
        kept = [c for c in train if c not in taken]
        # Every single value of every search stays in training, as in the authors' split.
        if all({c[s] for c in kept} == set(range(config.retrievals)) for s in range(config.searches)):
            return {"train": kept, "ood_valid": chosen, "test": test}
    raise ValueError(
        f"validation_combinations: cannot take {config.validation_combinations} of {len(train)} "
        "training combinations and keep every value in training"
    )


def alphas(config: RetrievalConfig) -> np.ndarray:
    return np.asarray(ALPHAS[: config.searches], dtype=np.float64)


def targets_of(z: np.ndarray, z_tilde: np.ndarray, prefs: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """z (B, N, S), z~ (B, N, R), prefs (B, N, S) ints, alpha (S,) -> y (B, N)."""
    dist = np.abs(z[:, :, None, :] - z[:, None, :, :])  # (B, i, j, S)
    n = z.shape[1]
    dist[:, np.arange(n), np.arange(n), :] = np.inf
    winner = dist.argmin(axis=2)  # (B, N, S): j_s^i
    batch = np.arange(z.shape[0])[:, None, None]
    values = z_tilde[batch, winner, prefs]  # (B, N, S): z~ of the winner, at the preferred retrieval
    return (values * alpha).sum(-1)


def make_split(
    config: RetrievalConfig, rng: np.random.Generator, combos: list, size: int, ood: bool
) -> Split:
    S, R, N = config.searches, config.retrievals, config.n_objects
    z = rng.standard_normal((size, N, S)).astype(np.float32)
    z_tilde = rng.standard_normal((size, N, R)).astype(np.float32)
    prefs = np.asarray(combos)[rng.integers(len(combos), size=(size, N))]  # (size, N, S)
    one_hot = np.eye(R, dtype=np.float32)[prefs].reshape(size, N, S * R)
    return Split(
        {
            "features": np.concatenate([z, z_tilde, one_hot], axis=-1),
            "targets": targets_of(z, z_tilde, prefs, alphas(config)).astype(np.float32),
            "depths": np.full(size, int(ood), dtype=np.int16),  # 1: held-out combinations
        }
    )


def probe(config: RetrievalConfig) -> Task:
    """The task without its data: what a model is built from."""
    n_features = config.searches + config.retrievals + config.searches * config.retrievals
    return Task(name="contextual_retrieval", kind=KIND, splits={}, n_features=n_features)


def build(config: RetrievalConfig) -> Task:
    rng = np.random.default_rng(config.seed)
    combos = split_combinations(config)
    ood = not config.in_distribution
    splits = (
        {}
        if config.online
        else {"train": make_split(config, rng, combos["train"], config.train_size, ood=False)}
    )
    splits.update(
        {
            "iid_valid": make_split(config, rng, combos["train"], config.eval_size, ood=False),
            "ood_valid": make_split(config, rng, combos["ood_valid"], config.eval_size, ood=ood),
            "test": make_split(config, rng, combos["test"], config.eval_size, ood=ood),
        }
    )
    return dataclasses.replace(probe(config), splits=splits)


def draw_batch(config: RetrievalConfig, rng: np.random.Generator, size: int) -> Split:
    return make_split(config, rng, split_combinations(config)["train"], size, ood=False)


def load(config: RetrievalConfig) -> Task:
    task = cached("contextual_retrieval", config, functools.partial(build, config))
    if config.online:
        task.draw_train = functools.partial(draw_batch, config)
    return task
