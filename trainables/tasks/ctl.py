"""Compositional table lookup (NDR paper Sec. 3.1, App. C.2).

8 symbols (3-bit strings), 9 random bijective functions (letters). Forward '101 d a b' means
b(a(d(101))); backward presents the same problem as 'b a d 101'. The depth is the number of
function applications; splits are disjoint by depth: train 1-5, OOD validation 6-8, test 9-10.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..kinds import SEQUENCE_CLASSIFICATION
from .base import SPECIAL_TOKENS, Split, Task, balanced_counts, cached, check_values, draw_unique, pack_split

KIND = SEQUENCE_CLASSIFICATION  # the probe's and the registry's (tasks.TASKS)

N_SYMBOLS = 8
N_FUNCTIONS = 9
SYMBOLS = [format(i, "03b") for i in range(N_SYMBOLS)]
FUNCTIONS = [chr(ord("a") + i) for i in range(N_FUNCTIONS)]


@dataclass(frozen=True)
class CTLConfig:
    direction: str = field(default="forward", metadata={"choices": ("forward", "backward")})
    seed: int = 0
    train_size: int = 53_704  # the paper's train set size
    eval_size: int = 1000
    train_depths: tuple[int, int] = (1, 5)
    ood_valid_depths: tuple[int, int] = (6, 8)
    test_depths: tuple[int, int] = (9, 10)

    def __post_init__(self):
        check_values(self)


def make_tables(rng: np.random.Generator) -> np.ndarray:
    """(N_FUNCTIONS, N_SYMBOLS): table[f, x] = f(x); each row a random permutation, i.e. bijective."""
    return np.stack([rng.permutation(N_SYMBOLS) for _ in range(N_FUNCTIONS)])


def proportional(counts: dict[int, int], size: int) -> dict[int, int]:
    """`size` split over the same keys in the proportions of `counts` (largest remainders)."""
    total = sum(counts.values())
    exact = {k: size * n / total for k, n in counts.items()}
    out = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - out[k], reverse=True)[: size - sum(out.values())]:
        out[k] += 1
    return out


def probe(config: CTLConfig) -> Task:
    """The task without its data: what a model is built from."""
    return Task(
        name=f"ctl_{config.direction}",
        vocab=SPECIAL_TOKENS + SYMBOLS + FUNCTIONS,
        classes=SYMBOLS,
        splits={},
        kind=KIND,
    )


class Problems:
    """Problems of one CTL task: a symbol and the functions applied to it, drawn from `rng`."""

    def __init__(self, config: CTLConfig, rng: np.random.Generator):
        vocab = probe(config).vocab
        self.config, self.rng = config, rng
        self.sym_id = {s: vocab.index(s) for s in SYMBOLS}
        self.fn_id = {f: vocab.index(f) for f in FUNCTIONS}
        self.tables = make_tables(rng)

    def encode(self, symbol: int, fns: tuple[int, ...]) -> list[int]:
        ids = [self.sym_id[SYMBOLS[symbol]]] + [self.fn_id[FUNCTIONS[f]] for f in fns]
        return ids if self.config.direction == "forward" else ids[::-1]

    def sample(self, symbol: int, fns: tuple[int, ...]):
        value = symbol
        for f in fns:
            value = self.tables[f, value]
        return (symbol, fns), self.encode(symbol, fns), int(value)

    def draw_at(self, depth: int):
        rng = self.rng
        return lambda: self.sample(
            int(rng.integers(N_SYMBOLS)), tuple(int(f) for f in rng.integers(N_FUNCTIONS, size=depth))
        )

    def draw_split(self, counts: dict[int, int], required=()) -> list[tuple[list[int], int, int]]:
        used: set = set()  # unique within a split; splits of different depths are disjoint anyway
        samples = []
        for key, ids, label in required:
            used.add(key)
            samples.append((ids, label, len(key[1])))
            counts[len(key[1])] -= 1
        for d, n in counts.items():
            samples += [(ids, label, d) for _, ids, label in draw_unique(n, self.draw_at(d), used)]
        return samples

    def shuffled(self, samples: list) -> list:
        return [samples[i] for i in self.rng.permutation(len(samples))]

    def drawn(self, depth_range: tuple[int, int]) -> Split:
        """A shuffled evaluation split of `eval_size` problems balanced over the depths of `depth_range`."""
        return pack_split(self.shuffled(self.draw_split(balanced(depth_range, self.config.eval_size))))


def capacity(depth: int) -> int:
    return N_SYMBOLS * N_FUNCTIONS**depth


def balanced(depth_range: tuple[int, int], size: int) -> dict[int, int]:
    return balanced_counts(size, list(range(depth_range[0], depth_range[1] + 1)), capacity)


def build(config: CTLConfig) -> Task:
    problems = Problems(config, np.random.default_rng(config.seed))
    # The IID set "matches the distribution of the train set" (App. C.2) and, as in the authors'
    # code (one pool of distinct problems, a random part of it held out), shares no problem with
    # it: with the paper's sizes the pool holds every problem of depth 1-3, so the IID set takes
    # its shallow problems out of train. Every single function on every symbol stays in train
    # (App. C.2; the authors' IID draws start at depth 2).
    singles = [problems.sample(x, (f,)) for x in range(N_SYMBOLS) for f in range(N_FUNCTIONS)]
    pool_counts = balanced(config.train_depths, config.train_size + config.eval_size)
    iid_counts = proportional({d: n for d, n in pool_counts.items() if d > 1}, config.eval_size)
    train, iid = [], []
    for problem in problems.shuffled(problems.draw_split(dict(pool_counts), required=singles)):
        depth = problem[2]
        if iid_counts.get(depth, 0) > 0:
            iid_counts[depth] -= 1
            iid.append(problem)
        else:
            train.append(problem)
    splits = {
        "train": pack_split(train),
        "iid_valid": pack_split(iid),
        "ood_valid": problems.drawn(config.ood_valid_depths),
        "test": problems.drawn(config.test_depths),
    }
    return dataclasses.replace(probe(config), splits=splits)


def load(config: CTLConfig) -> Task:
    return cached("ctl", config, lambda: build(config))
