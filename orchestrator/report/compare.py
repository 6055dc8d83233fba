"""A launch's cells against an earlier launch's (last night's): the cells a test across seeds
compares (stats.regressions), the cells whose runs stopped finishing, the cells whose config changed
since or that pool several configs, and each regression's line.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

from . import stats
from .cells import cell_rows
from .frames import (
    cell_configs,
    cell_name,
    config_changes,
    lower_is_better,
    pooled_differences,
    setting_key,
    unfinished,
)


def broken_cells(pair: str, now: dict[str, Counter], before: dict[str, Counter]) -> dict[str, str]:
    """Cells whose runs stopped finishing, by setting_key -> the regression's line: at least half
    the earlier launch's runs completed (two at least, so that it was tested), fewer than half of this
    one's. A test across seeds cannot see them: it compares the completed runs alone, and a cell
    without two has none to compare."""
    out = {}
    for key, was in before.items():
        ended = now.get(key, Counter())
        if (
            was["completed"] >= 2
            and 2 * was["completed"] >= was.total()
            and 2 * ended["completed"] < ended.total()
        ):
            out[key] = (
                f"{pair} {cell_name(json.loads(key))}: {ended['completed']} of {ended.total()} runs "
                f"completed ({unfinished(ended)}); {was['completed']} of {was.total()} before"
            )
    return out


@dataclasses.dataclass
class Tally:
    """The comparison with the earlier launch, gathered pair by pair: the cells to test across seeds
    (stats.regressions' input), the broken cells' lines, how many cells both launches or one of them
    have, and the cells whose config changed since or that pool several configs."""

    tested: list = dataclasses.field(default_factory=list)
    broken: list = dataclasses.field(default_factory=list)
    in_both: int = 0
    one_sided: int = 0
    changed: dict = dataclasses.field(default_factory=dict)  # (pair, cell) -> its config's changes
    not_comparable: list = dataclasses.field(default_factory=list)


def compare_cells(
    tally: Tally, study, pair: str, rows: list[dict], runs, earlier, own_keys: list[str], metrics: list[str]
) -> None:
    """The pair's cells against the earlier launch's (`earlier`: its completed runs of the pair):
    each row's metrics get the earlier mean (`was`), and into `tally` go the cells to test, the
    cells whose config changed, and those that pool several configs (not compared)."""
    old = {
        setting_key(r["setting"]): r
        for r in cell_rows(earlier, own_keys, metrics, study.report, {}, study.score)
    }
    trained_now, trained_before = cell_configs(runs, own_keys), cell_configs(earlier, own_keys)
    for r in rows:
        key = setting_key(r["setting"])
        was = old.get(key)
        if was is None:
            continue
        pooled = [
            (side, trained[key])
            for side, trained in (("earlier", trained_before), ("this", trained_now))
            if len(trained[key]) > 1
        ]
        if pooled:  # no one config to compare: a mean over several says nothing of a change
            tally.not_comparable.append(
                f"{pair} {cell_name(r['setting'])}: not compared, the {pooled[0][0]} launch's runs of "
                f"this cell differ in {pooled_differences(pooled[0][1])}"
            )
            continue
        change = config_changes(trained_before[key][0], trained_now[key][0])
        if change:
            tally.changed[(pair, cell_name(r["setting"]))] = change
        for metric in metrics:
            if was and metric in was["metrics"] and metric in r["metrics"]:
                r["metrics"][metric]["was"] = was["metrics"][metric]["summary"].mean
                if metric == f"test_{study.score}_at_best":
                    tally.tested.append(
                        (
                            (pair, cell_name(r["setting"]), metric),
                            r["metrics"][metric]["values"],
                            was["metrics"][metric]["values"],
                            lower_is_better(metric),
                        )
                    )


def flag_regressions(pairs: list[dict], comparisons: list, score: str) -> None:
    """Marks each row whose test score the comparison flagged, for its table."""
    flagged = {c.key for c in comparisons if c.regressed}
    for entry in pairs:
        for r in entry["rows"]:
            metric = f"test_{score}_at_best"
            if (entry["name"], cell_name(r["setting"]), metric) in flagged:
                r["metrics"][metric]["regressed"] = True


def regression_text(c: stats.Comparison, change: str | None = None, code: tuple[str, str] = ("", "")) -> str:
    """A cell that regressed: pair, cell, metric, its mean before -> now, by how much it got worse,
    p; what its config (its data's hash among it) changed since, and the two commits where the code
    did: what a reader bisects between."""
    since = f"; its config changed since: {change}" if change else ""
    since += f"; the code changed since: {code[0]} -> {code[1]}" if code[0] != code[1] else ""
    return (
        f"{c.key[0]} {c.key[1]} {c.key[2]}: {c.before:.3f} -> {c.now:.3f} "
        f"(worse by {abs(c.now - c.before):.3f}, p = {c.p:.3g}){since}"
    )
