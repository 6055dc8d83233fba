"""Depth-balanced ListOps (NDR paper Sec. 3.3, App. C.2), drawn as the authors' generator draws it.

'[MED 4 8 5 [MAX 8 4 9 ] ]' evaluates to 6. Operations: SM (sum mod 10), MIN, MAX, MED (floored
median). Every operation has 2-5 arguments; each argument is a sub-list with probability 0.3 while
the depth budget lasts. A tree shallower than its split's smallest depth is wrapped in a new root
until it is deep enough. The length rule counts tokens plus operations (each '[OP ... ]' costs
3) against the limit of 50, so real samples stay under about 42 tokens.

Splits are balanced by *dependency depth*: the depth of the parse tree after pruning the arguments
that no operation selects (MIN/MAX select one, MED one or two, SM all). Tree depth is not limited to
it: a shallow training sample may carry deeper branches that no operation selects, as in the
authors' data. Ties follow the authors: MIN and MAX select the first extreme argument, MED orders
its arguments by value, equal values in position order. A tie can make a sample solvable through a
shallower argument than the one selected, so dependency depth bounds, rather than equals, the
computation a sample needs. Samples are unique within a split (the authors do not exclude across
splits, so IID validation may share samples with train).

Depths count operations (a lone digit is depth 0): train 1-5, OOD validation 6, test 7-8, the
paper's numbers; the authors' code counts levels and writes these as 2-6, 7 and 8-9.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from ..kinds import SEQUENCE_CLASSIFICATION
from .base import SPECIAL_TOKENS, SplitPlan, Task, cached, check_values, depth_splits

KIND = SEQUENCE_CLASSIFICATION  # the probe's and the registry's (tasks.TASKS)

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
    test_depths: tuple[int, int] = (7, 8)  # Sec. 3.3, Table 3 and the authors' code (App. C.2 says 7)
    max_length: int = 50  # tokens plus operations, the authors' rule
    max_args: int = 5
    p_sublist: float = 0.3

    def __post_init__(self):
        check_values(self)


def selected(op: str, values: list[int]) -> list[int]:
    """Indices of the arguments an operation's result depends on, with the authors' tie rule."""
    if op == "SM":
        return list(range(len(values)))
    if op in ("MIN", "MAX"):
        extreme = (min if op == "MIN" else max)(values)
        return [values.index(extreme)]
    order = sorted(range(len(values)), key=values.__getitem__)  # stable: equal values in position order
    n = len(order)
    return order[n // 2 : n // 2 + 1] if n % 2 else order[n // 2 - 1 : n // 2 + 1]


def value_of(op: str, values: list[int], chosen: list[int]) -> int:
    """SM sums every argument mod 10; MIN/MAX/MED take the (floored) mean of the selected ones."""
    if op == "SM":
        return sum(values) % 10
    return sum(values[i] for i in chosen) // len(chosen)


class TooLong(Exception):
    """A draw that breaks the length rule."""


class TreeDrawer:
    """depth -> (token ids, value): trees drawn for a split whose dependency depths span
    `plan.depths`, kept when their dependency depth is the one asked for (the authors bin the same
    draws by dependency depth, which gives every bin the same distribution).

    A tree is (token ids, value, dependency depth, tree depth), built bottom-up. `room` is what
    the length rule still allows: a draw that breaks it is abandoned at once, which gives the same
    distribution as finishing the tree and rejecting it (the authors' way) at a fraction of the
    cost, since most unconstrained trees at depths 7-8 are far longer than 50."""

    def __init__(self, config: ListOpsConfig, plan: SplitPlan, rng: np.random.Generator):
        self.config, self.rng = config, rng
        self.token_id = {t: i for i, t in enumerate(VOCAB)}
        self.min_depth, self.max_depth = plan.depths
        # Drawing random numbers in blocks is what makes 1M samples take seconds instead of minutes.
        self.uniform, self.room = iter(()), 0

    def next_uniform(self) -> float:
        try:
            return next(self.uniform)
        except StopIteration:
            self.uniform = iter(self.rng.random(65536).tolist())
            return next(self.uniform)

    def next_int(self, n: int) -> int:
        return int(self.next_uniform() * n)

    def spend(self, cost: int) -> None:
        self.room -= cost
        if self.room < 0:
            raise TooLong

    def leaf(self):
        self.spend(1)
        digit = self.next_int(10)
        return [self.token_id[DIGITS[digit]]], digit, 0, 0

    def node(self, args):
        op = OPERATIONS[self.next_int(4)]
        values = [a[1] for a in args]
        ids = [self.token_id["[" + op]]
        for a in args:
            ids += a[0]
        ids.append(self.token_id["]"])
        chosen = selected(op, values)
        dependency = 1 + max(args[i][2] for i in chosen)
        return ids, value_of(op, values, chosen), dependency, 1 + max(a[3] for a in args)

    def arguments(self, max_args: int, levels: int):
        return [self.subtree(levels) for _ in range(2 + self.next_int(max_args - 1))]

    def subtree(self, levels: int):
        # `levels` operations may still nest below this position.
        if levels == 0 or self.next_uniform() >= self.config.p_sublist:
            return self.leaf()
        self.spend(3)  # '[OP', ']' and the operation itself, by the authors' count
        return self.node(self.arguments(self.config.max_args, levels - 1))

    def tree(self):
        self.room = self.config.max_length
        tree = self.subtree(self.max_depth)
        while tree[3] < self.min_depth:
            # Wrap in a new root: the old tree plus 1 to max_args - 1 siblings, never in last place.
            self.spend(3)
            args = self.arguments(self.config.max_args - 1, self.max_depth - 1)
            args.insert(self.next_int(len(args)), tree)
            tree = self.node(args)
        return tree

    def __call__(self, depth: int):
        while True:
            try:
                ids, value, dependency, _ = self.tree()
            except TooLong:
                continue
            if dependency == depth:
                return ids, value


def probe(config: ListOpsConfig) -> Task:
    """The task without its data: what a model is built from."""
    return Task(name="listops", vocab=VOCAB, classes=DIGITS, splits={}, kind=KIND)


def build(config: ListOpsConfig) -> Task:
    splits = depth_splits(config, functools.partial(TreeDrawer, config))
    return dataclasses.replace(probe(config), splits=splits)


def load(config: ListOpsConfig) -> Task:
    return cached("listops", config, lambda: build(config))
