"""Build probes: what a pair's trials would build, built before launch (on the meta device: no data,
no weights), so that a value or a cell a trial would reject is refused with the file's key."""

from __future__ import annotations

import itertools
import re

from trainables.config import ConfigError, check_builds, parse_trial_config

from .source import SpecError
from .study import Pair


def check_builds_of(path, pair: Pair) -> None:
    """Build what a trial would build (its config, its task's config, its model, on the meta device:
    no data, no weights) in every grid cell, each with the space at its first values, and at every
    value a distribution's probe_values tries, one key at a time, in the first cell: so that a cell or
    a value a trial would reject is rejected before launch (a grid's keys combine: d_model 12 builds, 8 heads
    build, the two together do not). The line names the grid and space values the reason names."""
    tried = {k: d.probe_values() for k, d in pair.space.items()}
    first_values = {k: values[0] for k, values in tried.items()}
    cells = [dict(zip(pair.grid, values)) for values in itertools.product(*pair.grid.values())]
    # (what the probe varies, where a reason that names no key points: the cell, the space's value, or
    # fixed first)
    probes = [
        (cell, first_values, "fixed" if k == 0 else ", ".join(f"grid.{key}={v!r}" for key, v in cell.items()))
        for k, cell in enumerate(cells)
    ]
    probes += [
        (cells[0], {**first_values, key: v}, f"space.{key}={v!r}")
        for key, values in tried.items()
        for v in values[1:]
    ]
    for cell, searched, where in probes:
        try:
            check_builds(parse_trial_config({**pair.base, **searched, **cell}))
        except ConfigError as e:
            # the grid and space values the reason names (a bad low end of a range, a bad first cell),
            # else `where`
            named = [f"grid.{k}={v!r}" for k, v in cell.items()] + [
                f"space.{k}={v!r}" for k, v in searched.items()
            ]
            at_fault = [
                n for n in named if re.search(rf"\b{re.escape(n.split('.', 1)[1].split('=')[0])}\b", str(e))
            ]
            raise SpecError(path, f"{', '.join(at_fault) or where} ({pair.name})", str(e)) from None
