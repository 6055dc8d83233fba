"""A search's answer: per task, which model generalizes best on the file's headline test split, or
that none passes chance or the top two do not differ, in words (the launch's closing lines and the
report's first section) and as the picture of every model's answering row across test lengths.
"""

from __future__ import annotations

from pathlib import Path
from statistics import fmean

from ..record.summaries import fall_text
from . import plots, stats
from .frames import cell_name, length_metrics, lower_is_better, row_rank, split_label
from .papers import PAPER_NAMES, published_for


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
