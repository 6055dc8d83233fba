"""Probes: what a pair's trials would be, judged before launch, so that a value, a cell or a
combination a trial would refuse is refused with the file's key. The judge is trainables'
(config.check: every key of a flat trial config, no build); each probe is then built (on the meta
device: no data, no weights) for what only a constructor finds."""

from __future__ import annotations

import itertools
import re

from trainables.config import ConfigError, check, check_builds, parse_trial_config
from trainables.fields import problem_text

from .source import SpecError
from .study import Pair

# The most combinations of a space's choices judged per pair (each a check, no build): a choice of
# d_model and one of n_heads combine, and 5 heads of d_model 120 are refused before launch.
CHOICE_COMBINATIONS = 1000


def check_trials(path, pair: Pair, labels: dict[str, str], build: bool) -> None:
    """Judge (trainables.config.check) every grid cell, each with the space at its first values, and
    every value a distribution's probe_values tries, one key at a time, in the first cell, then
    every combination of the space's choices (up to CHOICE_COMBINATIONS); then build each cell and
    probed value: a grid's keys combine (d_model 12 builds, 8 heads build, the two together do not).
    `labels`: the file's key of each key a model's own section gives that the model lacks. Not
    `build`: a launch's plan read again, which built at launch, builds nothing (and needs no torch)."""
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
    choices = {k: d.choices for k, d in pair.space.items() if d.choices}
    combined = itertools.islice(itertools.product(*choices.values()), CHOICE_COMBINATIONS)
    judged = probes + [
        (cells[0], {**first_values, **dict(zip(choices, values))}, "space") for values in combined
    ]
    for cell, searched, where in judged:
        refuse(path, pair.name, check({**pair.base, **searched, **cell}), labels, cell, searched, where)
    for cell, searched, where in probes if build else ():
        try:
            check_builds(parse_trial_config({**pair.base, **searched, **cell}))
        except ConfigError as e:
            refuse(path, pair.name, [("", str(e))], labels, cell, searched, where)


def refuse(
    path, name: str, found: list, labels: dict[str, str], cell: dict, searched: dict, where: str
) -> None:
    """SpecError with the first of `found` (a probe's (key, reason) problems): an unknown key a model's
    own section gives by its file key (`labels`); else with the grid and space values the line names
    (a bad low end of a range, a bad first cell), else `where`; then the pair's `name`."""
    if not found:
        return
    key, reason = found[0]
    if key in labels:
        raise SpecError(path, labels[key], reason)
    text = problem_text(key, reason)
    named = [f"grid.{k}={v!r}" for k, v in cell.items()] + [f"space.{k}={v!r}" for k, v in searched.items()]
    at_fault = [n for n in named if re.search(rf"\b{re.escape(n.split('.', 1)[1].split('=')[0])}\b", text)]
    raise SpecError(path, f"{', '.join(at_fault) or where} ({name})", text)
