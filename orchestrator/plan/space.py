"""A search space: what TPE searches, each key a distribution (`space:` and `per_model.<model>.space:`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from trainables.config import closest

from .source import SpecError, yaml_number


def repeats(values: list) -> bool:
    """Whether a list of a file's values holds one value twice: 1 and 1.0 alike (a trial takes them
    as one), true and 1 not; values that do not hash (task_options) by their text."""

    def key(v):
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else repr(v)

    return len(set(map(key, values))) != len(values)


@dataclass(frozen=True)
class Distribution:
    """One searched parameter: loguniform/uniform [low, high], int [low, high] (inclusive), or choice."""

    kind: str
    values: tuple

    KINDS = ("loguniform", "uniform", "int", "choice")

    @classmethod
    def parse(cls, raw, where: str, path) -> Distribution:
        if not isinstance(raw, dict) or len(raw) != 1:
            raise SpecError(path, where, f"expected one of {{{', '.join(cls.KINDS)}: ...}}, got {raw!r}")
        ((kind, values),) = raw.items()
        if kind not in cls.KINDS:
            raise SpecError(path, where, f"unknown distribution {kind!r}{closest(str(kind), cls.KINDS)}")
        if not isinstance(values, list) or not values:
            raise SpecError(path, f"{where}.{kind}", "expected a non-empty list")
        if kind == "choice":
            if repeats(values):
                raise SpecError(path, f"{where}.choice", f"repeated values in {values}")
            return cls(kind, tuple(values))
        if len(values) != 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
        ):
            texts = [
                v for v in values if isinstance(v, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", v)
            ]
            hint = f" (YAML reads {texts[0]} as text: write {yaml_number(float(texts[0]))})" if texts else ""
            raise SpecError(
                path, f"{where}.{kind}", f"expected [low, high] finite numbers, got {values}{hint}"
            )
        low, high = values
        if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
            raise SpecError(path, f"{where}.int", f"bounds must be integers, got {values}")
        if not low < high:
            raise SpecError(
                path, f"{where}.{kind}", f"empty or inverted range [{low}, {high}]: low must be below high"
            )
        if kind == "loguniform" and low <= 0:
            raise SpecError(path, f"{where}.loguniform", f"low must be positive for a log scale, got {low}")
        return cls(kind, (low, high))

    def to_optuna(self):
        import optuna.distributions as d  # noqa: PLC0415 - a second of imports, paid by a search alone

        if self.kind == "choice":
            return d.CategoricalDistribution(list(self.values))
        if self.kind == "int":
            return d.IntDistribution(int(self.values[0]), int(self.values[1]))
        return d.FloatDistribution(
            float(self.values[0]), float(self.values[1]), log=self.kind == "loguniform"
        )

    def nearest(self, value):
        """The value itself if the distribution can produce it, else the closest value it can."""
        if self.kind == "choice":
            if value in self.values:
                return value
            numeric = [v for v in self.values if isinstance(v, (int, float))]
            if isinstance(value, (int, float)) and numeric:
                return min(numeric, key=lambda v: abs(v - value))
            return self.values[0]
        low, high = self.values
        if not isinstance(value, (int, float)) or isinstance(
            value, bool
        ):  # a paper setting of null (threads, grad_clip)
            value = low
        clipped = min(max(value, low), high)
        return int(round(clipped)) if self.kind == "int" else float(clipped)


def parse_space(raw, where: str, path) -> dict[str, Distribution]:
    if not isinstance(raw, dict):
        raise SpecError(path, where, "expected a mapping of parameter -> distribution")
    if "n_iters" in raw:  # a pair's trial length is the horizon of ASHA and of the cost estimate
        raise SpecError(
            path,
            f"{where}.n_iters",
            "a trial's length is not searched: set it in budget (or fixed, per_model.<model>.fixed)",
        )
    return {str(k): Distribution.parse(v, f"{where}.{k}", path) for k, v in raw.items()}
