"""A launch's table in words, as `status` prints it and a launch closes with it: per pair of a
search, its trials by how they ended, the best trial's metric and headline test score; per grid
cell of an ablation, its seeds by how they ended and the mean ± std over its done seeds of both. The
headline is the file's (Study.headline), the same the answer and the report lead with."""

from __future__ import annotations

import itertools
import statistics

from .state import headline_of
from .summaries import cell_name, cell_order, cell_summaries, confirmed_text, pair_summaries

TIE_NOTE = "{pair}: its best trial tied others on {metric}; chosen by {decided_by} (the tie-break rule)"


def spread(values: list[float]) -> str:
    """Values as mean ± sample std, "-" for none."""
    if not values:
        return "-"
    return f"{statistics.fmean(values):.4f}" + (
        f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else ""
    )


def launch_table(state, plan: dict, running: str, summaries: dict | None = None) -> list[str]:
    """The launch's table (`running`: what to call the runs still going, "running" or, with no
    driver, "unfinished"). `summaries`: pair_summaries' of a search, where already read."""

    def read(summarize) -> dict:
        return summarize(state.tracked, plan["metric"], plan["score"], headline=headline_of(plan))

    if plan["ablation"]:
        return cell_table(plan, read(cell_summaries), running)
    return trial_table(plan, read(pair_summaries) if summaries is None else summaries, running)


def trial_table(plan: dict, summaries: dict, running: str) -> list[str]:
    """A search's table: per pair, its trials by how they ended, the best so far and its headline."""
    asha, headline = plan.get("asha", True), headline_of(plan)  # a plan saved before `asha`: ASHA may stop

    def stopped(value) -> str:
        return f" {value:>8}" if asha else ""

    width = max(len(headline), 8)
    lines = [
        f"{'pair':40s} {'done':>5s}{stopped('stopped')} {running:>10s} {'failed':>7s} {'of':>4s} "
        f"{'best':>8s} {headline:>{width}s}  chance"
    ]
    for pair in plan["pairs"]:
        s = summaries.get(pair["name"], {"done": 0, "stopped": 0, "running": 0, "failed": 0, "best": None})
        best = "-" if s.get("best") is None else f"{s['best']:.4f}"
        test = "-" if s.get("test") is None else f"{s['test']:.4f}"
        lines.append(
            f"{pair['name']:40s} {s.get('done', 0):5d}{stopped(s.get('stopped', 0))} "
            f"{s.get('running', 0):10d} {s.get('failed', 0):7d} {pair['trials']:4d} "
            f"{best:>8s} {test:>{width}s}  {pair['chance']}"
        )
        if s.get("confirmed"):
            lines.append(f"{'':40s} {confirmed_text(s['confirmed'])}")
        if s.get("decided_by"):
            lines.append(f"  {TIE_NOTE.format(pair=pair['name'], metric=plan['metric'], **s)}")
    diverged = ", ".join(f"{name} {s['diverged']}" for name, s in summaries.items() if s.get("diverged"))
    lines.append(
        "("
        + ("'stopped': ended early by ASHA; " if asha else "")
        + (f"'failed' counts those that diverged ({diverged}); " if diverged else "")
        + f"'of': the pair's trials; {headline}: of the best trial)"
    )
    return lines


def cell_table(plan: dict, summaries: dict, running: str) -> list[str]:
    """An ablation's table: per pair and grid cell, in numeric order, its seeds by how they ended
    and the mean ± std over its done seeds of the metric and the headline test score."""
    headline = headline_of(plan)
    width = max(len(plan["metric"]), len(headline), len("0.0000 ± 0.0000")) + 2
    lines = [
        f"{'pair / grid cell':40s} {'done':>5s} {running:>10s} {'failed':>7s} {'of':>4s} "
        f"{plan['metric']:>{width}s} {headline:>{width}s}"
    ]
    for pair in plan["pairs"]:
        cells = summaries.get(pair["name"], {})
        lines.append(f"{pair['name']} ({pair['chance']})")
        lines += cell_rows(plan, pair, cells, width)
    diverged = ", ".join(
        f"{name} {c['diverged']}"
        for pair in summaries.values()
        for name, c in sorted(pair.items(), key=lambda e: cell_order(e[0]))
        if c.get("diverged")
    )
    lines.append(
        "("
        + (f"'failed' counts seeds that diverged ({diverged}); " if diverged else "")
        + "'of': the cell's seeds; mean ± std over its done seeds)"
    )
    return lines


def cell_rows(plan: dict, pair: dict, cells: dict, width: int) -> list[str]:
    """A pair's row per grid cell: the cells its plan names, and any other its runs name."""
    grid = pair.get("grid")  # None in a launch.json from before grids were saved: the cells its runs name
    planned = (
        {cell_name(dict(zip(grid, values))) for values in itertools.product(*grid.values())}
        if grid is not None
        else set()
    )
    names = sorted(planned | set(cells), key=cell_order)
    # an old plan: right once every cell has started
    seeds = plan["seeds"] if "seeds" in plan else pair["trials"] // max(1, len(names))
    rows = []
    for name in names:
        c = cells.get(name, {"done": 0, "running": 0, "failed": 0, "metric": [], "test": []})
        rows.append(
            f"  {'(seeds only)' if name == '-' else name:38s} {c['done']:5d} {c['running']:10d} "
            f"{c['failed']:7d} {seeds:4d} "
            f"{spread(c['metric']):>{width}s} {spread(c['test']):>{width}s}"
        )
    return rows
