"""Depth-balanced ListOps (NDR paper Sec. 3.3, App. C.2).

'[MED 4 8 5 [MAX 8 4 9 ] ]' evaluates to 6. Operations: SM (sum mod 10), MIN, MAX, MED (floored
median), at most 5 arguments, a sub-list at each argument position with probability 0.3, at most
50 tokens. Splits are balanced and disjoint by *dependency depth*: the depth of the parse tree
after pruning the arguments that no operation selects (MIN/MAX select one, MED one or two, SM all),
so a depth-K sample really needs K levels of computation.

Ties are resolved towards the shallowest argument: if two arguments hold the minimum, MIN needs only
the cheaper one. MED sorts its arguments by (value, dependency depth) and selects the middle one
(odd count) or the middle two (even count).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .base import SPECIAL_TOKENS, Task, cached, depth_splits

OPERATIONS = ["SM", "MIN", "MAX", "MED"]
DIGITS = [str(i) for i in range(10)]
VOCAB = SPECIAL_TOKENS + DIGITS + ["[" + op for op in OPERATIONS] + ["]"]


@dataclass(frozen=True)
class ListOpsConfig:
    seed: int = 0
    train_size: int = 1_000_000
    eval_size: int = 1000
    train_depths: tuple[int, int] = (1, 5)
    ood_valid_depths: tuple[int, int] = (6, 6)
    test_depths: tuple[int, int] = (7, 7)  # the paper reports 7-8 in Sec. 3.3, 7 in App. C.2
    max_tokens: int = 50
    max_args: int = 5
    p_sublist: float = 0.3


def combine(op: str, results: list[tuple[int, int]]) -> tuple[int, int]:
    """(value, dependency depth) of an operation from its arguments' (value, dependency depth)."""
    if op == "SM":
        return sum(v for v, _ in results) % 10, 1 + max(d for _, d in results)
    if op in ("MIN", "MAX"):
        value = (min if op == "MIN" else max)(v for v, _ in results)
        return value, 1 + min(d for v, d in results if v == value)
    ordered = sorted(results)
    n = len(ordered)
    middle = ordered[n // 2 : n // 2 + 1] if n % 2 else ordered[n // 2 - 1 : n // 2 + 1]
    return sum(v for v, _ in middle) // len(middle), 1 + max(d for _, d in middle)


def make_drawer(config: ListOpsConfig, rng: np.random.Generator):
    token_id = {t: i for i, t in enumerate(VOCAB)}
    # Drawing random numbers in blocks is what makes 1M samples take seconds instead of minutes.
    uniform = iter(())

    def next_uniform() -> float:
        nonlocal uniform
        try:
            return next(uniform)
        except StopIteration:
            uniform = iter(rng.random(65536).tolist())
            return next(uniform)

    def next_int(n: int) -> int:
        return int(next_uniform() * n)

    # Trees are built bottom-up as (token ids, value, dependency depth), so nothing is re-evaluated
    # when a node is redrawn.
    def leaf():
        digit = next_int(10)
        return [token_id[DIGITS[digit]]], digit, 0

    def node(op: str, args):
        value, depth = combine(op, [(v, d) for _, v, d in args])
        ids = [token_id["[" + op]]
        for a in args:
            ids += a[0]
        ids.append(token_id["]"])
        return ids, value, depth

    def free_tree(max_depth: int):
        if max_depth > 0 and next_uniform() < config.p_sublist:
            n_args = 1 + next_int(config.max_args)
            return node(OPERATIONS[next_int(4)], [free_tree(max_depth - 1) for _ in range(n_args)])
        return leaf()

    def tree_at(depth: int):
        # One argument carries the exact depth below; the node is redrawn (operation and siblings)
        # until that depth survives pruning, i.e. until the operation selects a deepest argument.
        if depth == 0:
            return leaf()
        deep = tree_at(depth - 1)
        while True:
            n_args = 2 + next_int(config.max_args - 1)
            args = [free_tree(depth - 1) for _ in range(n_args - 1)]
            args.insert(next_int(n_args), deep)
            tree = node(OPERATIONS[next_int(4)], args)
            if tree[2] == depth:
                return tree

    def draw_at(depth: int):
        while True:
            ids, value, _ = tree_at(depth)
            if len(ids) <= config.max_tokens:
                return ids, value

    return draw_at


def build(config: ListOpsConfig) -> Task:
    splits = depth_splits(config, functools.partial(make_drawer, config))
    return Task(name="listops", vocab=VOCAB, classes=DIGITS, splits=splits, kind="sequence_classification")


def load(config: ListOpsConfig) -> Task:
    return cached("listops", config, lambda: build(config))
