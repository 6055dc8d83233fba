"""Which trial is best: the one rule the summaries, the answer, the report and a confirmation's
candidates all apply.

Trials rank by the file's metric. Where trials tie on it (OOD validation saturates at its maximum:
PANM copies length L+1 without a fault), the tie goes to the higher in-distribution validation
score at the same checkpoint, then to the lower training loss at the trial's last evaluation; where
those tie too, to the trial that started first (as Optuna's `study.best_trial`). A winner chosen by
a tie-break says so (`Choice.decided_by`), in the answer line and the report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from trainables.scores import LOWER_IS_BETTER

T = TypeVar("T")
STARTED_FIRST = "the order the trials started"


@dataclasses.dataclass(frozen=True)
class Choice:
    """The best of some trials: its index, and what chose it among those tied with it on the metric
    (None: the metric alone; a tie-break's metric name; or STARTED_FIRST)."""

    index: int
    decided_by: str | None


@dataclasses.dataclass(frozen=True)
class Ranking:
    metric: str  # the file's selection metric, e.g. best_ood_valid_token_acc
    score: str  # the task's score it is of, e.g. token_acc: names the tie-breaks
    lower: bool  # whether a lower metric is better (the file's mode: min)

    @classmethod
    def of(cls, metric: str, score: str, mode: str | None = None) -> Ranking:
        lower = mode == "min" if mode else score in LOWER_IS_BETTER
        return cls(metric, score, lower)

    def criteria(self) -> tuple[tuple[str, bool], ...]:
        """(metric name, lower is better), in the order they decide."""
        return (
            (self.metric, self.lower),
            (f"iid_valid_{self.score}_at_best", self.score in LOWER_IS_BETTER),
            ("loss", True),
        )

    def key(self, metrics: Mapping[str, float]) -> tuple:
        """Sorts the best first; a value missing or NaN ranks last on its criterion."""
        out = []
        for name, lower in self.criteria():
            value = metrics.get(name)
            missing = value is None or not math.isfinite(value)
            out.append((1, 0.0) if missing else (0, value if lower else -value))
        return tuple(out)

    def best(self, trials: Sequence[T], metrics_of: Callable[[T], Mapping[str, float]]) -> Choice | None:
        """The best of `trials` (in the order they started), or None where there are none."""
        if not trials:
            return None
        keys = [self.key(metrics_of(t)) for t in trials]
        order = sorted(range(len(trials)), key=keys.__getitem__)  # stable: the first started of full ties
        if len(order) == 1:
            return Choice(order[0], None)
        first, second = keys[order[0]], keys[order[1]]
        differs = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), None)
        if differs == 0:
            return Choice(order[0], None)
        return Choice(order[0], STARTED_FIRST if differs is None else self.criteria()[differs][0])

    def sorted(self, trials: Sequence[T], metrics_of: Callable[[T], Mapping[str, float]]) -> list[T]:
        """`trials` best first."""
        return sorted(trials, key=lambda t: self.key(metrics_of(t)))
