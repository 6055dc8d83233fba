"""Search-space files (search_spaces/*.yaml) -> a validated Study.

Everything that can be wrong with a file is found here, before Ray starts or MLflow is written:
each error is one line naming the file, the key and the reason.
"""

from __future__ import annotations

from pathlib import Path

from .pairs import (
    Shared,
    check_named_keys,
    incompatible_pairs,
    parse_models,
    parse_pairs,
    parse_per_pair,
    parse_tasks,
    skipped_pairs,
)
from .sections import (
    check_detectable,
    is_ablation,
    metric_score,
    parse_batch_seeds,
    parse_budget,
    parse_confirm,
    parse_fixed,
    parse_grid,
    parse_metric,
    parse_mode,
    parse_per_model,
    parse_report,
    parse_resources,
    parse_scheduler,
    parse_seed,
    parse_storage,
    parse_storage_path,
    parse_top,
    parse_tracking,
    refuse_set_elsewhere,
    switch,
    text_value,
    unused_keys,
)
from .source import read_yaml, safe_name
from .space import parse_space
from .study import Resources, Study


def load_study(path: str | Path, text: str | None = None, recorded: bool = False) -> Study:
    """The Study of a file (or of `text`, read as that file): each section parsed on its own, in the
    order that decides which of a file's errors is its first, then the pairs they make. `recorded`:
    the text a launch ran, read again as it ran (a file refused now as meaningless, a listed model
    that cannot run a task, a grid without seeds, once ran: its launch stays readable)."""
    path = Path(path)
    raw = parse_top(read_yaml(path, text), path)
    metric, seed = parse_metric(raw, path), parse_seed(raw, path)
    budget = parse_budget(raw.get("budget"), path)
    scheduler = parse_scheduler(raw.get("scheduler"), path)
    resources = parse_resources(raw.get("resources"), Resources(), "resources", path)
    tracking = parse_tracking(raw.get("tracking"), path)
    tasks = parse_tasks(raw.get("tasks"), path)
    score = metric_score(metric, tasks, path)
    mode = parse_mode(raw, metric, score, path)
    models = parse_models(raw.get("models"), path)
    incompatible = incompatible_pairs(tasks, models, raw.get("models") != "all" and not recorded, path)
    space = parse_space(raw.get("space") or {}, "space", path)
    refuse_set_elsewhere(space, "space", path)
    per_model = parse_per_model(raw.get("per_model"), path)
    fixed = parse_fixed(raw.get("fixed"), path)
    per_pair = parse_per_pair(raw.get("per_pair"), tasks, models, path)
    grid, seeds = parse_grid(raw, path, recorded=recorded)
    ablation = is_ablation(grid, seeds, space, per_model, path, needs_seeds=not recorded)
    report = parse_report(raw.get("report"), grid, path)
    confirm = parse_confirm(raw.get("confirm"), budget, ablation, path)
    batch_seeds = parse_batch_seeds(raw, path)
    storage_path = parse_storage_path(raw, path)
    shared = Shared(space, fixed, grid, resources, budget, seed)
    pairs = parse_pairs(tasks, models, per_model, per_pair, shared, incompatible, path, recorded)
    check_named_keys(models, per_model, space, fixed, grid, path)
    skipped = skipped_pairs(incompatible, pairs, path)
    check_detectable(path, report, pairs, seeds)
    name = safe_name(text_value(raw, "name", path.stem, path), path, "name")
    return Study(
        path=path,
        name=name,
        metric=metric,
        mode=mode,
        score=score,
        seed=seed,
        pairs=pairs,
        skipped=skipped,
        budget=budget,
        scheduler=scheduler,
        resources=resources,
        tracking=tracking,
        warm_start=switch(raw, "warm_start", True, path),
        storage_path=storage_path,
        storage=parse_storage(raw.get("storage"), storage_path, path),
        grid=grid,
        seeds=seeds,
        report=report,
        confirm=confirm,
        batch_seeds=batch_seeds,
        unused=unused_keys(raw, ablation),
    )
