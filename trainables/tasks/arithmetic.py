"""Simple arithmetic (NDR paper Sec. 3.2, App. C.2): nested modulo-10 '+' and '*' in brackets.

'((4*7)+2)' evaluates to 0. The depth is the number of operations on the deepest path (that example
has depth 2). Sec. 3.2 says the test set has depths 7-8, App. C.2 says 7: we default to App. C.2's
7 and keep every depth range configurable. App. C.2 lists train depths 0-5; a depth-0 sample is a
lone digit (only 10 exist), so we default to 1-5 rather than spend a sixth of the set on them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .base import SPECIAL_TOKENS, Task, cached, depth_splits

DIGITS = [str(i) for i in range(10)]
OPS = ["+", "*"]
VOCAB = SPECIAL_TOKENS + DIGITS + OPS + ["(", ")"]


@dataclass(frozen=True)
class ArithmeticConfig:
    seed: int = 0
    train_size: int = 100_000
    eval_size: int = 1000
    train_depths: tuple[int, int] = (1, 5)
    ood_valid_depths: tuple[int, int] = (6, 6)
    test_depths: tuple[int, int] = (7, 7)
    max_tokens: int = 50
    p_subexpression: float = 0.2


def evaluate(tree) -> int:
    if isinstance(tree, int):
        return tree
    op, left, right = tree
    a, b = evaluate(left), evaluate(right)
    return (a + b) % 10 if op == "+" else (a * b) % 10


def to_text(tree) -> str:
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    return f"({to_text(left)}{op}{to_text(right)})"


def make_drawer(config: ArithmeticConfig, rng: np.random.Generator):
    token_id = {t: i for i, t in enumerate(VOCAB)}

    def free_tree(max_depth: int):
        if max_depth > 0 and rng.random() < config.p_subexpression:
            return (OPS[rng.integers(2)], free_tree(max_depth - 1), free_tree(max_depth - 1))
        return int(rng.integers(10))

    def tree_at(depth: int):
        # One operand carries the exact remaining depth; the other is a free subtree that cannot
        # exceed it, so the depth is exact without rejecting whole trees.
        if depth == 0:
            return int(rng.integers(10))
        deep, free = tree_at(depth - 1), free_tree(depth - 1)
        left, right = (deep, free) if rng.random() < 0.5 else (free, deep)
        return (OPS[rng.integers(2)], left, right)

    def draw_at(depth: int):
        while True:
            tree = tree_at(depth)
            text = to_text(tree)
            if len(text) <= config.max_tokens:
                return [token_id[c] for c in text], evaluate(tree)

    return draw_at


def build(config: ArithmeticConfig) -> Task:
    splits = depth_splits(config, functools.partial(make_drawer, config))
    return Task(name="arithmetic", vocab=VOCAB, classes=DIGITS, splits=splits, kind="sequence_classification")


def load(config: ArithmeticConfig) -> Task:
    return cached("arithmetic", config, lambda: build(config))
