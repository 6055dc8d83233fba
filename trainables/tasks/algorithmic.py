"""PANM's algorithmic tasks (Le et al., Sec. 3.1, App. D.1): sequence to sequence over tokens 0-9.

Training inputs have lengths 1..L, L = 9 for Copy, Reverse, Mix and Dynamic Recall and 10 for the
sorts (the columns of Tables 7-12). By default (`online`) every training step draws a fresh batch,
all of one length drawn uniformly from 1..L, as the authors' code does; `online: false` trains on a
fixed set of `train_size` samples instead. The OOD validation set has length L+1 (or
`ood_valid_length`); the test sets (`test_L`, `test_x1` .. `test_x8`) have the lengths the tables
print: L, then k(L+1) for k = 1, 2, 4, 8 (10/20/40/80) for the first four tasks and kL+1
(11/21/41/81) for the sorts, whose columns are headed 2(L+1) etc. but print the lengths of the
authors' code (`max_seq_len * genlen + 1`). Scored per token (the papers' number) and per sequence.

  copy             y = x
  reverse          y = x reversed
  mix              y_t = x_ceil(L/2) for odd t, x_1 for even t (t = 1..L)
  dynamic_recall   a query token x_q (its first occurrence) is appended to the input; the answer
                   starts next to it, on the left for odd L and on the right for even L, and runs on
                   to the end of the input
  priority_sort    each token has a priority ~ N(0, 1) (a token feature); y = x sorted by priority
  id_sort          tokens are paired at random and each pair shares an id ~ N(0, I) (token features);
                   y_i = the token that shares x_i's id (with odd L the last token pairs with itself)

Dynamic Recall's left/right rule and ID Sort's odd lengths are not pinned down by the paper; the
choices above are ours.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from ..kinds import SEQUENCE_TO_SEQUENCE
from .base import SPECIAL_TOKENS, Split, Task, cached, check_values, pad_rows

KIND = SEQUENCE_TO_SEQUENCE  # the probe's and the registry's (tasks.TASKS)

DIGITS = [str(i) for i in range(10)]
VOCAB = SPECIAL_TOKENS + DIGITS
FIRST_DIGIT = len(SPECIAL_TOKENS)
TASK_NAMES = ("copy", "reverse", "mix", "dynamic_recall", "priority_sort", "id_sort")
ID_DIM = 8  # size of ID Sort's id vectors


# L of Tables 7-12. The authors' released code (Copy and Reverse only) trains Copy on 1..10 and tests
# at 11/21/41/81, the sorts' columns; we follow the tables.
PAPER_L = {"copy": 9, "reverse": 9, "mix": 9, "dynamic_recall": 9, "priority_sort": 10, "id_sort": 10}


@dataclass(frozen=True)
class AlgorithmicConfig:
    seed: int = 0
    max_train_length: int | None = None  # L; None: the paper's L for the task (PAPER_L)
    online: bool = True  # a fresh training batch every step (the authors' protocol)
    train_size: int = 50_000  # the fixed training set, when not online
    eval_size: int = 1280  # per validation/test set: the authors' 10 test batches of 128
    # The OOD validation set's length; None: L+1. Longer keeps selection from saturating where a
    # model copies L+1 without a fault (search_spaces/smoke.yaml).
    ood_valid_length: int | None = None
    # test lengths k(L+1) or, for the sorts, kL+1; and L itself
    test_multipliers: tuple[int, ...] = (1, 2, 4, 8)

    def __post_init__(self):
        check_values(self)


def train_length(name: str, config: AlgorithmicConfig) -> int:
    return config.max_train_length or PAPER_L[name]


def test_length(name: str, L: int, k: int) -> int:
    return k * L + 1 if name in ("priority_sort", "id_sort") else k * (L + 1)


def shortest(name: str) -> int:
    """Dynamic Recall needs a neighbour of its query, ID Sort a pair."""
    return 2 if name in ("dynamic_recall", "id_sort") else 1


def make_sample(name: str, rng: np.random.Generator, length: int):
    """(input digits, target digits, token features or None) for one sample of the given length."""
    x = rng.integers(10, size=length)
    if name == "copy":
        return x, x.copy(), None
    if name == "reverse":
        return x, x[::-1].copy(), None
    if name == "mix":
        t = np.arange(1, length + 1)
        middle = -(-length // 2) - 1  # ceil(L/2), 1-based -> 0-based
        return x, np.where(t % 2 == 1, x[middle], x[0]), None
    if name == "dynamic_recall":
        go_left = length % 2 == 1
        candidates = [
            q for q in range(length) if (q >= 1 if go_left else q <= length - 2) and x[q] not in x[:q]
        ]
        if not candidates:  # every usable position repeats an earlier token: redraw
            return make_sample(name, rng, length)
        q = candidates[rng.integers(len(candidates))]
        start = q - 1 if go_left else q + 1
        return np.append(x, x[q]), x[start:].copy(), None
    if name == "priority_sort":
        priority = rng.standard_normal(length)
        return x, x[np.argsort(priority, kind="stable")], priority[:, None].astype(np.float32)
    if name == "id_sort":
        order = rng.permutation(length)
        partner = np.arange(length)
        for a, b in zip(order[0::2], order[1::2]):
            partner[a], partner[b] = b, a
        ids = rng.standard_normal((length, ID_DIM)).astype(np.float32)
        ids = ids[np.minimum(np.arange(length), partner)]  # each pair takes its lower member's id
        return x, x[partner], ids
    raise ValueError(f"unknown algorithmic task {name!r}; known: {', '.join(TASK_NAMES)}")


def make_split(name: str, rng: np.random.Generator, lengths: np.ndarray) -> Split:
    inputs, targets, features = zip(*(make_sample(name, rng, int(n)) for n in lengths))
    arrays = {
        "tokens": pad_rows([x + FIRST_DIGIT for x in inputs]),
        "lengths": np.array([len(x) for x in inputs], dtype=np.int16),
        "targets": pad_rows([y + FIRST_DIGIT for y in targets]),
        "target_lengths": np.array([len(y) for y in targets], dtype=np.int16),
        "depths": np.asarray(lengths, dtype=np.int16),  # the split-defining quantity: input length
    }
    if features[0] is not None:
        width = max(len(f) for f in features)
        padded = np.zeros((len(features), width, features[0].shape[1]), dtype=np.float32)
        for k, f in enumerate(features):
            padded[k, : len(f)] = f
        arrays["token_features"] = padded
    return Split(arrays)


def probe(name: str, config: AlgorithmicConfig) -> Task:
    """The task without its data: what a model is built from."""
    n_features = {"priority_sort": 1, "id_sort": ID_DIM}.get(name, 0)
    return Task(name=name, kind=KIND, splits={}, vocab=VOCAB, classes=DIGITS, n_features=n_features)


def build(name: str, config: AlgorithmicConfig) -> Task:
    rng = np.random.default_rng([config.seed, TASK_NAMES.index(name)])
    L = train_length(name, config)
    if L < shortest(name):
        raise ValueError(f"max_train_length: {name} needs at least {shortest(name)}, got {L}")

    def train_lengths(n: int) -> np.ndarray:
        return rng.integers(shortest(name), L + 1, size=n)

    splits = {}
    if not config.online:
        splits["train"] = make_split(name, rng, train_lengths(config.train_size))
    splits["iid_valid"] = make_split(name, rng, train_lengths(config.eval_size))
    ood_length = config.ood_valid_length or L + 1
    if ood_length <= L:
        raise ValueError(
            f"ood_valid_length: must be longer than the training lengths 1..{L}, got {ood_length}"
        )
    splits["ood_valid"] = make_split(name, rng, np.full(config.eval_size, ood_length))
    splits["test_L"] = make_split(name, rng, np.full(config.eval_size, L))
    for k in config.test_multipliers:
        splits[f"test_x{k}"] = make_split(name, rng, np.full(config.eval_size, test_length(name, L, k)))
    return dataclasses.replace(probe(name, config), splits=splits)


def draw_batch(name: str, config: AlgorithmicConfig, rng: np.random.Generator, size: int) -> Split:
    """One online training batch: a length uniform in 1..L (2..L where a task needs two tokens),
    shared by the batch as in the authors' code, then `size` samples of it."""
    length = int(rng.integers(shortest(name), train_length(name, config) + 1))
    return make_split(name, rng, np.full(size, length))


def loader(name: str):
    def load(config: AlgorithmicConfig) -> Task:
        task = cached(name, config, functools.partial(build, name, config))
        if config.online:
            task.draw_train = functools.partial(draw_batch, name, config)
        return task

    return load
