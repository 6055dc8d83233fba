"""Paper-style reports of an ablation launch: mean ± std over seeds per grid cell, tables and plots.

Read from MLflow (the trials' `trial_config` tags and metrics), written to `<launch>/report/`
(report.md, report.html, one plot per pair) and logged as artifacts of the launch's parent run.
With a previous launch to compare against (e.g. last night's), cells whose mean got worse by more
than twice the larger standard deviation (and at least 0.01) are flagged as regressions.
"""
from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from pathlib import Path

from trainables.tasks.base import LOWER_IS_BETTER

from . import tracking

Cell = tuple  # the grid values of one table row


def collect(state) -> tuple[list[str], dict[str, dict[Cell, dict[str, list[float]]]]]:
    """-> (grid keys, {pair: {grid values: {metric: [value per seed]}}})."""
    keys = list(state.study().grid)
    runs = tracking.launch_trial_runs(state.tracking_uri, state.experiment, state.launch_id)
    table: dict[str, dict[Cell, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for run in runs:
        if run.data.tags.get(tracking.STATUS_TAG) not in ("completed",):
            continue
        config = json.loads(run.data.tags[tracking.CONFIG_TAG])
        cell = tuple(config.get(k, "n/a") for k in keys)
        for metric, value in run.data.metrics.items():
            if metric.endswith(("_at_best", "_final")):
                table[run.data.tags["pair"]][cell][metric].append(value)
    return keys, table


def mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, std


def regression(metric: str, now: list[float], before: list[float]) -> bool:
    (m_now, s_now), (m_before, s_before) = mean_std(now), mean_std(before)
    lower_is_better = any(f"_{score}_" in f"_{metric}_" for score in LOWER_IS_BETTER)
    worse = m_now - m_before if lower_is_better else m_before - m_now
    return worse > max(2 * max(s_now, s_before), 0.01)


def render(keys, table, previous=None) -> tuple[str, str, list[str]]:
    """-> (markdown, html, regression descriptions)."""
    md, body, regressions = [], [], []
    for pair in sorted(table):
        metrics = sorted({m for cell in table[pair].values() for m in cell})
        header = keys + ["seeds"] + metrics
        md += [f"### {pair}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        rows_html = []
        for cell in sorted(table[pair], key=lambda c: tuple(str(v) for v in c)):
            values = table[pair][cell]
            row = [str(v) for v in cell] + [str(max(len(v) for v in values.values()))]
            for metric in metrics:
                if metric not in values:
                    row.append("-")
                    continue
                m, s = mean_std(values[metric])
                text = f"{m:.2f} ± {s:.2f}"
                before = (previous or {}).get(pair, {}).get(cell, {}).get(metric)
                if before:
                    pm, _ = mean_std(before)
                    text += f" (was {pm:.2f})"
                    if regression(metric, values[metric], before):
                        text += " REGRESSION"
                        regressions.append(f"{pair} {dict(zip(keys, cell))} {metric}: {pm:.3f} -> {m:.3f}")
                row.append(text)
            md.append("| " + " | ".join(row) + " |")
            rows_html.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
        md.append("")
        body.append(f"<h3>{html.escape(pair)}</h3><table border=1 cellpadding=4><tr>"
                    + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>" + "".join(rows_html) + "</table>")
    page = "<html><head><meta charset='utf-8'><title>Ablation report</title></head><body>" + "".join(body) + "</body></html>"
    return "\n".join(md), page, regressions


def plot(keys, table, out_dir: Path) -> list[Path]:
    """One figure per pair: each metric against the first grid key, mean with std error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for pair, cells in sorted(table.items()):
        fig, ax = plt.subplots(figsize=(6, 4))
        ordered = sorted(cells, key=lambda c: tuple(str(v) for v in c))
        labels = [", ".join(str(v) for v in c) for c in ordered]
        for metric in sorted({m for c in cells.values() for m in c}):
            stats = [mean_std(cells[c][metric]) if metric in cells[c] else (float("nan"), 0.0) for c in ordered]
            ax.errorbar(range(len(ordered)), [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", capsize=3, label=metric)
        ax.set_xticks(range(len(ordered)), labels)
        ax.set_xlabel(", ".join(keys) or "setting")
        ax.set_title(pair)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{pair}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def write_report(state, previous_state=None) -> tuple[list[Path], list[str]]:
    keys, table = collect(state)
    previous = collect(previous_state)[1] if previous_state else None
    markdown, page, regressions = render(keys, table, previous)
    out_dir = state.dir / "report"
    out_dir.mkdir(exist_ok=True)
    title = f"# Ablation {state.launch_id}" + (f" (compared with {previous_state.launch_id})" if previous_state else "")
    (out_dir / "report.md").write_text(title + "\n\n" + markdown + "\n")
    (out_dir / "report.html").write_text(page)
    paths = [out_dir / "report.md", out_dir / "report.html"] + plot(keys, table, out_dir)
    mlflow = tracking.client(state.tracking_uri)
    for path in paths:
        mlflow.log_artifact(state.parent_run_id, str(path), "report")
    return paths, regressions
