"""`best/<pair>.yaml`, a search's answer per pair, from launch.json's plan and the tracking store
alone: no Ray, no spec parsing, no torch, so that `orchestrator best` is as quick as `status`."""
from __future__ import annotations

from pathlib import Path

import yaml

from . import tracking
from .state import LaunchState


def write_best(state: LaunchState, summaries: dict | None = None) -> list[Path]:
    """Per pair, `best/<pair>.yaml`: the confirmed candidate where the search was confirmed (the
    best mean over new seeds), else the best trial. `summaries`: tracking.pair_summaries, if read already."""
    plan = state.the_plan()
    metric, score = plan["metric"], plan["score"]
    summaries = summaries or tracking.pair_summaries(state.tracking_uri, state.experiment, state.launch_id, metric, score)
    out = []
    for pair_name, summary in sorted(summaries.items()):
        if not summary["best_config"]:
            continue
        path = state.dir / "best" / f"{pair_name}.yaml"
        path.parent.mkdir(exist_ok=True)
        config, confirmed = summary["best_config"], summary.get("confirmed")
        header = (f"# Best trial of {pair_name} in launch {state.launch_id}: {metric} = {summary['best']:.4f}, "
                  f"test_{score}_at_best = {summary['test']}\n# MLflow run {summary['best_run']}.\n")
        if confirmed:
            top_k = plan["top_k"] if "top_k" in plan else state.study().confirm.top_k  # a plan saved before top_k was
            config = {**confirmed["config"], "seed": config.get("seed", 0)}
            header += (f"# Written: its confirmed candidate {confirmed['candidate'] + 1} of {top_k}, "
                       f"{metric} {confirmed['metric']:.4f} on average, {tracking.confirmed_text(confirmed)}.\n")
        path.write_text(header + f"# Run it again with: orchestrator train {path}\n" + yaml.safe_dump({"config": config}, sort_keys=True))
        out.append(path)
    return out
