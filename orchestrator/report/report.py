"""Reports of a launch: per ablation grid cell (or per confirmed candidate of a search, or a
search's best trial) over seeds, n, mean ± std, a Student-t 95% interval,
the solved rate and the best seed (stats.py), beside the papers' numbers (published.yaml), with
plots (one panel per swept key, and test score per test length where a task has several).

Read from MLflow (the trials' `trial_config` tags and metrics), rendered from the Jinja2 templates
in templates/ to `<launch>/report/` (report.md, report.html with its plots embedded, one PNG per
pair and figure) and logged as artifacts of the launch's parent run. Compared with a previous
launch (last night's), a cell regresses only where a one-sided test across seeds says so
(stats.regressions: Holm-corrected, with a minimum effect).

This module reads a launch once and assembles its page; the runs as frames are frames.py's, a
cell's row cells.py's, the papers' numbers papers.py's, the answer answer.py's, a search's trials
trials.py's, the comparison with an earlier launch compare.py's, the figures plots.py's.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import urllib.parse
from collections import Counter
from pathlib import Path

import pandas as pd

from ..record.best import summaries_of
from ..record.files import atomic_path, write_atomically
from ..record.mlflow_ui import save_view, trials_view, ui_address, ui_links
from ..record.ranking import Ranking
from ..record.runs import ENDED, MAX_BATCH, STATUS_TAG, launch_trial_runs
from ..record.state import baseline_nights, earlier_launches
from ..record.stores import client
from ..record.summaries import metric_name
from . import maps, stats
from .answer import across_models, answer_lines
from .cells import cell_rows, mark_unfinished
from .compare import Tally, broken_cells, compare_cells, flag_regressions, regression_text
from .frames import (
    answer_runs,
    cell_name,
    completed,
    length_metrics,
    one_data,
    outcomes,
    runs_frame,
    table_metrics,
    task_runs,
    unfinished,
)
from .pages import environment
from .papers import paper_tables
from .plots import plot_history, plot_keys, plot_lengths
from .trials import search_trials


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


def night_frames(state, frame: pd.DataFrame, history: list | None) -> list | None:
    """Each night's label and runs (this one's are `frame`), read once for every pair's history plot."""
    if history is None:
        return None

    def label(launch) -> str:
        return datetime.datetime.fromtimestamp(launch.created or 0).strftime("%m-%d %H:%M")

    return [(label(n), runs_frame(n)) for n in history] + [(label(state), frame)]


def read_launch(state, previous_state, history: list | None, ui_url: str | None = None) -> LaunchData:
    study = state.study()
    trial_runs = launch_trial_runs(state.tracked)
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
    # An ablation answers with its tables: no pair of it has a search's summary to read.
    summaries = {} if study.is_ablation else summaries_of(state, data.trial_runs)
    return {
        **header_section(state, study, data.parent),
        "answer": [] if study.is_ablation else answer_lines(study, summaries),
        "overview": across_models(study, pairs, summaries, data.out_dir),
        **comparison_section(data, previous_state, comparisons, tally),
        "pairs": pairs,
        "paper_tables": paper_tables(pairs, study.metric, study.mode),
        "mlflow_ui": data.ui,
    }


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
    env = environment()
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
        with atomic_path(folder / path.name) as temporary:
            shutil.copyfile(path, temporary)


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
    write_atomically(out_dir / "report.md", markdown)
    write_atomically(out_dir / "report.html", page)
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
        write_atomically(paths[-2], markdown)
        write_atomically(paths[-1], page)
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
