"""ESBN's four relational tasks (Webb et al., 2020), as the Compositional Attention paper runs them
(Sec. 4.5, App. C.5) with Webb et al.'s protocol (taylorwwebb/emergent_symbols, `tasks/`, which the
authors' `emergent_symbols/` keeps): a sequence of object images, a multiple-choice answer.

  same_different     A B -> 0 when A = B, else 1 (trial types: same, different).
  rmts               a source pair, then two choice pairs; which choice shares the source's relation
                     (types: source same, source different). Four distinct objects in a "same"
                     trial (A A / B B / C D), five in a "different" one (A B / C D / E E).
  distribution_of_3  a row of three objects, a second row that permutes them with its last hidden,
                     then four candidates (the three and one other): which completes the row.
  identity_rules     a row of three following AAA, ABA or ABB, a second row of two, then four
                     candidates (the four objects of the trial): which completes the rule.

Hold-out m: of the n objects (100), m are kept for the test set and the others for training (m = 0:
both from all, with disjoint trials). Set sizes follow the authors' combinatorics: at most
`train_size` and `test_size` (10,000 each) of the distinct trials the objects allow, with trial
types balanced (a type with too few distinct trials repeats them at random), but for the training
sets of m >= 85, which the authors' scripts cut from the whole space of trials: there RMTS at m = 85
trains on 8.3% "same" trials (type_shares; the other cells come out balanced); at m = 0 when the two
sets together exceed the distinct trials, 95% and 5% of them. E.g. same_different at m = 95 trains
on 40 trials: the 25 distinct ones that 5 objects make, its 5 "same" pairs repeated to balance.

The objects are ours: 100 glyphs of three random strokes on 32 x 32 pixels, where Webb et al. draw
100 Unicode characters. The papers have no validation set (they test the final model): here
`iid_valid` is a sample of the training trials and `ood_valid` a second draw over the test objects,
which may share trials with the test set when those objects make few.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

import numpy as np

from ..kinds import IMAGE_SEQUENCE_CLASSIFICATION
from .base import Split, Task, cached, check_values

KIND = IMAGE_SEQUENCE_CLASSIFICATION  # the probe's and the registry's (tasks.TASKS)

PROBLEMS = ("same_different", "rmts", "distribution_of_3", "identity_rules")
OBJECT_SIZE = 32
STROKES = 3
# Per problem: the answer's classes, the trial types (balanced), the objects a trial needs.
CLASSES = {
    "same_different": ["same", "different"],
    "rmts": ["first pair", "second pair"],
    "distribution_of_3": [f"candidate {k + 1}" for k in range(4)],
    "identity_rules": [f"candidate {k + 1}" for k in range(4)],
}
TRIAL_TYPES = {
    "same_different": ("same", "different"),
    "rmts": ("same", "different"),
    "distribution_of_3": ("permutation",),
    "identity_rules": ("AAA", "ABA", "ABB"),
}
# The hold-outs whose training set the authors' scripts draw from the whole space of trials
# (`--train_gen_method full_space` at m = 85 and 95; `subsample`, balanced, at 0 and 50).
FULL_SPACE_FROM = 85
MIN_OBJECTS = {"same_different": 2, "rmts": 5, "distribution_of_3": 4, "identity_rules": 4}


@dataclass(frozen=True)
class ESBNConfig:
    problem: str = field(default="same_different", metadata={"choices": PROBLEMS})
    holdout: int = 0  # m: objects seen only in the test set
    n_objects: int = 100
    train_size: int = 10_000
    test_size: int = 10_000
    eval_size: int = 1_000  # per validation set
    seed: int = 0

    def __post_init__(self):
        check_values(self)

    def check(self) -> None:
        need = MIN_OBJECTS[self.problem]
        if self.holdout and not need <= self.holdout <= self.n_objects - need:
            raise ValueError(
                f"holdout: must be 0 or leave both sets at least {need} objects for {self.problem} "
                f"({need}..{self.n_objects - need} of {self.n_objects}), got {self.holdout}"
            )
        if self.n_objects < need:
            raise ValueError(f"n_objects: {self.problem} needs at least {need}, got {self.n_objects}")


def glyphs(n: int, seed: int = 12345) -> np.ndarray:
    """(n, 32, 32, 1) uint8: each object three strokes between distinct points of a 6 x 6 grid,
    3 pixels wide, drawn again when it differs from an earlier one in 60 pixels or fewer."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(4, OBJECT_SIZE - 5, 6)
    ys, xs = np.mgrid[:OBJECT_SIZE, :OBJECT_SIZE]
    out: list[np.ndarray] = []
    while len(out) < n:
        image = np.zeros((OBJECT_SIZE, OBJECT_SIZE), dtype=bool)
        for _ in range(STROKES):
            ends = rng.integers(0, 6, size=(2, 2))
            if (ends[0] == ends[1]).all():  # a dot, not a stroke
                ends[1] = (ends[1] + rng.integers(1, 6, size=2)) % 6
            (x0, y0), (x1, y1) = grid[ends]
            t = np.clip(
                ((xs - x0) * (x1 - x0) + (ys - y0) * (y1 - y0)) / max((x1 - x0) ** 2 + (y1 - y0) ** 2, 1e-9),
                0,
                1,
            )
            image |= np.hypot(xs - (x0 + t * (x1 - x0)), ys - (y0 + t * (y1 - y0))) <= 1.0
        if all((image != other).sum() > 60 for other in out):
            out.append(image)
    return (np.stack(out)[..., None] * 255).astype(np.uint8)


def distinct_trials(problem: str, trial_type: str, n: int) -> int:
    """How many distinct trials of a type n objects make (the authors' counts; distribution_of_3
    counts its two rows, its fourth candidate being one more random object)."""
    c = math.comb
    return {
        ("same_different", "same"): n,
        ("same_different", "different"): n * (n - 1),
        ("rmts", "same"): c(n, 4) * 48,
        ("rmts", "different"): c(n, 5) * 240,
        ("distribution_of_3", "permutation"): c(n, 3) * 36,
        ("identity_rules", "AAA"): c(n, 4) * 288,
        ("identity_rules", "ABA"): c(n, 4) * 576,
        ("identity_rules", "ABB"): c(n, 4) * 576,
    }[problem, trial_type]


def draw_trial(
    rng: np.random.Generator, problem: str, trial_type: str, objects: np.ndarray
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """One trial over `objects`: (its distinct part, the whole sequence of object ids, the answer)."""
    if problem == "same_different":
        a, b = rng.choice(objects, 2, replace=False)
        seq = (a, a) if trial_type == "same" else (a, b)
        return seq, seq, int(trial_type == "different")
    if problem == "rmts":
        o = rng.choice(objects, 5, replace=False)
        source, alike, unlike = (
            ((o[0], o[0]), (o[1], o[1]), (o[2], o[3]))
            if trial_type == "same"
            else ((o[0], o[1]), (o[2], o[3]), (o[4], o[4]))
        )
        answer = int(rng.integers(2))  # where the pair of the source's relation (`alike`) goes
        seq = source + ((alike + unlike) if answer == 0 else (unlike + alike))
        return seq, seq, answer
    if problem == "distribution_of_3":
        o = rng.choice(objects, 4, replace=False)
        rows = tuple(o[:3][rng.permutation(3)]) + tuple(o[:3][rng.permutation(3)])
        candidates = o[rng.permutation(4)]
        return rows, rows[:5] + tuple(candidates), int(np.flatnonzero(candidates == rows[5])[0])
    a1, b1, a2, b2 = rng.choice(objects, 4, replace=False)
    candidates = np.array([a1, b1, a2, b2])[rng.permutation(4)]
    rows, answer = {
        "AAA": ((a1, a1, a1, a2, a2), a2),
        "ABA": ((a1, b1, a1, a2, b2), a2),
        "ABB": ((a1, b1, b1, a2, b2), b2),
    }[trial_type]
    seq = rows + tuple(candidates)
    return seq, seq, int(np.flatnonzero(candidates == answer)[0])


def type_shares(problem: str, size: int, n_objects: int, full_space: bool) -> list[int]:
    """How many trials of each type a set of `size` holds: equal shares, but for a training set the
    authors draw from the whole space of trials (`full_space`, m = 85 and 95): every distinct trial
    of each type, a type with fewer than its equal share (identity rules: than the largest type)
    topped up by repeats, all shuffled and cut at `size`. So RMTS at m = 85, whose 15 objects make
    65,520 "same" and 720,720 "different" trials, trains on 8.3% "same" trials."""
    types = TRIAL_TYPES[problem]
    if not full_space:
        return [size // len(types) + (k < size % len(types)) for k in range(len(types))]
    distinct = [distinct_trials(problem, t, n_objects) for t in types]
    floor = max(distinct) if problem == "identity_rules" else size / len(types)
    pool = np.array([max(d, floor) for d in distinct], dtype=float)
    exact = size * pool / pool.sum()
    shares = np.floor(exact).astype(int)
    shares[np.argsort(shares - exact)[: size - shares.sum()]] += 1  # the largest remainders round up
    return shares.tolist()


def trial_set(
    rng: np.random.Generator, problem: str, objects: np.ndarray, sizes: list[int], full_space: bool = False
) -> list[Split]:
    """Sets of the given sizes over `objects`, disjoint in their trials: each trial type gets its
    share of each set (type_shares); its distinct trials (all of them where fewer than the shares
    ask) go to the sets in proportion, and a set with too few repeats its own at random."""
    types = TRIAL_TYPES[problem]
    rows: list[list[tuple]] = [[] for _ in sizes]
    per_set = [type_shares(problem, size, len(objects), full_space) for size in sizes]
    for k, trial_type in enumerate(types):
        shares = [shares_of_set[k] for shares_of_set in per_set]
        wanted = min(sum(shares), distinct_trials(problem, trial_type, len(objects)))
        seen: dict[tuple, tuple] = {}
        while len(seen) < wanted:
            key, seq, answer = draw_trial(rng, problem, trial_type, objects)
            seen.setdefault(tuple(int(i) for i in key), (seq, answer, k))
        pool = list(seen.values())
        cut = np.cumsum([0] + [math.ceil(len(pool) * share / sum(shares)) for share in shares])
        for s, share in enumerate(shares):
            own = pool[cut[s] : cut[s + 1]] or pool  # a set too small for a share of its own draws from all
            rows[s] += own[:share] + [
                own[i] for i in rng.integers(0, len(own), size=max(0, share - len(own)))
            ]
    splits = []
    for part in rows:
        order = rng.permutation(len(part))
        splits.append(
            Split(
                {
                    "image_ids": np.array([part[i][0] for i in order], dtype=np.int16).reshape(len(part), -1),
                    "labels": np.array([part[i][1] for i in order], dtype=np.int16),
                    "depths": np.array([part[i][2] for i in order], dtype=np.int16),
                }
            )
        )
    return splits


def set_sizes(config: ESBNConfig) -> tuple[int, int]:
    """The authors' training and test set sizes: capped by the distinct trials their objects make,
    counted as the largest type's times the number of types (the balanced total)."""

    def total(n: int) -> int:
        return max(distinct_trials(config.problem, t, n) for t in TRIAL_TYPES[config.problem]) * len(
            TRIAL_TYPES[config.problem]
        )

    if config.holdout == 0:
        everything = total(config.n_objects)
        if config.train_size + config.test_size > everything:
            return round(0.95 * everything), round(0.05 * everything)
        return config.train_size, config.test_size
    return min(config.train_size, total(config.n_objects - config.holdout)), min(
        config.test_size, total(config.holdout)
    )


def probe(config: ESBNConfig) -> Task:
    return Task(
        name="esbn",
        kind=KIND,
        splits={},
        classes=CLASSES[config.problem],
        n_features=1,
    )


def build(config: ESBNConfig) -> Task:
    rng = np.random.default_rng(config.seed)
    # Which objects are held out is the seed's draw, as the authors shuffle them per run.
    order = rng.permutation(config.n_objects)
    held_out, seen = (order[: config.holdout], order[config.holdout :]) if config.holdout else (order, order)
    train_size, test_size = set_sizes(config)
    if config.holdout:
        [train] = trial_set(
            rng, config.problem, seen, [train_size], full_space=config.holdout >= FULL_SPACE_FROM
        )
        test, ood_valid = trial_set(rng, config.problem, held_out, [test_size]) + trial_set(
            rng, config.problem, held_out, [config.eval_size]
        )
    else:
        train, test = trial_set(rng, config.problem, seen, [train_size, test_size])
        [ood_valid] = trial_set(rng, config.problem, held_out, [config.eval_size])
    images = glyphs(config.n_objects)
    iid_valid = Split({k: v[: config.eval_size] for k, v in train.arrays.items()})
    splits = {"train": train, "iid_valid": iid_valid, "ood_valid": ood_valid, "test": test}
    for split in splits.values():
        split.arrays["images"] = images
    return dataclasses.replace(probe(config), splits=splits)


def load(config: ESBNConfig) -> Task:
    return cached("esbn", config, functools.partial(build, config))
