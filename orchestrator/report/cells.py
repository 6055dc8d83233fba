"""A cell's row of the report (an ablation's grid cell, a confirmation's candidate, a search's best
trial) over its seeds: per metric its summary (stats.summarize), the paper's number and our seeds
tested against it, and the test against its baseline cell; the seeds that did not finish.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pandas as pd

from . import stats
from .frames import NAMED_TEST_SPLITS, lower_is_better, numeric_order, setting_key, unfinished
from .papers import published_for, training_unlike_the_paper, vs_paper


def metric_entry(
    values: list, metric: str, first, setting: dict, report, chosen: frozenset[str], against: list | None
) -> dict:
    """A cell's entry for one metric: its summary, the paper's number (and our seeds tested against
    it), and the test against its baseline cell's values (`against`)."""
    low = lower_is_better(metric)
    summary = stats.summarize(values, report.solved_at if metric.startswith("test_") else None, low)
    cell = published_for(
        first["model"], first["task"], first["variant"], metric, setting, first["config"], chosen
    )
    entry = {
        "summary": summary,
        "values": values,
        "published": cell,
        "unlike": cell and training_unlike_the_paper(cell, first["model"], first["task"], first["config"]),
    }
    shorter = entry["unlike"] and entry["unlike"]["ours"] < entry["unlike"]["paper"]
    if cell and not shorter and cell.get("statistic") != "median":
        entry["vs_paper"] = vs_paper(values, cell)
    if against is not None and len(values) > 1 and len(against) > 1:
        entry["vs_baseline"] = stats.two_sided_p(values, against, report.test)
    return entry


def paper_entry(metrics: dict, score: str) -> dict | None:
    """The paper column: the test score at the checkpoint the paper reports (the best one, or the
    last); where the paper reports one named test set (mathematics: extrapolation), that one."""
    candidates = [
        f"test{split}_{score}_{when}"
        for split in ("", *(f"_{n}" for n in NAMED_TEST_SPLITS))
        for when in ("at_best", "final")
    ]
    return next(
        (metrics[m] for m in candidates if m in metrics and metrics[m]["published"]),
        metrics.get(f"test_{score}_at_best"),
    )


def cell_rows(
    frame: pd.DataFrame,
    keys: list[str],
    metrics: list[str],
    report,
    baseline: dict,
    score: str,
    chosen: frozenset[str] = frozenset(),
) -> list[dict]:
    """Per grid cell (in numeric order): the seeds and, per metric, its summary, the paper's number,
    and the test against its baseline cell: the cell with the baseline's values and the row's own
    values of the keys the baseline does not name (a pair whose model lacks a baseline key, as an
    LSTM has no heads, has none)."""
    frame = frame.assign(**{k: frame["config"].map(lambda c, k=k: c.get(k)) for k in keys + ["seed"]})
    ordered = (
        frame.sort_values(keys, key=lambda col: col.map({v: i for i, v in enumerate(numeric_order(col))}))
        if keys
        else frame
    )
    cells = [
        (dict(zip(keys, cell if isinstance(cell, tuple) else (cell,))), group)
        for cell, group in (ordered.groupby(keys, sort=False) if keys else [((), ordered)])
    ]
    by_setting = {setting_key(setting): group for setting, group in cells}
    baseline = baseline if set(baseline) <= set(keys) else {}
    rows = []
    for setting, group in cells:
        base_setting = {**setting, **baseline}
        base_rows = (
            by_setting.get(setting_key(base_setting)) if baseline and base_setting != setting else None
        )
        first = group.iloc[0]
        row = {
            "setting": setting,
            "seeds": sorted(int(s) for s in group["seed"]),
            "config": first["config"],
            "metrics": {},
        }
        for metric in metrics:
            values = group[metric].dropna().tolist()
            if not values:
                continue
            against = (
                base_rows[metric].dropna().tolist() if base_rows is not None and metric in base_rows else None
            )
            row["metrics"][metric] = metric_entry(values, metric, first, setting, report, chosen, against)
        row["paper"] = paper_entry(row["metrics"], score)
        rows.append(row)
    return rows


def mark_unfinished(rows: list[dict], ended: dict[str, Counter]) -> None:
    """The cell's runs that ended without a result: its seeds column says so."""
    for r in rows:
        cell_ended = ended.get(setting_key(r["setting"]), Counter())
        r["unfinished"] = unfinished(cell_ended)
        # A seed whose training blew up solved nothing (a failed one may be the cluster's fault).
        if cell_ended["diverged"]:
            for entry in r["metrics"].values():
                s = entry["summary"]
                if s.solved is not None:
                    entry["summary"] = dataclasses.replace(
                        s, solved=s.solved * s.n / (s.n + cell_ended["diverged"])
                    )
