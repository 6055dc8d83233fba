"""A launch's trial runs as pandas frames, and the cells they pool into: one row per run (its pair,
task, phase, status, config and metrics, from MLflow), how each cell's runs ended, the runs that
answer for a pair (an ablation's cells, a confirmation's candidates, a search's best trial), the
runs on one task's data, the configs a cell pools, and the test splits and metrics its table shows.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pandas as pd

from trainables.scores import LOWER_IS_BETTER

from ..record.ranking import Ranking
from ..record.runs import CONFIG_TAG, DATA_HASH_TAG, ENDED, STATUS_TAG, launch_trial_runs

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
    for run in launch_trial_runs(state.tracked) if runs is None else runs:
        status = run.data.tags.get(STATUS_TAG)
        # a run tagged as the launch's trial that the tracker did not write (no pair, no config)
        if status not in statuses or not {"pair", CONFIG_TAG} <= run.data.tags.keys():
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


def length_metrics(columns, score: str) -> list[str]:
    """The per-length (or per-depth) test scores at the best checkpoint, in the splits' order."""
    return sorted(
        (c for c in columns if TEST_SPLIT.match(c) and c.endswith(f"_{score}_at_best")),
        key=lambda c: split_order(TEST_SPLIT.match(c).group(1)),
    )


def row_rank(row: dict, metric: str, mode: str) -> float:
    """A cell's rank by its mean `metric` (higher is better); a cell without it ranks last."""
    summary = row["metrics"].get(metric, {}).get("summary")
    return -float("inf") if summary is None else summary.mean if mode == "max" else -summary.mean
