"""A config dataclass's fields that state their own checks, and the checks that read them.

A field states its range, choices or pattern as metadata, by what it is built with:

    n_layers: int = ranged(14, 1, 1000)           # 1 <= n_layers <= 1000
    dropout: float = rate(0.1)                    # 0 <= dropout < 1
    gate_bias_init: float = finite(-3.0)          # any finite number
    optimizer: str = chosen("adamw", ("adamw", "adam", "rmsprop"))
    device: str = matching("auto", r"auto|cpu|mps", "auto, cpu or mps")

null passes a range where the field's type allows it (`int | None`). A rule between a config's keys
is its static `joint_problems(values) -> [(key, reason)]`, asked only where every field's own value
passes. A config checks itself in `__post_init__` with `validate(self)`; trainables.config.check
asks `problems(cls, values)` of a flat trial config's values before anything is built.

A problem is (key, reason); `problem_text(key, reason)` is its line: `key: reason`, or the reason
alone where key is "" (a rule between keys, whose reason names them).

A field that states nothing of a model of one's own (a Config without this metadata) gets the
range of its type: a whole number at least 1, a float finite.

Imports no torch: the plan reads these checks without building anything.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A count that builds a module each (layers, PANM's Mode-2 heads) stops at 1,000, a hundred times
# the papers' most: past that a count is a typo, and building it to check it (on the meta device)
# took minutes: an LSTM of 10^6 layers most of the memory, a PANM of 10^6 Mode-2 heads more than 20 s
# (mutations in tests/test_bad_input.py draw such counts).
MOST_MODULES = 1000
# A batch of samples stops at 2^24, thousands of times the shipped files' largest (2,048): past that a
# batch is a typo, and the dry run's cost of it (bytes moved, as floats) overflowed at 1e308.
MOST_SAMPLES = 1 << 24


def closest(word: str, options) -> str:
    """A hint at the option `word` was probably meant to be, or ""."""
    match = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


@dataclass(frozen=True)
class Range:
    low: float
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True

    def reason(self, value: Any, nullable: bool) -> str | None:
        """Why `value` is out of this range, or None where it is in it."""
        if value is None and nullable:
            return None
        if value is None or isinstance(value, bool):
            return f"expected a number, got {yaml_word(value) if value is not None else 'null'}"
        if not isinstance(value, (int, float)):
            return f"expected a number, got {value!r}"
        if not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        high = self.high
        if (
            value < self.low
            or (value == self.low and not self.low_inclusive)
            or (high is not None and (value > high or (value == high and not self.high_inclusive)))
        ):
            bound = f"{'at least' if self.low_inclusive else 'greater than'} {self.low}"
            if high is not None:
                bound += f" and {'at most' if self.high_inclusive else 'less than'} {high}"
            return f"must be {bound}, got {value!r}"
        return None


def ranged(default: Any, low: float, high: float | None = None, *, low_inclusive=True, high_inclusive=True):
    """A field whose value lies in [low, high] (None: no highest), each end left out where said."""
    return dataclasses.field(
        default=default, metadata={"range": Range(low, high, low_inclusive, high_inclusive)}
    )


def finite(default: float):
    """A field that takes any finite number."""
    return ranged(default, -math.inf)


def rate(default: float):
    """A field that takes a probability of dropping, in [0, 1)."""
    return ranged(default, 0, 1, high_inclusive=False)


def chosen(default: Any, choices: tuple):
    """A field that takes one of `choices`, each of its own type (1 is no `true`)."""
    return dataclasses.field(default=default, metadata={"choices": tuple(choices)})


def matching(default: str, pattern: str, described: str):
    """A field that takes text matching `pattern` whole; `described` says what does, in the reason."""
    return dataclasses.field(default=default, metadata={"pattern": (re.compile(pattern), described)})


def yaml_word(value) -> str:
    """A choice as a YAML file writes it (false, not False)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def problem_text(key: str, reason: str) -> str:
    """A problem's line: `key: reason`, or the reason alone where key is ""."""
    return f"{key}: {reason}" if key else reason


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """A config dataclass's fields' types, read once per class (a dry run checks hundreds of
    configs, and typing.get_type_hints evaluates every annotation each time)."""
    return typing.get_type_hints(cls)


def type_range(hint) -> Range | None:
    """The range of a field that states none (a model of one's own), by its type."""
    if hint in (int, int | None):
        return Range(1)
    if hint is float:
        return Range(-math.inf)
    return None


def refusal(f: dataclasses.Field, hint, value: Any) -> str | None:
    """Why field `f` (of type `hint`) refuses `value`, or None where it takes it."""
    if "choices" in f.metadata:
        choices = f.metadata["choices"]
        if any(value == c and type(value) is type(c) for c in choices):
            return None
        return f"must be one of {', '.join(yaml_word(c) for c in choices)}, got {value!r}"
    if "pattern" in f.metadata:
        pattern, described = f.metadata["pattern"]
        return (
            None
            if isinstance(value, str) and pattern.fullmatch(value)
            else f"must be {described}, got {value!r}"
        )
    bounds = f.metadata["range"] if "range" in f.metadata else type_range(hint)
    return bounds and bounds.reason(value, nullable=type(None) in typing.get_args(hint))


def defaults(cls: type) -> dict[str, Any]:
    """Each field of `cls` that has a default, with it."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def problems(cls: type, values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, reason) of each of `values` (fields of `cls` by name) its field refuses, in the fields'
    order; where there is none, the problems of cls.joint_problems over `values` beside the defaults."""
    types = hints(cls)
    found = [
        (f.name, reason)
        for f in dataclasses.fields(cls)
        if f.name in values and (reason := refusal(f, types[f.name], values[f.name]))
    ]
    joint = getattr(cls, "joint_problems", None)
    if found or joint is None:
        return found
    return list(joint({**defaults(cls), **values}))


def validate(config) -> None:
    """Raise ValueError with the line of `config`'s first problem: what a config's __post_init__ runs."""
    found = problems(type(config), {f.name: getattr(config, f.name) for f in dataclasses.fields(config)})
    if found:
        raise ValueError(problem_text(*found[0]))
