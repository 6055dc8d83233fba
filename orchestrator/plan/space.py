"""A search space: what TPE searches, each key a distribution (`space:` and `per_model.<model>.space:`),
one class per kind, which answers what a search, a build check, a cost estimate and a figure ask of it."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

from trainables.fields import closest

from .source import SpecError, yaml_number


def repeats(values: list) -> bool:
    """Whether a list of a file's values holds one value twice: 1 and 1.0 alike (a trial takes them
    as one), true and 1 not; values that do not hash (task_options) by their text."""

    def key(v):
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else repr(v)

    return len(set(map(key, values))) != len(values)


@dataclass(frozen=True)
class Distribution:
    """One searched parameter: a choice of values, or a range [low, high] (LogUniform, Uniform, or
    IntRange, inclusive). `kind` is its name in a file."""

    values: tuple

    kind: ClassVar[str]
    log_scale: ClassVar[bool] = False  # searched (and plotted) on a log axis

    @staticmethod
    def parse(raw, where: str, path) -> Distribution:
        if not isinstance(raw, dict) or len(raw) != 1:
            raise SpecError(path, where, f"expected one of {{{', '.join(KINDS)}: ...}}, got {raw!r}")
        ((kind, values),) = raw.items()
        if kind not in KINDS:
            raise SpecError(path, where, f"unknown distribution {kind!r}{closest(str(kind), KINDS)}")
        if not isinstance(values, list) or not values:
            raise SpecError(path, f"{where}.{kind}", "expected a non-empty list")
        return KINDS[kind].of(values, f"{where}.{kind}", path)

    @property
    def choices(self) -> tuple:
        """The values the file names outright (a choice's); a range names none."""
        return ()

    @property
    def span(self) -> tuple | None:
        """(low, high) of a range; None for a choice, whose values have no order."""
        return None


@dataclass(frozen=True)
class Choice(Distribution):
    kind: ClassVar[str] = "choice"

    @classmethod
    def of(cls, values: list, where: str, path) -> Choice:
        if repeats(values):
            raise SpecError(path, where, f"repeated values in {values}")
        return cls(tuple(values))

    @property
    def choices(self) -> tuple:
        return self.values

    def to_optuna(self):
        import optuna.distributions as d  # noqa: PLC0415 - a second of imports, paid by a search alone

        return d.CategoricalDistribution(list(self.values))

    def nearest(self, value):
        """The value itself if the choice holds it, else the closest number it holds, else its first."""
        if value in self.values:
            return value
        numeric = [v for v in self.values if isinstance(v, (int, float))]
        if isinstance(value, (int, float)) and numeric:
            return min(numeric, key=lambda v: abs(v - value))
        return self.values[0]

    def typical(self):
        """The middle value: what a calibration trains when there is no paper setting."""
        return self.values[len(self.values) // 2]

    def probe_values(self) -> list:
        """The values a build check tries, first value first: every one."""
        return list(self.values)


@dataclass(frozen=True)
class Range(Distribution):
    """[low, high], finite numbers with low below high."""

    @classmethod
    def of(cls, values: list, where: str, path) -> Range:
        if len(values) != 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
        ):
            texts = [
                v for v in values if isinstance(v, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", v)
            ]
            hint = f" (YAML reads {texts[0]} as text: write {yaml_number(float(texts[0]))})" if texts else ""
            raise SpecError(path, where, f"expected [low, high] finite numbers, got {values}{hint}")
        low, high = values
        cls.check_bounds(values, where, path)
        if not low < high:
            raise SpecError(path, where, f"empty or inverted range [{low}, {high}]: low must be below high")
        cls.check_low(low, where, path)
        return cls((low, high))

    @classmethod
    def check_bounds(cls, values: list, where: str, path) -> None:
        """Refuses bounds this kind of range cannot hold (checked before their order)."""

    @classmethod
    def check_low(cls, low, where: str, path) -> None:
        """Refuses a low end this kind of range cannot start at (checked after the order)."""

    @property
    def span(self) -> tuple:
        return self.values

    def to_optuna(self):
        import optuna.distributions as d  # noqa: PLC0415 - a second of imports, paid by a search alone

        return d.FloatDistribution(float(self.values[0]), float(self.values[1]), log=self.log_scale)

    def nearest(self, value):
        """The value clipped into the range (its low end for a paper setting of null: threads, grad_clip)."""
        low, high = self.values
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            value = low
        return self.cast(min(max(value, low), high))

    def cast(self, value):
        return float(value)

    def typical(self):
        """The middle of the range: what a calibration trains when there is no paper setting."""
        low, high = self.values
        return self.nearest((low + high) / 2)

    def probe_values(self) -> list:
        """Both ends and, between them, a fraction TPE may draw (2.5 of uniform [1, 4], which a
        whole-number key such as batch_size refuses), low end first."""
        low, high = self.values
        return [float(low), low + 0.5 if high - low > 1 else (low + high) / 2, float(high)]


@dataclass(frozen=True)
class Uniform(Range):
    kind: ClassVar[str] = "uniform"


@dataclass(frozen=True)
class LogUniform(Range):
    kind: ClassVar[str] = "loguniform"
    log_scale: ClassVar[bool] = True

    @classmethod
    def check_low(cls, low, where: str, path) -> None:
        if low <= 0:
            raise SpecError(path, where, f"low must be positive for a log scale, got {low}")

    def typical(self):
        low, high = self.values
        return self.nearest(math.sqrt(low * high))


# An int range this short is probed at every value: 3 heads of d_model 128 sit inside [1, 8].
WHOLE_INT_RANGE = 64


@dataclass(frozen=True)
class IntRange(Range):
    kind: ClassVar[str] = "int"

    @classmethod
    def check_bounds(cls, values: list, where: str, path) -> None:
        if not all(float(v).is_integer() for v in values):
            raise SpecError(path, where, f"bounds must be integers, got {values}")

    def to_optuna(self):
        import optuna.distributions as d  # noqa: PLC0415 - a second of imports, paid by a search alone

        return d.IntDistribution(int(self.values[0]), int(self.values[1]))

    def cast(self, value):
        return int(round(value))

    def probe_values(self) -> list:
        """Every value of a short range, else both ends, low end first."""
        low, high = int(self.values[0]), int(self.values[1])
        return list(range(low, high + 1)) if high - low < WHOLE_INT_RANGE else [low, high]


# Each kind by its name in a file, in the order an error message lists them.
KINDS: dict[str, type[Distribution]] = {cls.kind: cls for cls in (LogUniform, Uniform, IntRange, Choice)}


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
