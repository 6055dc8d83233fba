"""Figures shared by the report's modules and the attention maps (maps.py): matplotlib set up
without a display, a figure saved as a PNG and returned as base64 for the HTML page, titles wrapped
to the figure's width, chance drawn on every accuracy axis; the test score by split of every model
on one axis (the report's top); a pair's own figures (its cells against each swept key, its test
score per length, its cells night after night); and a search's own figures (learning curves of
every trial, the metric against each searched hyperparameter, Optuna's importances)."""

from __future__ import annotations

import base64
import math
import textwrap
from pathlib import Path

import pandas as pd

from ..record.files import atomic_path
from .frames import TEST_SPLIT, cell_name, numeric_key, numeric_order, split_order


def pyplot():
    # matplotlib takes a second to import: only a report draws.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def figure_png(fig, path: Path) -> str:
    """Save `fig` to `path`; -> the PNG as base64, for the HTML page to embed."""
    plt = pyplot()
    fig.tight_layout()
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=100, format="png")  # the temporary's name has no .png
    plt.close(fig)
    return base64.b64encode(path.read_bytes()).decode()


def wrapped(text: str, inches: float, fontsize: float) -> str:
    """`text` broken into lines that fit `inches` of width at `fontsize` points (a character is
    about half its point size wide)."""
    return textwrap.fill(text, width=max(20, int(inches * 72 / (0.55 * fontsize))))


def set_title(ax, text: str, fontsize: float = 9) -> None:
    ax.set_title(
        wrapped(text, ax.figure.get_figwidth() * ax.get_position().width, fontsize), fontsize=fontsize
    )


def set_suptitle(fig, text: str, fontsize: float = 9) -> None:
    fig.suptitle(wrapped(text, fig.get_figwidth(), fontsize), fontsize=fontsize)


def chance_level(chance: str) -> float | None:
    """The number in a task's chance text ("uniform guess: 0.077" -> 0.077)."""
    try:
        return float(chance.rsplit(" ", 1)[-1])
    except (ValueError, AttributeError):
        return None


def draw_chance(ax, chance: str | None, metric: str) -> None:
    """On an accuracy axis: chance as a dashed line, and the axis from 0 to 1, so that noise at
    chance never looks like an effect."""
    level = chance_level(chance) if chance else None
    if not metric.endswith("_acc") and "_acc_" not in metric:
        return
    ax.set_ylim(0, 1.02)
    if level is not None:
        ax.axhline(level, color="grey", linestyle="--", linewidth=1, label=f"chance {level:.3f}")


def split_axis(splits: list[str]) -> str:
    """The x axis of test scores by split: depths, lengths, PANM's L and multiples of L+1."""
    first = splits[0]
    if first.startswith("depth"):
        return "test depth"
    if first.isdigit():
        return "test length"
    return "test length (L, then multiples of L+1)" if first == "L" or first.startswith("x") else "test split"


def across_models(
    name: str, splits: list[str], lines: list[dict], chance: str | None, score: str, out_dir: Path
) -> tuple[Path, str]:
    """Every model's test score by split on one axis: `lines`, each a `label` and per split its
    report entry or None (`summary`: the mean and 95% interval over seeds, drawn as a bar; and
    `published`: the paper's number, a cross in the model's colour); chance dashed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.3))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, line in enumerate(lines):
        color = colors[k % len(colors)]
        summaries = [point["summary"] if point else None for point in line["points"]]
        means = [s.mean if s else math.nan for s in summaries]
        below = [s.mean - s.ci[0] if s and s.ci else 0.0 for s in summaries]
        above = [s.ci[1] - s.mean if s and s.ci else 0.0 for s in summaries]
        ax.errorbar(
            splits, means, yerr=[below, above], marker="o", capsize=3, color=color, label=line["label"]
        )
        paper = [
            point["published"]["mean"] if point and point["published"] else math.nan
            for point in line["points"]
        ]
        if any(math.isfinite(v) for v in paper):
            ax.plot(
                splits,
                paper,
                linestyle="none",
                marker="x",
                markersize=8,
                color=color,
                label=f"{line['label']}: the paper's",
            )
    metric = f"test_{score}_at_best"
    draw_chance(ax, chance, metric)
    ax.set_xlabel(split_axis(splits))
    ax.set_ylabel(f"test {score} at best")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    set_title(ax, f"{name}: each model's best (bars: 95% interval over seeds; x: the paper's)")
    path = out_dir / f"{name}_across_models.png"
    return path, figure_png(fig, path)


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
    ax.set_xlabel(split_axis(splits))
    ax.set_ylabel(f"test {score} at best")
    draw_chance(ax, chance, f"test_{score}_at_best")
    ax.legend(fontsize=7, loc="best")
    set_title(ax, f"{pair}: generalization to longer or deeper inputs (x: the paper's)")
    path = out_dir / f"{pair}_lengths.png"
    return [(path, figure_png(fig, path))]


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


def learning_curves(
    pair: str, trials: list[dict], of: int, score: str, chance: str, out_dir: Path
) -> tuple[Path, str]:
    """Per trial, its OOD and IID validation score against iterations (a panel each); a trial
    ASHA stopped is dashed and ends in an x, the best trial drawn thicker. `trials`: dicts with
    `label`, `status`, `best` and `curves` ({metric name: [(step, value), ...]}), drawn from `of`
    trials in all (the title says so where they are fewer)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, split in zip(axes[0], ("ood_valid", "iid_valid")):
        metric = f"{split}_{score}"
        for k, trial in enumerate(trials):
            points = trial["curves"].get(metric) or []
            if not points:
                continue
            steps, values = zip(*points)
            stopped = trial["status"] != "completed"
            ax.plot(
                steps,
                values,
                color=colors[k % len(colors)],
                linestyle="--" if stopped else "-",
                linewidth=2.5 if trial["best"] else 1.2,
                marker="o" if len(steps) == 1 else None,  # one evaluation: a point, which no line shows
                label=trial["label"] if split == "ood_valid" else None,
            )
            if stopped:
                ax.plot(steps[-1], values[-1], marker="x", color=colors[k % len(colors)])
        draw_chance(ax, chance, metric)
        ax.set_xlabel("iteration")
        ax.set_ylabel(metric)
        set_title(ax, f"{'OOD' if split == 'ood_valid' else 'IID'} validation")
    if len(trials) <= 12:
        axes[0][0].legend(fontsize=6, loc="best")
    which = (
        "every trial's learning curve"
        if len(trials) == of
        else f"{len(trials)} of {of} trials' learning curves (the best and an even spread in start order)"
    )
    set_suptitle(fig, f"{pair}: {which} (dashed, x: stopped early or not completed; thick: the best)")
    path = out_dir / f"{pair}_curves.png"
    return path, figure_png(fig, path)


def slices(
    pair: str, trials: list[dict], space: dict, metric: str, chance: str, out_dir: Path
) -> tuple[Path, str] | None:
    """The selection metric of each trial against each searched hyperparameter (Optuna's slice
    plot) over its searched range, on a log axis where it was searched log-uniformly; `space`:
    name -> its distribution (plan.space: its span, none for a choice, and its scale). Completed
    trials filled, the others hollow."""
    shown = [name for name in space if any(name in t["params"] for t in trials)]
    if not shown:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(shown), figsize=(max(5.0, 3.4 * len(shown)), 3.4), squeeze=False)
    for ax, name in zip(axes[0], shown):
        for completed in (True, False):
            points = [
                (t["params"][name], t["metric"])
                for t in trials
                if name in t["params"]
                and t["metric"] is not None
                and math.isfinite(t["metric"])
                and (t["status"] == "completed") == completed
            ]
            if points:
                xs, ys = zip(*points)
                ax.scatter(
                    [x if space[name].span else str(x) for x in xs],
                    ys,
                    s=28,
                    facecolors="C0" if completed else "none",
                    edgecolors="C0",
                    label="completed" if completed else "stopped / other",
                )
        if space[name].log_scale:
            from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator  # noqa: PLC0415 - see pyplot

            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_minor_locator(NullLocator())  # labelled minor ticks overlap over a short range
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2g}"))
        if space[name].span:
            ax.set_xlim(*space[name].span)  # where in the searched range the trials fell
        ax.tick_params(axis="x", labelsize=7)
        draw_chance(ax, chance, metric)
        ax.set_xlabel(name)
        ax.set_ylabel(metric)
    axes[0][0].legend(fontsize=6, loc="best")
    set_suptitle(fig, f"{pair}: {metric} against each searched hyperparameter")
    path = out_dir / f"{pair}_slices.png"
    return path, figure_png(fig, path)
