"""A launch's progress and answer read from its trial runs: per pair and per ablation cell, the
best and the confirmed configs, in words for the console, and on MLflow's runs table."""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections import Counter

from trainables.scores import LOWER_IS_BETTER

from .ranking import Ranking
from .runs import (
    CONFIG_TAG,
    DATA_HASH_TAG,
    DIVERGED_AT_TAG,
    ENDED,
    ERROR_TAG,
    KERNELS_TAG,
    MAX_BATCH,
    STATUS_TAG,
    error_line,
    launch_trial_runs,
    pair_run,
)
from .state import TrackedLaunch
from .stores import client


def metric_name(*parts: str) -> str:
    """An MLflow metric name from parts joined by '/': '=' becomes ':', and whatever else MLflow
    refuses in names (commas, brackets) is dropped."""
    return re.sub(r"[^\w.\- :/]", "", "/".join(parts).replace("=", ":"))


def summarize_pairs(
    launch: TrackedLaunch, parent_run_id: str, metric: str, headline: str, summaries: dict[str, dict]
) -> None:
    """A search's answer (`summaries`: pair_summaries) where MLflow's runs table shows it at a
    glance: on the launch's run, each pair's best `metric` and that trial's test score, and the
    confirmed means where the search was confirmed; and a run per pair, nested under the launch's,
    holding the same metrics and the answer's config (the confirmed candidate's, else the best
    trial's) as params."""
    # Importing this module (cell_name, confirmed_text: status, best) loads no MLflow: seconds.
    from mlflow.entities import Metric, Param  # noqa: PLC0415

    mlflow = client(launch.uri)
    exp_id = mlflow.get_run(parent_run_id).info.experiment_id
    now = int(time.time() * 1000)
    on_parent = []
    confirmed_test = headline.removesuffix("_at_best")  # a mean over seeds: no one checkpoint
    for pair, summary in sorted(summaries.items()):
        if summary["best"] is None:
            continue
        values = {
            metric: summary["best"],
            **({headline: summary["test"]} if summary.get("test") is not None else {}),
        }
        confirmed = summary.get("confirmed") or {}
        values.update(
            {
                f"confirmed_{metric}": confirmed.get("metric"),
                f"confirmed_{confirmed_test}": confirmed.get("test"),
                f"confirmed_{confirmed_test}_std": confirmed.get("test_std"),
            }
        )
        values = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
        on_parent += [Metric(metric_name(pair, k), v, now, 0) for k, v in values.items()]
        run_id = pair_run(mlflow, exp_id, parent_run_id, launch.launch_id, pair)
        # the confirmed candidate's, where there is one
        answer = confirmed.get("config") or summary["best_config"]
        params = [
            Param(k, json.dumps(v) if isinstance(v, (dict, list)) else str(v))
            for k, v in sorted(answer.items())
        ]
        for start in range(0, len(params), 100):
            mlflow.log_batch(run_id, params=params[start : start + 100])
        mlflow.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in values.items()])
        mlflow.set_tag(run_id, "best_run", summary["best_run"])
        mlflow.set_terminated(run_id)
    for start in range(0, len(on_parent), MAX_BATCH):
        mlflow.log_batch(parent_run_id, metrics=on_parent[start : start + MAX_BATCH])


def cell_name(setting: dict) -> str:
    """An ablation cell's `cell` tag: its grid values ("n_layers=4 lr=0.001"), "-" for seeds only."""
    return " ".join(f"{k}={v}" for k, v in setting.items()) or "-"


def cell_order(name: str) -> tuple:
    """A `cell` tag's sort key: its values as numbers where they are ("n_layers=10" after "n_layers=8")."""
    key = []
    for part in name.split():
        value = part.partition("=")[2]
        try:
            key.append((0, float(value), ""))
        except ValueError:
            key.append((1, 0.0, value))
    return tuple(key)


def status_kind(run) -> str | None:
    """How `status` counts a trial run: done, stopped (early, by ASHA), running or failed; None for
    a run lost on resume (another trial replaced it)."""
    return kind_of(run.data.tags.get(STATUS_TAG, "running"))


def kind_of(status: str) -> str | None:
    if status == "lost":
        return None
    return {
        "running": "running",
        "interrupted": "running",
        "failed": "failed",
        "diverged": "failed",
        "early_stopped": "stopped",
    }.get(status, "done")


ANSWERING = ("done", "running")  # the kinds a pair's answer may be of: see may_answer


def may_answer(status: str) -> bool:
    """Whether a search trial of this status may be the pair's answer: one that diverged or failed
    is not (its config would not train again), nor one ASHA stopped (scored on less training)."""
    return kind_of(status) in ANSWERING


def fell(kinds: dict[str, int]) -> bool:
    """Whether runs counted by kind_of (a pair's, of one phase) all diverged or failed."""
    return kinds.get("failed", 0) > 0 and not any(kinds.get(k, 0) for k in ("done", "stopped", "running"))


def fallen_pairs(runs) -> list[str]:
    """The pairs of a launch (`runs`: its trial runs) of which every run of a phase diverged or failed."""
    kinds: dict[tuple[str, str], Counter] = {}
    for run in runs:
        kind = status_kind(run)
        if kind is not None:
            where = (run.data.tags.get("pair", "?"), run.data.tags.get("phase", "search"))
            kinds.setdefault(where, Counter())[kind] += 1
    return sorted({pair for (pair, _), counted in kinds.items() if fell(counted)})


def outcome_text(tags: dict[str, str]) -> str:
    """How a trial run ended, by its tags, in words: its status, "diverged at step 60", or
    "failed (RuntimeError: ...)" with its error's last line."""
    status = tags.get(STATUS_TAG, "running")
    if status == "diverged" and DIVERGED_AT_TAG in tags:
        return f"diverged at step {tags[DIVERGED_AT_TAG]}"
    if status == "failed" and error_line(tags.get(ERROR_TAG, "")):
        return f"failed ({error_line(tags[ERROR_TAG])})"
    return status


def ended_runs(launch: TrackedLaunch, phase: str) -> tuple[int, int]:
    """How many runs of a launch's phase ("search" or "confirm") have ended (completed, stopped
    early, diverged or failed), and of those, failed for good: a trial of stacked members counts
    once per member. From the record, over every driver the launch had: a resume's Tune run knows
    only its own trials' errors."""
    statuses = [
        run.data.tags.get(STATUS_TAG, "running")
        for run in launch_trial_runs(launch)
        if run.data.tags.get("phase", "search") == phase
    ]
    ended = sum(1 for status in statuses if kind_of(status) not in (None, "running"))
    return ended, statuses.count("failed")


def cell_summaries(
    launch: TrackedLaunch, metric: str, score: str, headline: str | None = None
) -> dict[str, dict[str, dict]]:
    """An ablation's progress per pair and grid cell (its runs' `cell` tag): seed runs done,
    running and failed (and of those, diverged), and the done ones' `metric` and `headline` test
    score (test_<score>_at_best where not given)."""
    out: dict[str, dict[str, dict]] = {}
    for run in launch_trial_runs(launch):
        kind = status_kind(run)
        if kind is None:
            continue
        cells = out.setdefault(run.data.tags.get("pair", "?"), {})
        cell = cells.setdefault(
            run.data.tags.get("cell", "-"),
            {"done": 0, "stopped": 0, "running": 0, "failed": 0, "metric": [], "test": []},
        )
        cell[kind] += 1
        if run.data.tags.get(STATUS_TAG) == "diverged":  # of those failed
            cell["diverged"] = cell.get("diverged", 0) + 1
        if kind == "done":
            for key, name in (("metric", metric), ("test", headline or f"test_{score}_at_best")):
                if name in run.data.metrics:
                    cell[key].append(run.data.metrics[name])
    return out


def empty_summary() -> dict:
    """A pair's summary before any of its search trials is counted."""
    return {
        "done": 0,
        "stopped": 0,
        "running": 0,
        "failed": 0,
        "best": None,
        "best_run": None,
        "best_config": None,
    }


def count_trial(entry: dict, run, kind: str, metric: str) -> None:
    """A search trial counted into its pair's summary (`kind`: status_kind's), and kept as a
    candidate for its best where it may answer and has a value of `metric`, or for how the pair
    fell (choose_fall) where it diverged or failed."""
    entry[kind] += 1
    if run.data.tags.get(STATUS_TAG) == "diverged":  # of those failed: its hyperparameters, not the cluster
        entry["diverged"] = entry.get("diverged", 0) + 1
    if kind == "failed":
        entry.setdefault("fallen", []).append(run)
    if metric in run.data.metrics and kind in ANSWERING:
        entry.setdefault("candidates", []).append(run)


def choose_best(entry: dict, ranking: Ranking, headline: str) -> None:
    """The pair's best trial of its candidates (ranking.Ranking's rule), its `headline` test score,
    and `decided_by`: what chose it where trials tied with it on the metric."""
    candidates = entry.pop("candidates", [])
    choice = ranking.best(candidates, lambda run: run.data.metrics)
    if choice is None:
        return
    run = candidates[choice.index]
    entry.update(
        best=run.data.metrics[ranking.metric],
        best_run=run.info.run_id,
        best_config=json.loads(run.data.tags.get(CONFIG_TAG, "{}")),
        best_data=run.data.tags.get(DATA_HASH_TAG),
        best_kernels=run.data.tags.get(KERNELS_TAG),
        test=run.data.metrics.get(headline),
        best_metrics=dict(run.data.metrics),
        decided_by=choice.decided_by,
    )


def choose_fall(entry: dict, ranking: Ranking, headline: str) -> None:
    """Where every trial of the pair diverged or failed, `fell`: how the trial with the best score
    before its end (ranking.Ranking's rule) ended, its `headline` test score then, and how many
    trials fell."""
    fallen = entry.pop("fallen", [])
    if not fell(entry):
        return
    scored = [run for run in fallen if ranking.metric in run.data.metrics]
    choice = ranking.best(scored, lambda run: run.data.metrics)
    run = scored[choice.index] if choice else fallen[0]
    entry["fell"] = {
        "outcome": outcome_text(run.data.tags),
        "test": run.data.metrics.get(headline),
        "trials": len(fallen),
    }


def fall_text(model: str, fall: dict, headline: str) -> str:
    """A pair whose every trial diverged or failed, as the answer names it: "mine diverged at step
    60, test_acc_at_best 0.150 before it"."""
    words = [f"{model} {fall['outcome']}"]
    if fall.get("test") is not None:
        words.append(f"{headline} {fall['test']:.3f} before it")
    if fall["trials"] > 1:
        words.append(f"the best of {fall['trials']} trials, all diverged or failed")
    return ", ".join(words)


def pair_summaries(
    launch: TrackedLaunch,
    metric: str,
    score: str,
    runs: list | None = None,
    headline: str | None = None,
) -> dict[str, dict]:
    """Per pair: search trial counts by status, the best trial so far by `metric` (ties broken as
    ranking.Ranking says) and its `headline` test score (test_<score>_at_best where not given), from
    MLflow, the source of truth, and, where the search was confirmed, `confirmed` (see
    confirmed_candidates). `runs`: the launch's trial runs, where already read."""
    headline = headline or f"test_{score}_at_best"
    ranking = Ranking.of(metric, score)
    out: dict[str, dict] = {}
    runs = launch_trial_runs(launch) if runs is None else runs
    for run in runs:
        if run.data.tags.get("phase") == "confirm":
            continue
        entry = out.setdefault(run.data.tags.get("pair", "?"), empty_summary())
        kind = status_kind(run)
        if kind is not None:
            count_trial(entry, run, kind, metric)
    for entry in out.values():
        choose_best(entry, ranking, headline)
        choose_fall(entry, ranking, headline)
    for pair, confirmed in confirmed_candidates(runs, metric, score, headline).items():
        out.setdefault(pair, empty_summary())
        out[pair]["confirmed"] = confirmed
    return out


def failed_text(summary: dict) -> str:
    """A pair summary's failed trials in words: "3 failed, 2 of them diverged"."""
    return f"{summary.get('failed', 0)} failed" + (
        f", {summary['diverged']} of them diverged" if summary.get("diverged") else ""
    )


def confirmed_candidates(runs, metric: str, score: str, headline: str) -> dict[str, dict]:
    """Per pair, from its confirmation runs that ended: the candidate with the most seeds completed
    (one whose seeds diverge is no answer, however well its one lucky seed scored) and of those
    the best mean `metric`, with n (its completed seeds) of `seeds`, the mean and sample std of its
    `headline` test score, and its config (without a seed). The pair's answer, where the search was
    confirmed."""
    sign = 1 if score in LOWER_IS_BETTER else -1
    grouped: dict[str, dict[str, list]] = {}
    running: dict[str, int] = {}  # a confirmation under way: its answer so far may change
    for run in runs:
        if run.data.tags.get("phase") == "confirm" and run.data.tags.get(STATUS_TAG) == "running":
            running[run.data.tags["pair"]] = running.get(run.data.tags["pair"], 0) + 1
        if run.data.tags.get("phase") != "confirm" or run.data.tags.get(STATUS_TAG) not in ENDED:
            continue
        grouped.setdefault(run.data.tags["pair"], {}).setdefault(run.data.tags["candidate"], []).append(run)
    out = {}
    for pair, candidates in grouped.items():
        done = {
            k: [r for r in ended if r.data.tags[STATUS_TAG] == "completed"] for k, ended in candidates.items()
        }
        done = {k: completed for k, completed in done.items() if completed}
        if not done:
            continue

        def mean_metric(k: str) -> float:
            return statistics.fmean(r.data.metrics.get(metric, math.nan) for r in done[k])

        chosen = min(done, key=lambda k: (-len(done[k]), sign * mean_metric(k)))
        config = {
            k: v
            for k, v in json.loads(done[chosen][0].data.tags.get(CONFIG_TAG, "{}")).items()
            if k != "seed"
        }
        # every test split's score of each seed: the launch's answer compares the pairs on its headline split
        splits = {
            name: [r.data.metrics[name] for r in done[chosen] if name in r.data.metrics]
            for name in sorted(
                {
                    m
                    for r in done[chosen]
                    for m in r.data.metrics
                    if m.startswith("test") and m.endswith("_at_best")
                }
            )
        }
        tests = splits.get(headline, [])
        out[pair] = {
            "candidate": int(chosen),
            "n": len(done[chosen]),
            "seeds": len(candidates[chosen]),
            "metric": mean_metric(chosen),
            "config": config,
            "test": statistics.fmean(tests) if tests else None,
            "test_std": statistics.stdev(tests) if len(tests) > 1 else None,
            "running": running.get(pair, 0),
            "splits": splits,
        }
    return out


def confirmed_text(confirmed: dict | None) -> str:
    """A confirmed answer in words: the chosen candidate's test mean ± std over its seeds."""
    if not confirmed or confirmed.get("test") is None:
        return ""
    spread = f" ± {confirmed['test_std']:.3f}" if confirmed.get("test_std") is not None else ""
    of = f" of {confirmed['seeds']}" if confirmed.get("seeds", confirmed["n"]) != confirmed["n"] else ""
    so_far = (
        f"; so far: {confirmed['running']} confirmation run(s) still running"
        if confirmed.get("running")
        else ""
    )
    return (
        f"confirmed {confirmed['test']:.3f}{spread} over {confirmed['n']}{of} seeds "
        f"(candidate {confirmed['candidate'] + 1}{so_far})"
    )


def top_configs(launch: TrackedLaunch, metric: str, score: str, k: int) -> dict[str, list[dict]]:
    """Per pair, the full configs (seed left out) of its k best completed search trials, best first
    (ranking.Ranking's rule): what a confirmation trains again. Trials ASHA stopped early or that
    diverged are no candidates."""
    found: dict[str, list] = {}
    for run in launch_trial_runs(launch):
        if (
            run.data.tags.get("phase") == "confirm"
            or run.data.tags.get(STATUS_TAG) != "completed"
            or metric not in run.data.metrics
        ):
            continue
        found.setdefault(run.data.tags["pair"], []).append(run)
    ranking = Ranking.of(metric, score)
    return {
        pair: [
            {key: v for key, v in json.loads(run.data.tags[CONFIG_TAG]).items() if key != "seed"}
            for run in ranking.sorted(runs, lambda run: run.data.metrics)[:k]
        ]
        for pair, runs in found.items()
    }
