"""A search pair's trials as the report shows them: each trial's row (its number, the values TPE
chose, how it ended, its scores and learning curves), the winner and any tie at its score, Optuna's
hyperparameter importances, and the search's figures.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import optuna

from ..record.optuna_store import search_storage
from ..record.ranking import Ranking
from ..record.runs import CONFIG_TAG, DIVERGED_AT_TAG, STATUS_TAG
from ..record.summaries import may_answer, outcome_text
from . import plots

CURVES_DRAWN = 100  # the learning-curve figure's most trials


def trial_entry(run, pair, study, mlflow) -> dict | None:
    """A search trial's row: its run, the values TPE chose, status, last iteration, selection metric
    and test score, learning curves; None for another pair's run, a confirmation's, or a lost one."""
    if run.data.tags.get("pair") != pair.name or run.data.tags.get("phase") == "confirm":
        return None
    status = run.data.tags.get(STATUS_TAG, "running")
    if status == "lost":  # replaced by another trial on resume
        return None
    config = json.loads(run.data.tags.get(CONFIG_TAG, "{}"))
    # The IID curve is read only for the trials the figure draws (with_iid_curves): a read a curve,
    # thousands of them at thousands of trials. Both scores are logged at each evaluation.
    ood = curve(mlflow, run.info.run_id, f"ood_valid_{study.score}")
    steps = [step for step, _ in ood]
    if DIVERGED_AT_TAG in run.data.tags:  # where it stopped, past its last evaluation
        steps.append(int(run.data.tags[DIVERGED_AT_TAG]))
    return {
        "run_id": run.info.run_id,
        "name": run.info.run_name or "",
        "status": status,
        "outcome": outcome_text(run.data.tags),  # with where it diverged, or its error's last line
        "last_step": max(steps, default=0),
        "params": {k: config[k] for k in pair.space if k in config},
        "metric": run.data.metrics.get(study.metric),
        "test": run.data.metrics.get(study.headline),
        "metrics": dict(run.data.metrics),
        "curves": {f"ood_valid_{study.score}": ood},
        "start": run.info.start_time,
    }


def curve(mlflow, run_id: str, name: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(mlflow.get_metric_history(run_id, name), key=lambda m: m.step)]


def drawn(trials: list[dict], best: dict | None) -> list[dict]:
    """The trials whose learning curves the figure draws: every one up to CURVES_DRAWN, else the best
    and an even spread of the rest in the order they started (more lines are one smear)."""
    if len(trials) <= CURVES_DRAWN:
        return trials
    every = (len(trials) - 1) / (CURVES_DRAWN - 2)
    picked = {round(k * every) for k in range(CURVES_DRAWN - 1)}
    return [t for n, t in enumerate(trials) if n in picked or t is best]


def with_iid_curves(trials: list[dict], mlflow, score: str) -> list[dict]:
    for trial in trials:
        trial["curves"][f"iid_valid_{score}"] = curve(mlflow, trial["run_id"], f"iid_valid_{score}")
    return trials


def number_trials(trials: list[dict], best: dict | None) -> None:
    """Each trial's number, whether it won, and its label, in the order the trials started."""
    trials.sort(key=lambda t: t["start"])
    for position, trial in enumerate(trials, 1):
        # The number in its run's name (callbacks.TrialTracker.short_name), which MLflow and the
        # console show too: after a driver resume, a lost trial's replacement has the lost one's.
        named = re.match(r"#(\d+) ", trial["name"])
        number = int(named.group(1)) if named else position
        trial.update(
            number=number,
            best=trial is best,
            label=f"#{number} "
            + " ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial["params"].items()
            ),
        )


def tie_at_best(scored: list[dict], best: dict | None, decided_by: str | None) -> dict | None:
    """The trials that tie the winner on the metric (their numbers, the range of their test scores)
    and what chose among them (ranking.Ranking's tie-breaks): the rule's choice, not a finding. None
    without a tie."""
    tied = [t for t in scored if t["metric"] == best["metric"]]  # in the order they started, as runs come
    tests = [t["test"] for t in tied if t["test"] is not None]
    return (
        {
            "numbers": [t["number"] for t in tied],
            "tests": (min(tests), max(tests)) if tests else None,
            "decided_by": decided_by,
        }
        if len(tied) > 1
        else None
    )


def search_trials(state, study, pair, runs: list, mlflow, out_dir: Path) -> dict:
    """A search pair's trials as the report shows them: every trial (its number, the values TPE
    chose, status, last iteration, selection metric and test score), the winning config, Optuna's
    hyperparameter importances from the stored study, and figures: the trials' learning curves (up
    to CURVES_DRAWN of them) and the metric against each searched hyperparameter."""
    trials = [t for t in (trial_entry(run, pair, study, mlflow) for run in runs) if t is not None]
    # Of those that may answer, by ranking.Ranking's rule: as summaries.pair_summaries and answer_runs.
    scored = [t for t in trials if t["metric"] is not None and may_answer(t["status"])]
    choice = Ranking.of(study.metric, study.score, study.mode).best(scored, lambda t: t["metrics"])
    best = scored[choice.index] if choice else None
    number_trials(trials, best)
    chance = pair.chance(study.score)
    figures = []
    if trials:
        shown = with_iid_curves(drawn(trials, best), mlflow, study.score)
        figures.append(plots.learning_curves(pair.name, shown, len(trials), study.score, chance, out_dir))
    sliced = plots.slices(
        pair.name,
        trials,
        pair.space,
        study.metric,
        chance,
        out_dir,
    )
    return {
        "trials": trials,
        "best": best,
        "tie": tie_at_best(scored, best, choice.decided_by if choice else None),
        "importances": importances(state, pair, trials),
        "figures": figures + ([sliced] if sliced else []),
        "space": {k: f"{d.kind} {list(d.values)}" for k, d in pair.space.items()},
    }


def importances(state, pair, trials: list[dict]) -> list[tuple[str, float]] | str:
    """Optuna's hyperparameter importances (its default evaluator) of the pair's stored study, most
    important first; or why there are none (in the report, not as a warning on the console)."""
    if len(pair.space) < 2:
        return f"one searched hyperparameter ({', '.join(pair.space) or 'none'}): nothing to rank"
    finished = [t for t in trials if t["metric"] is not None]
    if len(finished) < 3:
        return f"{len(finished)} trial(s) with a score: too few to rank hyperparameters"
    try:
        study = optuna.load_study(
            study_name=state.optuna_study_name(pair.name),
            storage=search_storage(state.tracking_uri, state.dir, read_only=True),
        )
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            ranked = list(optuna.importance.get_param_importances(study).items())
        equal = [w for w in said if "importances will be equal" in str(w.message)]
        return f"not ranked: {equal[0].message}" if equal else ranked
    except Exception as e:  # a missing ranking is no reason to fail the report
        return f"not computed ({(str(e) or type(e).__name__).splitlines()[0]})"
