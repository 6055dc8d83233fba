"""The papers' published numbers (published.yaml) beside ours: which published cell a row of ours
meets (its model, task, split, score, checkpoint and setting), the paper's own values behind it
(its steps, its preset), our seeds tested against it allowing for its printed rounding, and the
papers' tables laid out as printed with ours beside each number.
"""

from __future__ import annotations

import dataclasses
import re
from functools import cache, lru_cache
from pathlib import Path

import yaml

from trainables.config import ConfigError, defaults, preset
from trainables.tasks import TASKS

from . import stats
from .frames import row_rank

PUBLISHED = Path(__file__).with_name("published.yaml")
PAPERS = {
    "ndr": "NDR (Csordás et al., ICLR 2022)",
    "panm": "PANM (Le et al.)",
    "compositional_attention": "Compositional Attention (Mittal et al.)",
}
PAPER_NAMES = {
    "ndr": "NDR",
    "panm": "PANM",
    "compositional_attention": "Compositional Attention",
}  # in a line, PAPERS without the authors


@cache
def task_fields(task: str) -> tuple[dataclasses.Field, ...]:
    """A task's config fields; none for a task the registry lacks (a published table's, not ours)."""
    return dataclasses.fields(TASKS[task].config) if task in TASKS else ()


def task_options(task: str) -> frozenset[str]:
    """The options a task's config takes (a length cut-off, a module): what the papers print as columns."""
    return frozenset(f.name for f in task_fields(task))


def task_defaults(task: str) -> dict:
    """The task options a spec that names none trains with (SCAN's cut-off 22)."""
    return {f.name: f.default for f in task_fields(task) if f.default is not dataclasses.MISSING}


class Printed(float):
    """A number as a paper printed it, with the unit it was rounded to: 1.00 is 0.01."""

    unit = 0.0


class PrintedLoader(yaml.SafeLoader):
    """Reads published.yaml's floats as Printed: the decimals written are the paper's."""


def construct_printed(loader: PrintedLoader, node: yaml.ScalarNode) -> Printed:
    number = Printed(loader.construct_yaml_float(node))
    number.unit = 10.0 ** -len(node.value.partition(".")[2])
    return number


PrintedLoader.add_constructor("tag:yaml.org,2002:float", construct_printed)


@lru_cache(maxsize=1)
def published_cells() -> tuple[dict, ...]:
    return tuple(yaml.load(PUBLISHED.read_text(), Loader=PrintedLoader) or ()) if PUBLISHED.exists() else ()


def vs_paper(values, cell: dict) -> float | None:
    """stats.paper_p of our seeds against a published cell, allowing for its printed rounding."""
    std = cell.get("std")
    return stats.paper_p(
        values,
        cell["mean"],
        std,
        cell.get("runs"),
        getattr(cell["mean"], "unit", 0.0),
        getattr(std, "unit", 0.0),
    )


@lru_cache(maxsize=1)
def varied_keys() -> dict[tuple[str, str], frozenset[str]]:
    """(model, task) -> the keys some published cell of theirs names in its setting."""
    out: dict[tuple[str, str], set] = {}
    for cell in published_cells():
        out.setdefault((cell.get("model"), cell.get("task")), set()).update(cell.get("setting") or {})
    return {pair: frozenset(keys) for pair, keys in out.items()}


def paper_setting(model: str, task: str, config: dict) -> dict:
    """The values the papers' tables hold fixed where a cell does not name them, for the keys some
    cell of the model and task varies (NDR's layers in Table 4, ACT in Table 6): the preset's, else
    the model's and the task's defaults. Empty where we have no preset for the pair."""
    varied = varied_keys().get((model, task), frozenset())
    try:
        paper = preset(task, model, config.get("task_options"))
    except ConfigError:
        return {}
    known = {**defaults(model), **task_defaults(task), **paper.get("task_options", {}), **paper}
    return {k: known[k] for k in varied if k in known}


def known_values(task: str, config: dict, model: str | None = None) -> dict:
    """A trial's values as a published cell or a claim names them: its config, its task options and
    the task's defaults, and with `model` the model's defaults (an NDR row's act: none)."""
    return {
        **(defaults(model) if model else {}),
        **task_defaults(task),
        **config.get("task_options", {}),
        **config,
    }


def published_for(
    model: str,
    task: str,
    variant: str | None,
    metric: str,
    grid: dict,
    config: dict,
    chosen: frozenset[str] = frozenset(),
) -> dict | None:
    """The paper's number for a row of ours: same model, task (and variant where the paper has one),
    the split and score of `metric`; a paper cell that names every key the row sweeps (a layer
    ablation's rows match Table 4, not Table 1's one setting) and every key the file fixed away
    from the paper's setting (NDR with 8 layers meets Table 4's 8-layer cell or none, not Table 1's
    14), and whose setting the trial's config and task options agree with. `chosen`: keys a search
    or a tuning (per_pair) picked, whose row is the model under its best values: the headline's."""
    split_score = re.match(
        r"^(test(?:_L|_x\d+|_\d+|_interpolate|_extrapolate)?|iid_valid)_"
        r"([a-z0-9_]+?)_(at_best_early|at_best|final)$",
        metric,
    )
    if not split_score:
        return None
    split, score, when = split_score.groups()
    # A cell's `checkpoint`: "early" (a column at an earlier budget, Table 2's 50K) meets only
    # *_at_best_early, "final" (the paper reports the last model: SCAN) only *_final; none, both
    # *_at_best and *_final.
    allowed = {"at_best_early": ("early",), "at_best": (None,), "final": (None, "final")}[when]
    known = known_values(task, config)
    swept = {k for k in grid if k != "candidate"}
    swept |= {
        k
        for k, v in paper_setting(model, task, config).items()
        if k not in chosen and k in known and known[k] != v
    }
    for cell in published_cells():
        if (cell.get("model"), cell.get("task"), cell.get("split"), cell.get("metric")) != (
            model,
            task,
            split,
            score,
        ) or cell.get("checkpoint") not in allowed:
            continue
        own = cell.get("setting") or {}
        if (
            cell.get("variant", variant) == variant
            and swept <= set(own)
            and all(k in known and known[k] == v for k, v in own.items())
        ):
            return cell
    return None


def paper_value(cell: dict | None, model: str, task: str, config: dict, key: str):
    """The paper's value of `key` (n_iters, d_model) behind a number: the published cell's own where
    it names one, else the preset's (trainables/presets); None where neither says."""
    if cell and cell.get(key) is not None:
        return cell[key]
    try:
        return preset(task, model, config.get("task_options")).get(key)
    except ConfigError:
        return None


def training_unlike_the_paper(cell: dict, model: str, task: str, config: dict) -> dict | None:
    """{key, ours, paper} where a run trained another number of steps than the paper's number beside
    it: the cell's own `n_iters` (a column at another length than the paper's setting: NDR Table
    6's 60k, Table 2's 50K), else its preset's (trainables/presets); ours is the run's n_iters, or
    for a `checkpoint: early` cell its early_budget where the run lasted that long. A shorter run
    (a CPU-scale check, a nightly's budget) gets no difference, since it says nothing of the model;
    a longer one gets it, said."""
    paper = paper_value(cell, model, task, config, "n_iters")
    # An early column's score is the best within early_budget, or within the whole run where that is
    # shorter (trainables.evaluation.Selection).
    early, n_iters = config.get("early_budget"), config.get("n_iters")
    early_column = (
        cell.get("checkpoint") == "early" and early is not None and (n_iters is None or early <= n_iters)
    )
    key, ours = ("early_budget", early) if early_column else ("n_iters", n_iters)
    return {"key": key, "ours": ours, "paper": paper} if None not in (ours, paper) and ours != paper else None


def task_setting(cell: dict) -> dict:
    """The task options a published cell names (a length cut-off, a module)."""
    return {k: v for k, v in (cell.get("setting") or {}).items() if k in task_options(cell["task"])}


def printed_row(cell: dict) -> tuple[str, str]:
    """The row a published cell is printed in: its model and the model's setting (layers, heads)."""
    own = {k: v for k, v in (cell.get("setting") or {}).items() if k not in task_setting(cell)}
    return cell["model"], ", ".join(f"{k}={v}" for k, v in own.items())


def printed_column(cell: dict) -> tuple:
    """The column a published cell is printed in: (task variant and setting, split, score, checkpoint)."""
    group = " ".join(
        [cell.get("variant") or cell["task"], *(f"{k}={v}" for k, v in task_setting(cell).items())]
    )
    when = {
        "early": f"best within {cell['n_iters']:,}" if cell.get("n_iters") else "early",
        "final": "final",
    }.get(cell.get("checkpoint"))
    return group, cell["split"], cell["metric"], when


def best_printed_rows(pairs: list[dict], metric: str, mode: str) -> dict[tuple, tuple[float, dict]]:
    """(pair, paper, table, printed row) -> (rank, {id(published cell): entry}): per pair and printed
    row, the one of the pair's cells that fills it (the best by `metric`, so that a row never mixes
    a search's candidates), and per number it met, the first metric in its order (at_best before
    final)."""
    best: dict[tuple, tuple[float, dict]] = {}
    for pair in pairs:
        for row in pair["rows"]:
            met: dict[tuple, dict] = {}
            for entry in row["metrics"].values():
                cell = entry["published"]
                if cell is not None:
                    printed = (pair["name"], cell["paper"], cell["table"], printed_row(cell))
                    met.setdefault(printed, {}).setdefault(id(cell), entry)
            rank = row_rank(row, metric, mode)
            for printed, entries in met.items():
                if printed not in best or rank > best[printed][0]:
                    best[printed] = (rank, entries)
    return best


def printed_table(paper: str, table: str, cells: list[dict], ours: dict) -> dict:
    """One paper's table as printed (`cells`: its published cells to show), ours (by id of the
    published cell) beside each number."""
    # a variant's columns side by side, in the paper's order
    groups = list(dict.fromkeys(printed_column(cell)[0] for cell in cells))
    columns = list(
        dict.fromkeys(
            printed_column(cell)
            for cell in sorted(cells, key=lambda cell: groups.index(printed_column(cell)[0]))
        )
    )
    one_score = len({column[2] for column in columns}) == 1
    rows = {}
    for cell in cells:
        entry = ours.get(id(cell))
        unlike = entry and entry["unlike"]
        rows.setdefault(printed_row(cell), {})[printed_column(cell)] = {
            "ours": entry and entry["summary"],
            "paper": cell,
            "trained": unlike and ("shorter" if unlike["ours"] < unlike["paper"] else "longer"),
        }
    return {
        "paper": PAPERS.get(paper, paper),
        "table": table,
        "columns": [
            {
                "key": (group, split, score, when),
                "label": " ".join(
                    part for part in (group, split, None if one_score else score, when) if part
                ),
            }
            for group, split, score, when in columns
        ],
        "rows": [
            {"model": model, "setting": setting, "cells": by_column}
            for (model, setting), by_column in rows.items()
        ],
    }


def paper_tables(pairs: list[dict], metric: str, mode: str) -> list[dict]:
    """The papers' tables laid out as printed, ours beside each number: every table one of our
    cells met, with a row per model and model setting (layers, heads) of it that we ran, or that
    the paper prints as a baseline we do not run, and a column per task variant and task setting
    (a length cut-off, a module), split and score. Where several of a pair's cells meet one printed
    row (a search's candidates), the best by `metric` fills it."""
    best = best_printed_rows(pairs, metric, mode)
    # A number two pairs met, from the better one.
    ours = {
        key: entry
        for _, entries in sorted(best.values(), key=lambda group: group[0])
        for key, entry in entries.items()
    }
    shown = {printed[1:] for printed in best}
    shown_tables = {printed[:2] for printed in shown}
    tables = {}
    for cell in published_cells():
        table = (cell["paper"], cell["table"])
        if (*table, printed_row(cell)) in shown or (cell.get("ours") is False and table in shown_tables):
            tables.setdefault(table, []).append(cell)
    return [printed_table(paper, table, cells, ours) for (paper, table), cells in tables.items()]
