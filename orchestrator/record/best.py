"""`best/<pair>.yaml`, a search's answer per pair, from launch.json's plan and the tracking store
alone: no Ray, no spec parsing, no torch, so that `orchestrator best` is as quick as `status`. With
`--ablation FILE`, that file again with each pair's winning values as `per_pair` (this one parses
both files, so it imports torch)."""

from __future__ import annotations

from pathlib import Path

import yaml

from .files import write_atomically
from .runs import DATA_HASH_TAG, KERNELS_TAG
from .secrets import redact_secrets
from .state import LaunchState, headline_of
from .summaries import confirmed_text, pair_summaries


def summaries_of(state: LaunchState, runs: list | None = None) -> dict:
    """summaries.pair_summaries of the launch, by its plan's metric and score. `runs`: the launch's
    trial runs, where already read."""
    plan = state.the_plan()
    return pair_summaries(
        state.tracked,
        plan["metric"],
        plan["score"],
        runs,
        headline=headline_of(plan),
    )


def best_configs(
    state: LaunchState, summaries: dict | None = None
) -> dict[str, tuple[dict, str, dict[str, str]]]:
    """Per pair with a result, (its answer's config as the trial ran it, threads included, a header
    saying where it comes from, what it ran on as recorded: the hash of its data, its CPU's
    kernels): the confirmed candidate where the search was confirmed (the best mean over new
    seeds), else the best trial. `summaries`: summaries_of(state), if read already."""
    plan = state.the_plan()
    metric = plan["metric"]
    summaries = summaries or summaries_of(state)
    out = {}
    for pair_name, summary in sorted(summaries.items()):
        if not summary["best_config"]:
            continue
        config, confirmed = summary["best_config"], summary.get("confirmed")
        header = (
            f"# Best trial of {pair_name} in launch {state.launch_id}: {metric} = {summary['best']:.4f}, "
            f"{headline_of(plan)} = {summary['test']}\n# MLflow run {summary['best_run']}.\n"
        )
        if confirmed:
            top_k = (
                plan["top_k"] if "top_k" in plan else state.study().confirm.top_k
            )  # a plan saved before top_k was
            config = {**confirmed["config"], "seed": config.get("seed", 0)}
            header += (
                f"# Written: its confirmed candidate {confirmed['candidate'] + 1} of {top_k}, "
                f"{metric} {confirmed['metric']:.4f} on average, {confirmed_text(confirmed)}.\n"
            )
        # `orchestrator train` says so where it reads other data, or its CPU rounds otherwise
        recorded = {DATA_HASH_TAG: summary.get("best_data"), KERNELS_TAG: summary.get("best_kernels")}
        recorded = {key: value for key, value in recorded.items() if value}
        if recorded:
            header += f"# Ran on: {', '.join(f'{k} {v}' for k, v in recorded.items())}.\n"
        out[pair_name] = (config, header, recorded)
    return out


def write_best(state: LaunchState, summaries: dict | None = None) -> list[Path]:
    """Per pair, `best/<pair>.yaml` (best_configs), which `orchestrator train` runs again."""
    out = []
    for pair_name, (config, header, recorded) in best_configs(state, summaries).items():
        path = state.dir / "best" / f"{pair_name}.yaml"
        path.parent.mkdir(exist_ok=True)
        write_atomically(
            path,
            header
            + f"# Run it again with: orchestrator train {path}\n"
            + yaml.safe_dump({"config": config, **recorded}, sort_keys=True),
        )
        out.append(path)
    return out


def searched_and_ablation(state: LaunchState, ablation: Path):
    """(the launch's search, the ablation file's study): ValueError (a SpecError naming the file's
    key) where the file does not load, or the two are not a search and an ablation."""
    # The plan and its registries: 0.3 s that `status` and `best` without --ablation go without.
    from ..plan.load import load_study  # noqa: PLC0415

    search, study = state.study(), load_study(ablation)
    if search.is_ablation or not study.is_ablation:
        raise ValueError(
            "--ablation hands a search's winners to an ablation file: "
            f"{state.launch_id} is {'an ablation' if search.is_ablation else 'a search'}"
            f", {ablation} {'an ablation' if study.is_ablation else 'a search'}"
        )
    return search, study


def tuned_pairs(state: LaunchState, search, study, winners: dict, per_pair: dict, so_far: str) -> list[str]:
    """Into `per_pair` (the ablation file's), per pair the search answered on the same task and
    options, the values it chose as `<pair>.fixed`; -> a line per pair saying what it got."""
    searched = {pair.name: pair for pair in search.pairs}
    lines = []
    for pair in study.pairs:
        ran = searched.get(pair.name)
        if pair.name not in winners:
            lines.append(
                f"{pair.name}: {'no result in' if ran else 'not a pair of'} search {state.launch_id}; "
                "the file's values"
            )
            continue
        # a variant name shared by other task options
        if (ran.task.task, ran.task.options) != (pair.task.task, pair.task.options):
            lines.append(
                f"{pair.name}: search {state.launch_id} ran it on {ran.task.task} {ran.task.options}, "
                f"this file on {pair.task.task} {pair.task.options}; the file's values"
            )
            continue
        config = winners[pair.name][0]
        values = {k: config[k] for k in ran.space if k in config and k not in pair.grid}
        per_pair[pair.name] = {"fixed": {**((per_pair.get(pair.name) or {}).get("fixed") or {}), **values}}
        swept = sorted(k for k in ran.space if k in pair.grid)
        got = ", ".join(f"{k}={v}" for k, v in values.items()) or "nothing searched to hand on"
        lines.append(
            f"{pair.name}: {got}"
            + (f" (its grid sweeps {', '.join(swept)})" if swept else "")
            + (so_far if values else "")
        )
    return lines


def write_ablation(
    state: LaunchState, ablation: Path, summaries: dict | None = None, studies: tuple | None = None
) -> tuple[Path, list[str]]:
    """`best/<ablation's stem>_tuned.yaml`: the ablation file, named `<its name>_tuned` (its launches
    are compared, night after night, with each other, not with the untuned file's), with, per pair
    the search answered on the same task and options, the values the search chose (its searched
    keys, but those the ablation's grid sweeps) as `per_pair.<pair>.fixed`, over the file's own; ->
    (the file, a line per pair saying what it got). ValueError where either file is no such
    launch's or the result would not load. `studies`: searched_and_ablation's, where already read."""
    from ..plan.load import load_study  # noqa: PLC0415 - as in searched_and_ablation
    from ..plan.source import SpecError  # noqa: PLC0415 - as in searched_and_ablation

    search, study = studies or searched_and_ablation(state, ablation)
    winners = best_configs(state, summaries)
    raw = yaml.safe_load(ablation.read_text())
    per_pair = dict(raw.get("per_pair") or {})
    so_far = "" if state.state == "finished" else f" (so far: the search is {state.state})"
    lines = tuned_pairs(state, search, study, winners, per_pair, so_far)
    path = state.dir / "best" / f"{ablation.stem}_tuned.yaml"
    path.parent.mkdir(exist_ok=True)
    header = (
        f"# {ablation} with the winners of search {state.launch_id} ({search.metric}){so_far} "
        "as per_pair.<pair>.fixed,\n"
        f"# over the file's own values (its comments are in {ablation}). "
        f"Launch it with: orchestrator launch {path}\n"
    )
    # Passwords stay out of the launch folder, as everywhere: a launch reads them from MLFLOW_TRACKING_URI.
    tuned = {**raw, "name": f"{raw.get('name', ablation.stem)}_tuned", "per_pair": per_pair}
    text = header + redact_secrets(yaml.safe_dump(tuned, sort_keys=False, default_flow_style=None, width=120))
    try:
        load_study(path, text=text)
    except SpecError as e:
        raise ValueError(f"the file with the winners would not load: {e}") from None
    write_atomically(path, text)
    return path, lines
