"""Reports of a launch: per ablation grid cell (or per confirmed candidate of a search, or a
search's best trial) over seeds, n, mean ± std, a Student-t 95% interval,
the solved rate and the best seed (stats.py), beside the papers' numbers (published.yaml), with
plots (one panel per swept key, and test score per test length where a task has several).

Read from MLflow (the trials' `trial_config` tags and metrics), rendered from the Jinja2 templates
in templates/ to `<launch>/report/` (report.md, report.html with its plots embedded, one PNG per
pair and figure) and logged as artifacts of the launch's parent run. Compared with a previous
launch (last night's), a cell regresses only where a one-sided test across seeds says so
(stats.regressions: Holm-corrected, with a minimum effect).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import urllib.parse
import warnings
from collections import Counter
from functools import cache, lru_cache
from pathlib import Path
from statistics import fmean

import jinja2
import optuna
import pandas as pd
import yaml

from trainables.scores import LOWER_IS_BETTER

from ..record.mlflow_ui import save_view, trials_view, ui_address, ui_links
from ..record.optuna_store import search_storage
from ..record.ranking import Ranking
from ..record.runs import (
    CONFIG_TAG,
    DATA_HASH_TAG,
    DIVERGED_AT_TAG,
    ENDED,
    MAX_BATCH,
    STATUS_TAG,
    launch_trial_runs,
)
from ..record.state import baseline_nights, earlier_launches
from ..record.stores import client
from ..record.summaries import fall_text, may_answer, metric_name, outcome_text, pair_summaries
from . import maps, plots, stats
from .plots import draw_chance, figure_png, pyplot, set_suptitle, set_title

TEMPLATES = Path(__file__).with_name("templates")
PUBLISHED = Path(__file__).with_name("published.yaml")
MAX_DEPTH_COLUMNS = 4
NAMED_TEST_SPLITS = ("interpolate", "extrapolate")
TEST_SPLIT = re.compile(
    r"^test_(L|x\d+|\d+|depth\d+)_"
)  # per-length test splits (PANM's tasks; Dyck's lengths), per-depth scores (the others)


def split_label(metric: str) -> str:
    """A test score's split as a column names it (L, x2, depth3, 20); the whole test set's: test."""
    found = TEST_SPLIT.match(metric)
    return found.group(1) if found else "test"


def split_order(split: str) -> int:
    """L before 1x, 2x, ...; lengths and depths in order."""
    return -1 if split == "L" else int(re.sub(r"\D", "", split))


def lower_is_better(metric: str) -> bool:
    return any(f"_{score}_" in f"_{metric}_" for score in LOWER_IS_BETTER)


def runs_frame(state, runs: list | None = None, statuses: tuple[str, ...] = ("completed",)) -> pd.DataFrame:
    """One row per trial of the launch (of `runs`, its trial runs where already read) whose status is
    one of `statuses`: pair, model, task, variant, status, its full config's grid keys and seed,
    and every metric MLflow holds for it (the last value of each)."""
    rows = []
    for run in (
        launch_trial_runs(state.tracking_uri, state.experiment, state.launch_id) if runs is None else runs
    ):
        status = run.data.tags.get(STATUS_TAG)
        if status not in statuses:
            continue
        config = json.loads(run.data.tags[CONFIG_TAG])
        if "candidate" in run.data.tags:  # a confirmation run: its candidate is its cell
            config["candidate"] = int(run.data.tags["candidate"]) + 1
        rows.append(
            {
                "pair": run.data.tags["pair"],
                "model": run.data.tags.get("model"),
                "task": run.data.tags.get("task"),
                "variant": run.data.tags.get("variant"),
                "phase": run.data.tags.get("phase", "search"),
                "status": status,
                "run_id": run.info.run_id,
                "config": config,
                "data_hash": run.data.tags.get(DATA_HASH_TAG, "unknown"),
                **run.data.metrics,
            }
        )
    return pd.DataFrame(rows)


def completed(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "completed"] if len(frame) else frame


def setting_key(setting: dict) -> str:
    return json.dumps(setting, sort_keys=True, default=str)


UNSCORED = "completed without a score"  # a test score of NaN (an empty split's ratio, a perplexity)


def outcomes(frame: pd.DataFrame, study, pair) -> dict[str, Counter]:
    """How the runs behind each of the pair's rows ended (`frame`: runs_frame over runs.ENDED), by
    setting_key: an ablation's cells, a confirmation's candidates; nothing for a search's best trial.
    A completed run without a test score is UNSCORED: a cell of such runs had passed a comparison,
    as "without two completed runs"."""
    keys = list(pair.grid) if study.is_ablation else ["candidate"]
    runs = (
        frame[(frame["pair"] == pair.name) & ((frame["phase"] == "confirm") | study.is_ablation)]
        if len(frame)
        else frame
    )
    if not len(runs):
        return {}
    settings = runs["config"].map(lambda config: setting_key({k: config.get(k) for k in keys}))
    score = f"test_{study.score}_at_best"
    scored = runs[score].notna() if score in runs else pd.Series(False, index=runs.index)
    status = runs["status"].where(scored | (runs["status"] != "completed"), UNSCORED)
    return {key: Counter(group) for key, group in status.groupby(settings)}


def unfinished(ended: Counter) -> str:
    """The runs of a cell that ended without completing, in words: '1 diverged, 2 failed'."""
    return ", ".join(
        f"{ended[status]} {status}"
        for status in (*ENDED, UNSCORED)
        if status != "completed" and ended[status]
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


NOT_COMPARED_KEYS = (
    "seed",
    "device",
    "threads",
)  # which seed, where and on how many threads a run trained: not what


def flat_config(config: dict, data_hash: str) -> dict:
    """What a run trained, as one flat mapping (task options as `task_options.<key>`) with the hash
    of its data: runs that differ in it neither pool into one comparison nor compare."""
    options = {f"task_options.{k}": v for k, v in (config.get("task_options") or {}).items()}
    own = {k: v for k, v in config.items() if k != "task_options" and k not in NOT_COMPARED_KEYS}
    return {**own, **options, "data_hash": data_hash}


def cell_configs(runs: pd.DataFrame, keys: list[str]) -> dict[str, list[dict]]:
    """The distinct configs (flat_config) the runs of each cell trained, by setting_key: one, unless
    the cell pools runs that differ in a key it does not name (a grid key dropped since)."""
    out: dict[str, list[dict]] = {}
    for config, data_hash in zip(runs["config"], runs["data_hash"]) if len(runs) else ():
        trained = flat_config(config, data_hash)
        cell = out.setdefault(setting_key({k: config.get(k) for k in keys}), [])
        if trained not in cell:
            cell.append(trained)
    return out


def config_changes(before: dict, now: dict) -> str:
    """'lr 0.01 -> 1e-07, n_iters 300 -> 200': the keys whose values differ, in words ('' if none)."""
    keys = sorted(set(before) | set(now))
    return ", ".join(
        f"{k} {before.get(k, '-')} -> {now.get(k, '-')}" for k in keys if before.get(k) != now.get(k)
    )


def pooled_differences(configs: list[dict]) -> str:
    """The keys in which a cell's pooled configs differ, in words."""
    keys = sorted({k for c in configs for k in c if any(c.get(k) != o.get(k) for o in configs)})
    return ", ".join(f"{k} ({', '.join(sorted({str(c.get(k, '-')) for c in configs}))})" for k in keys)


def one_data(runs: pd.DataFrame, among: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """`runs` (a pair's) less those on other data than most of `among` (the runs of every pair of its
    task config, in the order they started; the later hash where two tie), and a line naming those
    left out: runs on different data are neither pooled nor compared (a resume after the generator
    changed). '' where all agree."""
    if not len(among) or among["data_hash"].nunique() < 2:
        return runs, ""
    counts = among.groupby("data_hash", sort=False).size()
    kept = counts[counts == counts.max()].index[-1]
    other = runs[runs["data_hash"] != kept]
    if not len(other):
        return runs, ""
    hashes = ", ".join(sorted(other["data_hash"].unique()))
    return runs[runs["data_hash"] == kept], (
        f"{len(other)} run(s) trained on other data (data_hash {hashes}) than the task's other runs "
        f"({kept}) are left out: runs on different data are neither pooled nor compared"
    )


def task_runs(frame: pd.DataFrame, pair) -> pd.DataFrame:
    """The runs of every pair on `pair`'s task config (its task and variant)."""
    if not len(frame):
        return frame
    return frame[(frame["task"] == pair.task.task) & (frame["variant"] == pair.task.variant)]


def answer_runs(runs: pd.DataFrame, study, pair) -> tuple[pd.DataFrame, list[str]]:
    """The runs a pair's rows come from, and the keys that make a row: an ablation's cells; a
    confirmed search's candidates over their seeds; else the search's best trial alone."""
    if study.is_ablation:
        return runs, list(pair.grid)
    confirmed = runs[runs["phase"] == "confirm"]
    if len(confirmed):
        return confirmed, ["candidate"]
    search = runs[runs["phase"] == "search"].dropna(subset=[study.metric])
    rows = search.to_dict("records")
    choice = Ranking.of(study.metric, study.score, study.mode).best(rows, lambda row: row)
    return (search.iloc[[choice.index]] if choice else search[:0]), []


def cell_name(setting: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in setting.items()) or "(seeds only)"


def numeric_key(value) -> tuple:
    """Sorts numbers as numbers (10 after 8, not before 4), before anything else as text."""
    return (
        (0, float(value), "")
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else (1, 0.0, str(value))
    )


def numeric_order(values) -> list:
    """Grid values in numeric order where they are numbers."""
    return sorted(set(values), key=numeric_key)


def table_metrics(score: str, columns) -> list[str]:
    """What the cell table shows: the selection metric, then the test and IID scores as the papers
    report them (at the best checkpoint and final), where the runs have them. A handful of test
    depths (Sort-of-CLEVR's three question types, the paper's columns) are columns too; a range of
    them (CTL's) is a curve (plot_lengths). Named test sets (mathematics' interpolation and
    extrapolation) get both columns each."""
    wanted = [
        f"best_ood_valid_{score}",
        f"test_{score}_at_best",
        f"test_{score}_final",
        f"test_{score}_at_best_early",
        f"iid_valid_{score}_at_best",
        f"iid_valid_{score}_final",
    ]
    wanted += [f"test_{name}_{score}_{when}" for name in NAMED_TEST_SPLITS for when in ("at_best", "final")]
    depths = sorted(
        (c for c in columns if re.fullmatch(rf"test_depth\d+_{score}_at_best", c)),
        key=lambda c: int(re.sub(r"\D", "", c.split("_")[1])),
    )
    return [m for m in wanted if m in columns] + (depths if len(depths) <= MAX_DEPTH_COLUMNS else [])


@cache
def task_fields(task: str) -> tuple[dataclasses.Field, ...]:
    """A task's config fields; none for a task the registry lacks (a published table's, not ours)."""
    from trainables.tasks import TASKS  # noqa: PLC0415 - it imports torch, which `report` goes without

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
    from trainables.config import ConfigError, defaults, preset  # noqa: PLC0415 - it imports torch

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
    from trainables.config import defaults  # noqa: PLC0415 - it imports torch

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
    from trainables.config import ConfigError, preset  # noqa: PLC0415 - it imports torch

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
    # shorter (train.py).
    early, n_iters = config.get("early_budget"), config.get("n_iters")
    early_column = (
        cell.get("checkpoint") == "early" and early is not None and (n_iters is None or early <= n_iters)
    )
    key, ours = ("early_budget", early) if early_column else ("n_iters", n_iters)
    return {"key": key, "ours": ours, "paper": paper} if None not in (ours, paper) and ours != paper else None


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


def scored_pairs(
    pairs: list, variant: str, metric: str, summaries: dict, seeds: dict, confirmed: bool
) -> list:
    """(pair, its value of `metric`, the paper's cell for it) per pair with a value: the mean over
    its confirmed candidate's seeds where `confirmed`, else its best trial's."""
    scored = []
    for pair in pairs:
        s = summaries.get(pair.name, {})
        value = fmean(seeds[pair.name]) if confirmed else (s.get("best_metrics") or {}).get(metric)
        if value is not None:
            config = s["confirmed"]["config"] if confirmed else s.get("best_config") or {}
            paper = published_for(pair.model, pair.task.task, variant, metric, {}, config, pair.chosen)
            scored.append((pair, value, paper))
    return scored


def winner_p(study, scored: list, seeds: dict, confirmed: bool) -> float | None:
    """The two-sided p of the winner against the runner-up across their confirmed seeds (report.test);
    None where untested: each pair's best trial, one pair, or a side of one seed."""
    if not confirmed or len(scored) < 2:
        return None
    winner, runner_up = seeds[scored[0][0].name], seeds[scored[1][0].name]
    if min(len(winner), len(runner_up)) < 2:
        return None
    return stats.two_sided_p(winner, runner_up, study.report.test)


def answer_basis(study, scored: list, seeds: dict, confirmed: bool, p_value: float | None) -> str:
    """What the answer compared: each pair's best trial, or its confirmed candidate over seeds with
    the test of the winner against the runner-up."""
    if not confirmed:
        return "each pair's best trial"
    basis = (
        "each pair's confirmed candidate, the mean over its seeds ("
        + ", ".join(f"{p.model} {len(seeds[p.name])}" for p, _, _ in scored)
        + ")"
    )
    if p_value is not None:
        basis += (
            f"; {scored[0][0].model} against {scored[1][0].model}: p = {p_value:.3g} "
            f"({study.report.test}, two-sided, alpha {study.report.alpha:g})"
        )
    return basis


def beyond_chance(study, values: list[float], chance: float, metric: str) -> bool:
    """Whether a model's score is past chance: over seeds, by the report's test, one-sided, at its
    alpha; a single trial cannot be tested, so only a score at or short of chance counts as chance."""
    low = lower_is_better(metric)
    if len(values) < 2:
        return values[0] < chance if low else values[0] > chance
    return stats.beyond_chance_p(values, chance, low, study.report.test) < study.report.alpha


def no_winner(study, scored: list, values: dict, chance: float | None, p_value: float | None) -> str | None:
    """The answer's first words where it crowns no model: none passes chance, or the top two do not
    differ at the report's alpha; None where the top one generalizes best."""
    if chance is not None and not any(
        beyond_chance(study, values[pair.name], chance, study.headline) for pair, _, _ in scored
    ):
        return "no model generalizes beyond chance"
    if p_value is not None and p_value >= study.report.alpha:
        return f"no significant difference between {scored[0][0].model} and {scored[1][0].model}"
    return None


def tie_words(study, winner, summaries: dict) -> str:
    """Where the winner's best trial tied others on the metric: what chose it (ranking.Ranking)."""
    decided_by = summaries.get(winner.name, {}).get("decided_by")
    return (
        f" ({winner.model}'s best trial tied others on {study.metric}; chosen by {decided_by})"
        if decided_by
        else ""
    )


def variant_answer(study, variant: str, scored: list, seeds: dict, confirmed: bool) -> str:
    """A task's answer line: the winner, or why none (no_winner), then every model's score, the top
    one's beside chance, and what was compared."""
    metric = study.headline
    (winner, value, _), chance = scored[0], plots.chance_level(scored[0][0].chance(study.score))
    values = {pair.name: seeds[pair.name] if confirmed else [score] for pair, score, _ in scored}
    p_value = winner_p(study, scored, seeds, confirmed)
    doubt = no_winner(study, scored, values, chance, p_value)
    words, named = (doubt, f"{winner.model} ") if doubt else (f"{winner.model} generalizes best", "")
    versus = ", ".join(f"{pair.model} {other:.3f}" for pair, other, _ in scored[1:])
    return (
        f"answer on {variant}: {words}, {metric} {named}{value:.3f}"
        + (f" ({value - chance:+.3f} from chance, {chance:.3f})" if chance is not None else "")
        + (f" vs {versus}" if versus else "")
        + f"; {answer_basis(study, scored, seeds, confirmed, p_value)}, at this launch's scale"
    )


def fallen_words(pairs: list, summaries: dict, metric: str) -> str:
    """The pairs whose every trial diverged or failed, as the answer names them beside the others
    (summaries.fall_text): "; mine diverged at step 60, test_acc_at_best 0.150 before it"."""
    return "".join(
        f"; {fall_text(pair.model, summaries[pair.name]['fell'], metric)}"
        for pair in pairs
        if summaries.get(pair.name, {}).get("fell")
    )


def answer_lines(study, summaries: dict) -> list[str]:
    """What a search's summary means, per task: which model generalizes best on the file's headline
    test split (report.headline), or that none passes chance or the top two do not differ
    (no_winner), how far the top one is from chance, and what the papers report for the same
    split at full scale (a line of its own, indented). Where every pair's search was confirmed, by
    its confirmed candidate's mean over seeds, with the file's test (report.test) of the winner
    against the runner-up; else by each pair's best trial. The launch's closing lines and the
    report's first section."""
    metric = study.headline
    lines = []
    for variant in dict.fromkeys(p.task.variant for p in study.pairs):
        pairs = [p for p in study.pairs if p.task.variant == variant]
        seeds = {
            p.name: ((summaries.get(p.name, {}).get("confirmed") or {}).get("splits") or {}).get(metric)
            for p in pairs
        }
        confirmed = all(seeds.values())
        scored = scored_pairs(pairs, variant, metric, summaries, seeds, confirmed)
        # None: no trial ended with a score, or the file's report.headline names a split the task lacks.
        if not scored:
            lines.append(
                f"no answer on {variant}: no pair's best trial reported {metric}"
                + fallen_words(pairs, summaries, metric)
            )
            continue
        scored.sort(key=lambda e: e[1], reverse=not lower_is_better(metric))
        lines.append(
            variant_answer(study, variant, scored, seeds, confirmed)
            + ("" if confirmed else tie_words(study, scored[0][0], summaries))
            + fallen_words(pairs, summaries, metric)
        )
        papers = [
            f"{pair.model} {paper['mean']:.2f} "
            f"({PAPER_NAMES.get(paper['paper'], paper['paper'])} {paper['table']})"
            for pair, _, paper in scored
            if paper
        ]
        if papers:
            lines.append(f"  at full scale the papers report: {', '.join(papers)}")
    return lines


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


def row_rank(row: dict, metric: str, mode: str) -> float:
    """A cell's rank by its mean `metric` (higher is better); a cell without it ranks last."""
    summary = row["metrics"].get(metric, {}).get("summary")
    return -float("inf") if summary is None else summary.mean if mode == "max" else -summary.mean


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


def plot_keys(
    pair: str, rows: list[dict], keys: list[str], metric: str, chance: str, out_dir: Path
) -> list[tuple[Path, str]]:
    """One panel per swept key: the metric's mean (95% interval) against that key's values, in
    numeric order, one line per combination of the other keys' values."""
    plt = pyplot()
    swept = [k for k in keys if len({str(r["setting"][k]) for r in rows}) > 1] or keys[:1]
    if not swept:
        return []
    fig, axes = plt.subplots(1, len(swept), figsize=(5 * len(swept), 3.6), squeeze=False)
    for ax, key in zip(axes[0], swept):
        others = [k for k in keys if k != key]
        lines: dict[tuple, list] = {}
        for r in rows:
            if metric in r["metrics"]:
                lines.setdefault(tuple(r["setting"][k] for k in others), []).append(r)
        for rest, members in lines.items():
            members = sorted(
                members,
                key=lambda r: numeric_order([m["setting"][key] for m in members]).index(r["setting"][key]),
            )
            xs = [str(m["setting"][key]) for m in members]
            means = [m["metrics"][metric]["summary"].mean for m in members]
            errors = [
                [
                    mean - (m["metrics"][metric]["summary"].ci or (mean, mean))[0]
                    for m, mean in zip(members, means)
                ],
                [
                    (m["metrics"][metric]["summary"].ci or (mean, mean))[1] - mean
                    for m, mean in zip(members, means)
                ],
            ]
            label = ", ".join(f"{k}={v}" for k, v in zip(others, rest)) or metric
            ax.errorbar(xs, means, yerr=errors, marker="o", capsize=3, label=label)
        draw_chance(ax, chance, metric)
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        if len(lines) > 1 or chance:
            ax.legend(fontsize=7, loc="best")
    set_suptitle(fig, f"{pair}: {metric} (mean, 95% interval)")
    path = out_dir / f"{pair}.png"
    return [(path, figure_png(fig, path))]


def plot_lengths(
    pair: str, rows: list[dict], frame: pd.DataFrame, score: str, chance: str, out_dir: Path
) -> list[tuple[Path, str]]:
    """Test score per test length (PANM's L, 1x..8x) or depth, a line per cell, the paper's points
    beside: drawn where a pair has several cells or candidates (across_models shows its best)."""
    if len(rows) < 2:
        return []
    splits = sorted(
        {
            TEST_SPLIT.match(c).group(1)
            for c in frame.columns
            if TEST_SPLIT.match(c) and c.endswith(f"_{score}_at_best")
        },
        key=split_order,
    )
    if len(splits) < 2:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for r in rows[:8]:
        means = [r["metrics"].get(f"test_{s}_{score}_at_best", {}).get("summary") for s in splits]
        ax.plot(
            splits,
            [m.mean if m else float("nan") for m in means],
            marker="o",
            label=", ".join(f"{k}={v}" for k, v in r["setting"].items()) or pair,
        )
        paper = [r["metrics"].get(f"test_{s}_{score}_at_best", {}).get("published") for s in splits]
        if any(paper):
            ax.plot(
                splits,
                [p["mean"] if p else float("nan") for p in paper],
                linestyle="none",
                marker="x",
                color="black",
            )
    ax.set_xlabel(plots.split_axis(splits))
    ax.set_ylabel(f"test {score} at best")
    draw_chance(ax, chance, f"test_{score}_at_best")
    ax.legend(fontsize=7, loc="best")
    set_title(ax, f"{pair}: generalization to longer or deeper inputs (x: the paper's)")
    path = out_dir / f"{pair}_lengths.png"
    return [(path, figure_png(fig, path))]


def answering_row(section: dict, summary: dict, metric: str, mode: str) -> dict | None:
    """The row of a pair's section that answers for its model: a confirmed search's chosen candidate
    (summaries.confirmed_candidates), else its best row by `metric` (a search's best trial, an
    ablation's best cell)."""
    candidate = (summary.get("confirmed") or {}).get("candidate")
    chosen = [
        r for r in section["rows"] if candidate is not None and r["setting"].get("candidate") == candidate + 1
    ]
    return (
        chosen[0] if chosen else max(section["rows"], key=lambda r: row_rank(r, metric, mode), default=None)
    )


def across_models(study, sections: list[dict], summaries: dict, out_dir: Path) -> list[dict]:
    """Per task variant, every model's answering row (answering_row) by test length or depth (the
    pair sections' `lengths`; the test score where a task has none), from the rows its section
    shows: the figure, chance, the splits and a line per model (its label, seeds and the entry of
    each split: the summary over seeds and the paper's number)."""
    by_name = {section["name"]: section for section in sections}
    views = []
    for variant in dict.fromkeys(p.task.variant for p in study.pairs):
        chosen = [
            (
                pair,
                by_name[pair.name],
                answering_row(by_name[pair.name], summaries.get(pair.name, {}), study.metric, study.mode),
            )
            for pair in study.pairs
            if pair.task.variant == variant
        ]
        chosen = [(pair, section, row) for pair, section, row in chosen if row]
        lengths = length_metrics(
            {m for _, section, _ in chosen for m in section.get("lengths", [])}, study.score
        )
        metrics = lengths or [f"test_{study.score}_at_best"]
        lines = [
            {
                "label": pair.model + (f" ({cell_name(row['setting'])})" if row["setting"] else ""),
                "seeds": len(row["seeds"]),
                "points": [row["metrics"].get(m) for m in metrics],
            }
            for pair, _, row in chosen
        ]
        if not any(any(line["points"]) for line in lines):
            continue
        splits = [split_label(m) for m in metrics]
        chance = chosen[0][1]["chance"]
        figure = plots.across_models(variant, splits, lines, chance, study.score, out_dir)
        views.append(
            {"variant": variant, "chance": chance, "splits": splits, "lines": lines, "figure": figure}
        )
    return views


def plot_history(
    pair: str, nights: list[tuple[str, pd.DataFrame]], keys: list[str], score: str, chance: str, out_dir: Path
) -> list[tuple[Path, str]]:
    """The nightly job's history: per cell, its mean test score night after night. `nights` holds
    each night's label and runs (runs_frame), oldest first."""
    metric = f"test_{score}_at_best"
    points: dict[tuple, dict[int, list]] = {}
    for k, (_, frame) in enumerate(nights):
        if not len(frame) or metric not in frame:
            continue
        frame = frame[frame["pair"] == pair]
        for config, value in zip(frame["config"], frame[metric]):
            if pd.notna(value):  # a seed without a score: the night's mean of the others, as its table shows
                points.setdefault(tuple(config.get(key) for key in keys), {}).setdefault(k, []).append(value)
    if not points:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for cell in sorted(points, key=lambda c: tuple(map(numeric_key, c))):  # in the order of the grid's values
        seen = sorted(points[cell].items())
        # At the night's index: labels as categories would be ordered by the first line drawn.
        ax.plot(
            [k for k, _ in seen],
            [sum(v) / len(v) for _, v in seen],
            marker="o",
            label=cell_name(dict(zip(keys, cell))) if keys else pair,
        )
    ax.set_xticks(range(len(nights)), [label for label, _ in nights], rotation=30, ha="right", fontsize=7)
    ax.set_xlabel("night")
    ax.set_ylabel(f"{metric} (mean over seeds)")
    draw_chance(ax, chance, metric)
    ax.legend(fontsize=7, loc="best")
    set_title(ax, f"{pair}: night after night")
    path = out_dir / f"{pair}_history.png"
    return [(path, figure_png(fig, path))]


def trial_entry(run, pair, study, mlflow) -> dict | None:
    """A search trial's row: its run, the values TPE chose, status, last iteration, selection metric
    and test score, learning curves; None for another pair's run, a confirmation's, or a lost one."""
    if run.data.tags.get("pair") != pair.name or run.data.tags.get("phase") == "confirm":
        return None
    status = run.data.tags.get(STATUS_TAG, "running")
    if status == "lost":  # replaced by another trial on resume
        return None
    config = json.loads(run.data.tags.get(CONFIG_TAG, "{}"))
    curves = {
        name: [
            (m.step, m.value)
            for m in sorted(mlflow.get_metric_history(run.info.run_id, name), key=lambda m: m.step)
        ]
        for name in (f"ood_valid_{study.score}", f"iid_valid_{study.score}")
    }
    steps = [step for points in curves.values() for step, _ in points]
    if DIVERGED_AT_TAG in run.data.tags:  # where it stopped, past its last evaluation
        steps.append(int(run.data.tags[DIVERGED_AT_TAG]))
    return {
        "run_id": run.info.run_id,
        "name": run.info.run_name or "",
        "status": status,
        "outcome": outcome_text(run.data.tags),  # with where it diverged, or its error's last line
        "last_step": max(steps, default=0),
        "params": {k: config[k] for k in pair.space if k in config},
        "metric": run.data.metrics.get(study.metric),
        "test": run.data.metrics.get(study.headline),
        "metrics": dict(run.data.metrics),
        "curves": curves,
        "start": run.info.start_time,
    }


def number_trials(trials: list[dict], best: dict | None) -> None:
    """Each trial's number, whether it won, and its label, in the order the trials started."""
    trials.sort(key=lambda t: t["start"])
    for position, trial in enumerate(trials, 1):
        # The number in its run's name (callbacks.TrialTracker.short_name), which MLflow and the
        # console show too: after a driver resume, a lost trial's replacement has the lost one's.
        named = re.match(r"#(\d+) ", trial["name"])
        number = int(named.group(1)) if named else position
        trial.update(
            number=number,
            best=trial is best,
            label=f"#{number} "
            + " ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial["params"].items()
            ),
        )


def tie_at_best(scored: list[dict], best: dict | None, decided_by: str | None) -> dict | None:
    """The trials that tie the winner on the metric (their numbers, the range of their test scores)
    and what chose among them (ranking.Ranking's tie-breaks): the rule's choice, not a finding. None
    without a tie."""
    tied = [t for t in scored if t["metric"] == best["metric"]]  # in the order they started, as runs come
    tests = [t["test"] for t in tied if t["test"] is not None]
    return (
        {
            "numbers": [t["number"] for t in tied],
            "tests": (min(tests), max(tests)) if tests else None,
            "decided_by": decided_by,
        }
        if len(tied) > 1
        else None
    )


def search_trials(state, study, pair, runs: list, mlflow, out_dir: Path) -> dict:
    """A search pair's trials as the report shows them: every trial (its number, the values TPE
    chose, status, last iteration, selection metric and test score), the winning config, Optuna's
    hyperparameter importances from the stored study, and figures: every trial's learning curve
    and the metric against each searched hyperparameter."""
    trials = [t for t in (trial_entry(run, pair, study, mlflow) for run in runs) if t is not None]
    # Of those that may answer, by ranking.Ranking's rule: as summaries.pair_summaries and answer_runs.
    scored = [t for t in trials if t["metric"] is not None and may_answer(t["status"])]
    choice = Ranking.of(study.metric, study.score, study.mode).best(scored, lambda t: t["metrics"])
    best = scored[choice.index] if choice else None
    number_trials(trials, best)
    chance = pair.chance(study.score)
    figures = [plots.learning_curves(pair.name, trials, study.score, chance, out_dir)] if trials else []
    sliced = plots.slices(
        pair.name,
        trials,
        {k: (d.kind, d.values) for k, d in pair.space.items()},
        study.metric,
        chance,
        out_dir,
    )
    return {
        "trials": trials,
        "best": best,
        "tie": tie_at_best(scored, best, choice.decided_by if choice else None),
        "importances": importances(state, pair, trials),
        "figures": figures + ([sliced] if sliced else []),
        "space": {k: f"{d.kind} {list(d.values)}" for k, d in pair.space.items()},
    }


def importances(state, pair, trials: list[dict]) -> list[tuple[str, float]] | str:
    """Optuna's hyperparameter importances (its default evaluator) of the pair's stored study, most
    important first; or why there are none (in the report, not as a warning on the console)."""
    if len(pair.space) < 2:
        return f"one searched hyperparameter ({', '.join(pair.space) or 'none'}): nothing to rank"
    finished = [t for t in trials if t["metric"] is not None]
    if len(finished) < 3:
        return f"{len(finished)} trial(s) with a score: too few to rank hyperparameters"
    try:
        study = optuna.load_study(
            study_name=state.optuna_study_name(pair.name),
            storage=search_storage(state.tracking_uri, state.dir, read_only=True),
        )
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            ranked = list(optuna.importance.get_param_importances(study).items())
        equal = [w for w in said if "importances will be equal" in str(w.message)]
        return f"not ranked: {equal[0].message}" if equal else ranked
    except Exception as e:  # noqa: BLE001 - a missing ranking is no reason to fail the report
        return f"not computed ({(str(e) or type(e).__name__).splitlines()[0]})"


@dataclasses.dataclass
class LaunchData:
    """What build reads once and every pair's section uses: the launch, its runs (as MLflow holds
    them and as frames), the earlier nights' and the compared launch's runs, and where figures go."""

    state: object
    study: object
    trial_runs: list
    frame_ended: pd.DataFrame  # runs_frame over runs.ENDED
    frame: pd.DataFrame  # its completed runs
    nights: list | None  # plot_history's: each night's label and runs, oldest first
    before_ended: pd.DataFrame | None  # the compared launch's, over runs.ENDED
    before: pd.DataFrame | None  # its completed runs
    mlflow: object
    parent: object  # the launch's MLflow run
    ui: dict
    out_dir: Path


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


def night_frames(state, frame: pd.DataFrame, history: list | None) -> list | None:
    """Each night's label and runs (this one's are `frame`), read once for every pair's history plot."""
    if history is None:
        return None

    def label(launch) -> str:
        return datetime.datetime.fromtimestamp(launch.created or 0).strftime("%m-%d %H:%M")

    return [(label(n), runs_frame(n)) for n in history] + [(label(state), frame)]


def read_launch(state, previous_state, history: list | None, ui_url: str | None = None) -> LaunchData:
    study = state.study()
    trial_runs = launch_trial_runs(state.tracking_uri, state.experiment, state.launch_id)
    frame_ended = runs_frame(state, trial_runs, ENDED)
    frame = completed(frame_ended)
    nights = night_frames(state, frame, history)
    before_ended = runs_frame(previous_state, statuses=ENDED) if previous_state else None
    before = completed(before_ended) if previous_state else None
    out_dir = state.dir / "report"
    out_dir.mkdir(exist_ok=True)
    mlflow = client(state.tracking_uri)
    parent = mlflow.get_run(state.parent_run_id)
    ui = ui_address(state.tracking_uri, ui_url, state.dir)
    return LaunchData(
        state,
        study,
        trial_runs,
        frame_ended,
        frame,
        nights,
        before_ended,
        before,
        mlflow,
        parent,
        ui,
        out_dir,
    )


def pair_links(data: LaunchData, pair) -> dict[str, str]:
    """The pair's trials in MLflow's UI (mlflow_ui.ui_links; its runs table as trials_view saves
    it in the experiment), lost trials left out."""
    study, experiment_id = data.study, data.parent.info.experiment_id
    return ui_links(
        data.ui["url"],
        experiment_id,
        save_view(data.mlflow, experiment_id, trials_view(study, data.state.launch_id, pair)),
        [
            r.info.run_id
            for r in data.trial_runs
            if r.data.tags.get("pair") == pair.name and r.data.tags.get(STATUS_TAG) != "lost"
        ],
        [f"ood_valid_{study.score}", f"iid_valid_{study.score}"],
    )


def length_metrics(columns, score: str) -> list[str]:
    """The per-length (or per-depth) test scores at the best checkpoint, in the splits' order."""
    return sorted(
        (c for c in columns if TEST_SPLIT.match(c) and c.endswith(f"_{score}_at_best")),
        key=lambda c: split_order(TEST_SPLIT.match(c).group(1)),
    )


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


def pair_figures(
    data: LaunchData, pair, rows: list[dict], runs: pd.DataFrame, own_keys: list[str], chance
) -> list[tuple[Path, str]]:
    """The pair's cell plots, its history night after night, and the maps of its best trial."""
    study, out_dir = data.study, data.out_dir
    figures = plot_keys(
        pair.name, rows, own_keys, f"test_{study.score}_at_best", chance, out_dir
    ) + plot_lengths(pair.name, rows, runs, study.score, chance, out_dir)
    if data.nights is not None:
        figures += plot_history(pair.name, data.nights, own_keys, study.score, chance, out_dir)
    scored = runs.dropna(subset=[study.metric]).to_dict("records") if study.metric in runs else []
    choice = Ranking.of(study.metric, study.score, study.mode).best(scored, lambda row: row)
    if choice:  # the maps of the pair's best trial (of those its rows show), as answer_runs picks it
        best_run = data.mlflow.get_run(scored[choice.index]["run_id"])
        figures += maps.best_run_maps(data.state, pair.name, best_run, out_dir)
    return figures


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


def pair_section(data: LaunchData, pair, tally: Tally) -> dict:
    """A pair's part of the report: its links, its search's trials, a row per cell (or candidate,
    or its best trial) with its figures, its cells compared with the earlier launch's (in `tally`)."""
    study = data.study
    links = pair_links(data, pair)
    runs = data.frame[data.frame["pair"] == pair.name] if len(data.frame) else data.frame
    runs, other_data = one_data(runs, task_runs(data.frame, pair))
    searched = (
        None
        if study.is_ablation
        else search_trials(data.state, study, pair, data.trial_runs, data.mlflow, data.out_dir)
    )
    chance = pair.chance(study.score)
    ended = outcomes(data.frame_ended, study, pair)
    if data.before_ended is not None:
        ended_before = outcomes(data.before_ended, study, pair)
        tally.broken += broken_cells(pair.name, ended, ended_before).values()
        tally.in_both += len(set(ended) & set(ended_before))
        tally.one_sided += len(set(ended) ^ set(ended_before))
    section = {
        "name": pair.name,
        "chance": chance,
        "search": searched,
        "links": links,
        "other_data": other_data,
    }
    if not len(runs):  # `ended`: how its runs ended instead, "3 diverged" (a search's trial table says more)
        return {
            **section,
            "rows": [],
            "metrics": [],
            "ended": unfinished(sum(ended.values(), Counter())),
            "figures": searched["figures"] if searched else [],
        }
    runs, own_keys = answer_runs(runs, study, pair)
    metrics = table_metrics(study.score, runs.columns)
    lengths = length_metrics(runs.columns, study.score)
    rows = cell_rows(
        runs, own_keys, metrics + lengths, study.report, study.report.baseline, study.score, pair.chosen
    )
    mark_unfinished(rows, ended)
    figures = pair_figures(data, pair, rows, runs, own_keys, chance)
    if data.before is not None and len(data.before):
        earlier = data.before[data.before["pair"] == pair.name]
        compare_cells(tally, study, pair.name, rows, runs, earlier, own_keys, metrics)
    if searched:
        figures = searched["figures"] + figures
    return {**section, "rows": rows, "metrics": metrics, "lengths": lengths, "figures": figures}


def header_section(state, study, parent) -> dict:
    """The report's head: the launch, its file, when and at which code it ran, what it trained."""
    return {
        "title": f"{'Ablation' if study.is_ablation else 'Search'} {study.name}",
        "launch": state.launch_id,
        "spec_file": state.spec_file,
        "search": None if study.is_ablation else {"trials": study.budget.trials, "confirm": study.confirm},
        "date": datetime.datetime.fromtimestamp(parent.info.start_time / 1000).strftime("%Y-%m-%d %H:%M"),
        "code_version": parent.data.tags.get("code_version", "unknown"),
        "grid": study.grid,
        "seeds": study.seeds,
        "n_iters": sorted({int(p.base["n_iters"]) for p in study.pairs}),
        "metric": study.metric,
        "score": study.score,
        "headline": study.headline,
        "report": study.report,
    }


def search_summaries(data: LaunchData) -> dict:
    """A search's summaries per pair (summaries.pair_summaries), which its answer and its picture
    across models read; none for an ablation, whose answer is its tables."""
    state, study = data.state, data.study
    if study.is_ablation:
        return {}
    return pair_summaries(
        state.tracking_uri,
        state.experiment,
        state.launch_id,
        study.metric,
        study.score,
        data.trial_runs,
        headline=study.headline,
    )


def flag_regressions(pairs: list[dict], comparisons: list, score: str) -> None:
    """Marks each row whose test score the comparison flagged, for its table."""
    flagged = {c.key for c in comparisons if c.regressed}
    for entry in pairs:
        for r in entry["rows"]:
            metric = f"test_{score}_at_best"
            if (entry["name"], cell_name(r["setting"]), metric) in flagged:
                r["metrics"][metric]["regressed"] = True


def comparison_section(data: LaunchData, previous_state, comparisons: list, tally: Tally) -> dict:
    """The comparison with `previous_state`: its launch and code, the cells tested, those no test
    could compare, and the regressions' lines (the tests' and the broken cells')."""
    code_before = (
        data.mlflow.get_run(previous_state.parent_run_id).data.tags.get("code_version", "unknown")
        if previous_state
        else None
    )
    code_now = data.parent.data.tags.get("code_version", "unknown")
    changed = tally.changed
    return {
        "previous": previous_state.launch_id if previous_state else None,
        "code_before": code_before,
        "comparisons": comparisons,
        # Cells of both launches with fewer than two completed runs on a side: no test could compare them.
        "uncompared": max(0, tally.in_both - len(comparisons) - len(tally.not_comparable)),
        "one_sided": tally.one_sided,
        "not_comparable": tally.not_comparable,
        "changed": [f"{pair} {cell}: {change}" for (pair, cell), change in changed.items()],
        "regressions": [
            regression_text(c, changed.get(c.key[:2]), (code_before, code_now))
            for c in comparisons
            if c.regressed
        ]
        + tally.broken,
    }


def build(state, previous_state=None, history: list | None = None, ui_url: str | None = None) -> dict:
    """Everything the templates show, and the regressions against `previous_state`; with
    `history` (earlier nights, oldest first), a plot of each cell night after night; links into
    MLflow's UI at `ui_url` (mlflow_ui.ui_address)."""
    data = read_launch(state, previous_state, history, ui_url)
    study, tally = data.study, Tally()
    pairs = [pair_section(data, pair, tally) for pair in study.pairs]
    comparisons = stats.regressions(
        tally.tested, study.report.alpha, study.report.min_effect, study.report.test
    )
    flag_regressions(pairs, comparisons, study.score)
    summaries = search_summaries(data)
    return {
        **header_section(state, study, data.parent),
        "answer": [] if study.is_ablation else answer_lines(study, summaries),
        "overview": across_models(study, pairs, summaries, data.out_dir),
        **comparison_section(data, previous_state, comparisons, tally),
        "pairs": pairs,
        "paper_tables": paper_tables(pairs, study.metric, study.mode),
        "mlflow_ui": data.ui,
    }


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


class Regressions(list):
    """write_report's regressions: a line per cell that got worse (callers count and test them as
    the list they always were), and `compared`: how many cells were tested against which launch,
    and how; None where no launch was compared."""

    def __init__(self, lines=(), compared: str | None = None):
        super().__init__(lines)
        self.compared = compared


def verdict_lines(regressions: list[str]) -> list[str]:
    """A comparison's verdict on the console (`report --compare`, the nightly job): each cell that
    regressed, or one line saying that none did; nothing where no launch was compared (nor for a
    plain list: a search launch compares nothing)."""
    if regressions:
        return [f"REGRESSION {r}" for r in regressions]
    compared = getattr(regressions, "compared", None)
    return [f"no regression in {compared}"] if compared else []


def log_cell_means(mlflow, parent_run_id: str, context: dict) -> None:
    """Each cell's mean over seeds on the launch's run (`<pair>/<cell>/<metric>`), so that MLflow's
    runs table and charts show the ablation's answer without opening the report."""
    from mlflow.entities import Metric  # noqa: PLC0415 - seconds of imports, paid by writing alone

    now = int(datetime.datetime.now().timestamp() * 1000)
    # A search's best trial alone (no cell) is on the launch's run already (summaries.summarize_pairs).
    metrics = [
        Metric(metric_name(pair["name"], cell_name(row["setting"]), metric), entry["summary"].mean, now, 0)
        for pair in context["pairs"]
        for row in pair["rows"]
        if row["setting"] or context["search"] is None
        for metric, entry in row["metrics"].items()
    ]
    for start in range(0, len(metrics), MAX_BATCH):
        mlflow.log_batch(parent_run_id, metrics=metrics[start : start + MAX_BATCH])


def render(context: dict, image_folder: str = "") -> tuple[str, str]:
    """-> (Markdown, HTML) from the templates; the Markdown links its plots in `image_folder`."""
    # The page escapes what it shows (select_autoescape(["html"]) would not: the template's name ends
    # in .j2); the macros of cells.j2, shared with the Markdown, are escaped where the page shows them.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=lambda name: (name or "").endswith(".html.j2"),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["f3"] = stats.fmt
    return env.get_template("report.md.j2").render(**context, image_folder=image_folder), env.get_template(
        "report.html.j2"
    ).render(**context)


def log_report_files(mlflow, state, paths: list[Path]) -> None:
    """`paths` as the parent run's artifacts under report/. A launch folder moved with its store
    (LaunchState.follow_move) has its artifacts where the move put them, not where the store's
    record still says: they are copied there, as MLflow copies a local artifact."""
    recorded = mlflow.get_run(state.parent_run_id).info.artifact_uri
    parts = urllib.parse.urlsplit(recorded)
    local = Path(urllib.parse.unquote(parts.path)) if parts.scheme in ("", "file") else None
    if local is None or state.here(local) == local:
        for path in paths:
            mlflow.log_artifact(state.parent_run_id, str(path), "report")
        return
    folder = state.here(local) / "report"
    folder.mkdir(parents=True, exist_ok=True)
    for path in paths:
        shutil.copyfile(path, folder / path.name)


def compared_words(context: dict, previous_state, passed_over) -> str:
    """write_report's line on what was compared with `previous_state`, and what was not."""
    n, settings = len(context["comparisons"]), context["report"]
    compared = (
        f"{n} cell{'' if n == 1 else 's'} compared with {previous_state.launch_id} "
        f"(one-sided {settings.test} test across seeds, alpha {settings.alpha:g}, Holm-corrected; "
        f"code {context['code_before']} -> {context['code_version']})"
    )
    if context["uncompared"]:
        compared += f"; {context['uncompared']} cell(s) without two completed runs on each side not compared"
    if context["one_sided"]:
        compared += f"; {context['one_sided']} cell(s) in one of the two launches only"
    if context["not_comparable"]:
        compared += (
            f"; {len(context['not_comparable'])} cell(s) pooling several configs not compared "
            "(see the report)"
        )
    if context["changed"]:
        compared += f"; {len(context['changed'])} cell(s) with a changed config (see the report)"
    if passed_over:
        compared += (
            f"; passed over {', '.join(passed_over)}, which regressed: a regression is no baseline until "
            "`orchestrator accept` says it was intended"
        )
    return compared


def write_report(
    state,
    previous_state=None,
    history: list | None = None,
    dated_in: Path | None = None,
    passed_over: list[str] = (),
    ui_url: str | None = None,
) -> tuple[list[Path], Regressions]:
    """Write the report to `<launch>/report/` (and log it on the parent run), and with `dated_in`
    a dated copy there; -> (files written, the cells that regressed: see Regressions). `passed_over`:
    the nights after `previous_state` that regressed, which are no baseline (write_night). `ui_url`:
    where its links find MLflow's UI (mlflow_ui.ui_address)."""
    context = {
        **build(state, previous_state, history, ui_url),
        "passed_over": list(passed_over),
        "first_night": history == [],  # a night with no night before it: nothing to compare yet
    }
    markdown, page = render(context)
    out_dir = state.dir / "report"
    (out_dir / "report.md").write_text(markdown)
    (out_dir / "report.html").write_text(page)
    paths = [out_dir / "report.md", out_dir / "report.html"] + [
        path for entry in context["pairs"] for path, _ in entry["figures"]
    ]
    paths += [view["figure"][0] for view in context["overview"]]
    mlflow = client(state.tracking_uri)
    log_report_files(mlflow, state, paths)
    log_cell_means(mlflow, state.parent_run_id, context)
    if dated_in is not None:
        dated_in.mkdir(parents=True, exist_ok=True)
        stamp = f"{datetime.datetime.fromtimestamp(state.created or 0):%Y-%m-%d_%H%M%S}_{state.launch_id}"
        markdown, _ = render(context, image_folder=f"{os.path.relpath(out_dir, dated_in)}/")
        paths += [dated_in / f"{stamp}.md", dated_in / f"{stamp}.html"]
        paths[-2].write_text(markdown)
        paths[-1].write_text(page)
    compared = None if previous_state is None else compared_words(context, previous_state, passed_over)
    return paths, Regressions(context["regressions"], compared)


def write_launch_report(state, ui_url: str | None = None) -> tuple[list[Path], Regressions]:
    """A launch's own report, as its launch writes it and `orchestrator report` rewrites it: a
    night's compared with its baseline night, with its history (write_night); else on its own."""
    return write_night(state, ui_url) if state.night is not None else write_report(state, ui_url=ui_url)


def write_night(state, ui_url: str | None = None) -> tuple[list[Path], Regressions]:
    """A night of the nightly job: its report, compared with the last finished night that flagged
    no regression (or whose regression was accepted), with each cell's history, and a dated copy in
    `<storage_path>/nightly/<experiment>/` beside the previous nights'."""
    nights = earlier_launches(state, nightly=True)
    baselines = baseline_nights(nights)
    baseline = baselines[-1] if baselines else None
    passed_over = [n.launch_id for n in nights[nights.index(baseline) + 1 :]] if baseline else []
    return write_report(
        state,
        baseline,
        history=nights,
        dated_in=state.dir.parent / "nightly" / state.experiment,
        passed_over=passed_over,
        ui_url=ui_url,
    )
