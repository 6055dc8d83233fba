"""Simple arithmetic (NDR paper Sec. 3.2, App. C.2), drawn as the authors' generator draws it.

'((4*7)+2)' evaluates to 0: nested modulo-10 '+' and '*', every operation in brackets, one token
per character, at most 50. The depth is the number of operations on the deepest path (that example
has depth 2). Train depths 1-5, OOD validation 6, test 7-8 (Sec. 3.2, Table 2 and the authors'
code; App. C.2 says 7). An operand is a sub-expression with probability 0.2 in train and IID
validation, 0.3 in OOD validation and test; an expression shallower than its split's smallest depth
becomes the right operand of a new operation until it is deep enough. A split whose range starts at
one operation holds each of the 200 one-operation expressions once; its size is spread over the
deeper depths (the authors' 100,000 training samples: 25,000 at each of depths 2-5, plus those
200). Samples are unique within a split.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from ..kinds import SEQUENCE_CLASSIFICATION
from .base import SPECIAL_TOKENS, SplitPlan, Task, balanced_counts, cached, check_values, depth_splits

KIND = SEQUENCE_CLASSIFICATION  # the probe's and the registry's (tasks.TASKS)

DIGITS = [str(i) for i in range(10)]
OPS = ["+", "*"]
VOCAB = SPECIAL_TOKENS + DIGITS + OPS + ["(", ")"]
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}
IID_SPLITS = ("train", "iid_valid")


@dataclass(frozen=True)
class ArithmeticConfig:
    seed: int = 0
    train_size: int = 100_000
    eval_size: int = 1000
    train_depths: tuple[int, int] = (1, 5)
    ood_valid_depths: tuple[int, int] = (6, 6)
    test_depths: tuple[int, int] = (7, 8)
    max_tokens: int = 50
    p_subexpression: float = 0.2  # train and IID validation
    p_subexpression_ood: float = 0.3  # OOD validation and test, as in the authors' data

    def __post_init__(self):
        check_values(self)


def evaluate(tree) -> int:
    if isinstance(tree, int):
        return tree
    op, left, right = tree
    a, b = evaluate(left), evaluate(right)
    return (a + b) % 10 if op == "+" else (a * b) % 10


def depth_of(tree) -> int:
    return 0 if isinstance(tree, int) else 1 + max(depth_of(tree[1]), depth_of(tree[2]))


def to_text(tree) -> str:
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    return f"({to_text(left)}{op}{to_text(right)})"


def distinct_at(depth: int) -> int:
    """How many different expressions have exactly this depth (length limit aside)."""
    at_most = 10  # expressions of depth <= d: a digit, or an operation on two of depth <= d - 1
    previous = 0
    for _ in range(depth):
        previous, at_most = at_most, 10 + 2 * at_most**2
    return at_most - previous


def token_ids(text: str) -> list[int]:
    return [TOKEN_ID[c] for c in text]


def one_operation_samples() -> list[tuple[list[int], int, int]]:
    return [
        (token_ids(to_text(t)), evaluate(t), 1)
        for t in ((op, a, b) for op in OPS for a in range(10) for b in range(10))
    ]


def listed_samples(plan: SplitPlan) -> list[tuple[list[int], int, int]]:
    """A split whose range holds depth 1 lists every one-operation expression once."""
    return one_operation_samples() if plan.depths[0] <= 1 <= plan.depths[1] else []


def p_subexpression(config: ArithmeticConfig, split: str) -> float:
    return config.p_subexpression if split in IID_SPLITS else config.p_subexpression_ood


def draw_expression(rng: np.random.Generator, p: float, min_depth: int, max_depth: int):
    """One expression of the authors' process: at most max_depth operations deep, wrapped until at
    least min_depth deep."""

    def subtree(levels: int):
        # `levels` operations may still nest below this position.
        if levels == 0 or rng.random() >= p:
            return int(rng.integers(10))
        return (OPS[rng.integers(2)], subtree(levels - 1), subtree(levels - 1))

    tree = subtree(max_depth)
    while depth_of(tree) < min_depth:
        tree = (OPS[rng.integers(2)], subtree(max_depth - 1), tree)
    return tree


def make_drawer(config: ArithmeticConfig, plan: SplitPlan, rng: np.random.Generator):
    p = p_subexpression(config, plan.name)

    def draw_at(depth: int):
        # Kept when its depth is the one asked for: the authors bin the same draws by depth.
        while True:
            # one-operation ones are listed
            tree = draw_expression(rng, p, max(plan.depths[0], 2), plan.depths[1])
            if depth_of(tree) == depth:
                text = to_text(tree)
                if len(text) <= config.max_tokens:
                    return token_ids(text), evaluate(tree)

    return draw_at


def drawn_counts(plan: SplitPlan) -> dict[int, int]:
    """How many expressions to draw per depth of 2 or more. The authors cap a depth at 3/4 of its
    distinct expressions and give the rest to deeper ones."""
    depths = list(range(max(plan.depths[0], 2), plan.depths[1] + 1))
    return balanced_counts(plan.size, depths, lambda d: distinct_at(d) * 3 // 4) if depths else {}


def probe(config: ArithmeticConfig) -> Task:
    """The task without its data: what a model is built from."""
    return Task(name="arithmetic", vocab=VOCAB, classes=DIGITS, splits={}, kind=KIND)


def build(config: ArithmeticConfig) -> Task:
    splits = depth_splits(config, functools.partial(make_drawer, config), drawn_counts, listed_samples)
    return dataclasses.replace(probe(config), splits=splits)


def load(config: ArithmeticConfig) -> Task:
    return cached("arithmetic", config, lambda: build(config))
