"""Ablation reports from a real MLflow store (SQLite) holding runs written as the tracker writes them:
every number equals an independent aggregation of the runs, rows come in numeric order, the
published numbers stand beside ours, and a regression needs a test across seeds."""

import dataclasses
import json
import re
import uuid

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.record import runs, stores
from orchestrator.record.runs import DIVERGED_AT_TAG, artifact_root
from orchestrator.record.state import SNAPSHOT_MODULES, LaunchState
from orchestrator.report import cells, compare, frames, pages, papers, plots, report, stats
from orchestrator.report.trials import CURVES_DRAWN, drawn

LAYERS = [4, 6, 8, 10, 12, 14]  # as text, 10 would sort before 4


def ablation_text(name: str, **extra) -> str:
    data = {
        "name": name,
        "tasks": [{"task": "ctl", "variant": "ctl_backward", "options": {"direction": "backward"}}],
        "models": ["ndr"],
        "metric": "best_ood_valid_acc",
        "grid": {"n_layers": LAYERS},
        "seeds": [0, 1, 2],
        "report": {"solved_at": 0.95, **extra},
    }
    return yaml.safe_dump(data)


def fake_launch(
    tmp_path,
    uri: str,
    launch_id: str,
    scores,
    text: str,
    statuses: dict | None = None,
    trained=lambda layers, seed: {},
    code: str = "abc1234",
    data_hash: str = "3fa85f6457174562",
) -> LaunchState:
    """A finished ablation launch in the store: scores[(n_layers, seed)] -> test accuracy, and
    statuses[(n_layers, seed)] where a run did not complete (a failed one logged no metrics);
    trained(n_layers, seed): config keys a run had beside the usual ones; the commit the launch ran
    and the hash of its runs' data."""
    client = MlflowClient(uri)
    experiment = "ndr_layers_test"
    exp = client.get_experiment_by_name(experiment)
    exp_id = (
        exp.experiment_id
        if exp
        else client.create_experiment(experiment, artifact_location=artifact_root(uri, tmp_path))
    )
    parent = client.create_run(exp_id, tags={"launch_id": launch_id, "kind": "launch", "code_version": code})
    for (layers, seed), score in scores.items():
        config = {
            "task": "ctl",
            "model": "ndr",
            "n_layers": layers,
            "seed": seed,
            "n_iters": 30000,
            **trained(layers, seed),
        }
        run = client.create_run(
            exp_id,
            tags={
                "mlflow.parentRunId": parent.info.run_id,
                "launch_id": launch_id,
                "kind": "trial",
                "trial_id": uuid.uuid4().hex[:8],
                "pair": "ctl_backward__ndr",
                "model": "ndr",
                "task": "ctl",
                "variant": "ctl_backward",
                "trial_status": (statuses or {}).get((layers, seed), "completed"),
                "trial_config": json.dumps(config),
                "data_hash": data_hash,
            },
        )
        metrics = {
            "best_ood_valid_acc": score - 0.01,
            "test_acc_at_best": score,
            "test_acc_final": score - 0.002,
            "iid_valid_acc_at_best": 1.0,
        }
        for metric, value in metrics.items() if (statuses or {}).get((layers, seed)) != "failed" else ():
            client.log_metric(run.info.run_id, metric, value, step=100)
        client.set_terminated(run.info.run_id)
    folder = tmp_path / launch_id
    folder.mkdir()
    state = LaunchState(
        launch_id,
        folder,
        experiment,
        "ablations/ndr_layers.yaml",
        text,
        uri,
        parent.info.run_id,
        state="finished",
    )
    state.save()
    return state


def scores_for(seed_offset: int, shift: float = 0.0, rng_seed: int = 0) -> dict:
    rng = np.random.default_rng(rng_seed)
    return {
        (layers, seed): float(min(1.0, 0.5 + 0.035 * layers + rng.normal(0, 0.01)) - shift)
        for layers in LAYERS
        for seed in (seed_offset, seed_offset + 1, seed_offset + 2)
    }


@pytest.fixture()
def uri(tmp_path):
    return f"sqlite:///{tmp_path}/mlflow.db"


def test_report_numbers_equal_an_independent_aggregation_in_numeric_order(tmp_path, uri):
    scores = scores_for(0)
    state = fake_launch(tmp_path, uri, "night-1", scores, ablation_text("ndr_layers_test"))
    paths, regressions = report.write_report(state)
    assert regressions == []
    markdown = (state.dir / "report" / "report.md").read_text()
    rows = [line for line in markdown.splitlines() if line.startswith("| n_layers=")]
    assert [
        int(re.match(r"\| n_layers=(\d+)", r).group(1)) for r in rows
    ] == LAYERS  # numeric, not 10, 12, 14, 4
    for layers, row in zip(LAYERS, rows):
        values = [scores[(layers, seed)] for seed in (0, 1, 2)]
        mean, std = np.mean(values), np.std(values, ddof=1)
        assert f"{mean:.3f} ± {std:.3f} [" in row
        solved = sum(v >= 0.95 for v in values) / 3
        assert f"solved {round(solved * 100)}%" in row and f"best {max(values):.3f}" in row
    # The selection metric is a column, numbers have 3 decimals, the launch's metadata heads the page.
    assert (
        "best_ood_valid_acc"
        in markdown.splitlines()[
            next(i for i, line in enumerate(markdown.splitlines()) if line.startswith("| cell"))
        ]
    )
    assert (
        "code abc1234" in markdown
        and "Launch `night-1`" in markdown
        and "No previous launch compared" in markdown
    )
    # NDR Table 4 (CTL backward, 14 layers) from published.yaml beside ours, and Welch's test of our
    # seeds against its 5 runs. The authors' paper/print_ctl_layer_ablation.py reads Table 4 from each
    # run's last evaluation, so the final test score meets it, not the best-validation checkpoint's.
    assert (
        papers.published_for(
            "ndr", "ctl", "ctl_backward", "test_acc_at_best", {"n_layers": 14}, {"n_layers": 14}
        )
        is None
    )
    paper = papers.published_for(
        "ndr", "ctl", "ctl_backward", "test_acc_final", {"n_layers": 14}, {"n_layers": 14}
    )
    # The paper's mean and std as printed, each to its 0.01.
    assert (paper["mean"].unit, paper["std"].unit) == (0.01, 0.01)
    p = stats.paper_p(
        [scores[(14, seed)] - 0.002 for seed in (0, 1, 2)],
        paper["mean"],
        paper["std"],
        paper["runs"],
        0.01,
        0.01,
    )
    assert f"Table 4, p = {p:.3g} against its 5 runs" in rows[-1], rows[-1]
    # At the top, before the pair's section: the best cell by the selection metric across models,
    # its mean and Student-t 95% interval over seeds (CTL here logs no depth: the test set's score).
    from scipy.stats import t

    best = max(LAYERS, key=lambda layers: np.mean([scores[(layers, seed)] for seed in (0, 1, 2)]))
    values = [scores[(best, seed)] for seed in (0, 1, 2)]
    mean, half = np.mean(values), t.ppf(0.975, 2) * np.std(values, ddof=1) / np.sqrt(3)
    top = markdown[markdown.index("## Across models") : markdown.index("## ctl_backward__ndr")]
    assert "| ctl_backward | seeds | test |" in top
    assert f"| ndr (n_layers={best}) | 3 | {mean:.3f} [{mean - half:.3f}, {mean + half:.3f}] |" in top, top
    page = (state.dir / "report" / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 1 and "<table class=\"cells\">" in page
    assert (
        "&amp;workflowType=" in page and "&workflowType=" not in page
    )  # the page escapes what it shows, its links' & too
    assert {p.name for p in paths} >= {
        "report.md",
        "report.html",
        "ctl_backward__ndr.png",
        "ctl_backward_across_models.png",
    }
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(state.parent_run_id, "report")}
    assert {"report/report.md", "report/report.html", "report/ctl_backward__ndr.png"} <= artifacts


def test_one_seed_shows_no_spread_and_the_baseline_is_tested(tmp_path, uri):
    scores = {(layers, 0): 0.5 + 0.03 * layers for layers in LAYERS}
    state = fake_launch(tmp_path, uri, "one-seed", scores, ablation_text("ndr_layers_test"))
    report.write_report(state)
    markdown = (state.dir / "report" / "report.md").read_text()
    assert (
        "(one seed)" in markdown and "± 0.000 [" not in markdown
    )  # ours; the paper's own "1.00 ± 0.00" may show
    state = fake_launch(
        tmp_path,
        uri,
        "with-baseline",
        scores_for(0),
        ablation_text("ndr_layers_test", baseline={"n_layers": 14}),
    )
    report.write_report(state)
    markdown = (state.dir / "report" / "report.md").read_text()
    rows = [line for line in markdown.splitlines() if line.startswith("| n_layers=")]
    assert "vs baseline p = " in rows[0] and "vs baseline p" not in rows[-1]
    assert (
        "against the baseline cell (n_layers=14), per cell and score, not corrected for their number"
        in markdown
    )


def test_each_cell_is_tested_against_the_baseline_cell_of_its_own_other_values():
    """A baseline naming one of two grid keys: each cell against the cell with the baseline's
    n_layers and its own lr; the baseline cells are tested against nothing. A pair whose model
    lacks a baseline key (an LSTM has no n_heads) has no baseline and no error."""
    import pandas as pd

    from orchestrator.plan.study import Report

    rng = np.random.default_rng(0)
    values = {
        (n, lr): list(0.5 + 0.02 * n + 100 * lr + rng.normal(0, 0.01, 3))
        for n in (2, 4)
        for lr in (1e-4, 1e-3)
    }
    frame = pd.DataFrame(
        [
            {
                "config": {"n_layers": n, "lr": lr, "seed": seed},
                "model": "ndr",
                "task": "ctl",
                "variant": "v",
                "test_acc_at_best": v,
            }
            for (n, lr), seeds in values.items()
            for seed, v in enumerate(seeds)
        ]
    )
    rows = cells.cell_rows(frame, ["n_layers", "lr"], ["test_acc_at_best"], Report(), {"n_layers": 4}, "acc")
    tested = {
        (r["setting"]["n_layers"], r["setting"]["lr"]): r["metrics"]["test_acc_at_best"].get("vs_baseline")
        for r in rows
    }
    assert tested == {(2, lr): stats.two_sided_p(values[(2, lr)], values[(4, lr)]) for lr in (1e-4, 1e-3)} | {
        (4, 1e-4): None,
        (4, 1e-3): None,
    }
    rows = cells.cell_rows(frame, ["n_layers", "lr"], ["test_acc_at_best"], Report(), {"n_heads": 4}, "acc")
    assert all("vs_baseline" not in r["metrics"]["test_acc_at_best"] for r in rows)


def test_regression_only_where_a_test_across_seeds_says_so(tmp_path, uri):
    text = ablation_text("ndr_layers_test")
    first = fake_launch(tmp_path, uri, "night-1", scores_for(0, rng_seed=1), text)
    same = fake_launch(tmp_path, uri, "night-2", scores_for(3, rng_seed=2), text)  # same code, other seeds
    assert report.write_report(same, first)[1] == []
    worse = fake_launch(tmp_path, uri, "night-3", scores_for(6, shift=0.2, rng_seed=3), text)
    _, regressions = report.write_report(worse, same)
    assert len(regressions) == len(LAYERS) and all("test_acc_at_best" in r for r in regressions)
    markdown = (worse.dir / "report" / "report.md").read_text()
    assert "**Regressions:**" in markdown and "was " in markdown


def test_a_cell_whose_runs_stopped_completing_regresses(tmp_path, uri, capsys):
    """A night whose change makes runs diverge or fail: the test across seeds sees only the runs that
    completed (none, in a cell where all failed), so a cell where fewer than half completed, against
    most before, is a regression of its own; one seed diverging is seed noise, shown in the table."""
    from orchestrator.cli.process import main

    text = ablation_text("ndr_layers_test")
    fake_launch(tmp_path, uri, "night-1", scores_for(0, rng_seed=1), text)
    broken = {
        (4, 3): "failed",
        (4, 4): "failed",
        (4, 5): "diverged",
        (6, 3): "diverged",
        (6, 4): "failed",
        (8, 5): "diverged",
        (14, 5): "diverged",
    }
    night = fake_launch(tmp_path, uri, "night-2", scores_for(3, rng_seed=2), text, broken)
    assert main(["report", "night-2", "--compare", "night-1", "--storage-path", str(tmp_path)]) == 1
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("REGRESSION")] == [
        "REGRESSION ctl_backward__ndr n_layers=4: 0 of 3 runs completed (1 "
        "diverged, 2 failed); 3 of 3 before",
        "REGRESSION ctl_backward__ndr n_layers=6: 1 of 3 runs completed (1 "
        "diverged, 1 failed); 3 of 3 before",
    ]
    markdown = (night.dir / "report" / "report.md").read_text()
    assert "| n_layers=8 | 2 (+1 diverged) |" in markdown
    # Both completed seeds of n_layers=14 solve it (0.99); the one that diverged did not.
    assert re.search(r"\| n_layers=14 \| 2 \(\+1 diverged\) \| [^|]*\| [^|]*, solved 67%", markdown)
    # The next night, as broken, is compared with a night that has no results there: it says so.
    fake_launch(
        tmp_path,
        uri,
        "night-3",
        scores_for(6, rng_seed=3),
        text,
        {(layers, seed): "failed" for layers in (4, 6) for seed in (6, 7, 8)},
    )
    assert main(["report", "night-3", "--compare", "night-2", "--storage-path", str(tmp_path)]) == 0
    assert (
        capsys.readouterr()
        .out.splitlines()[-1]
        .endswith("code abc1234 -> abc1234); 2 cell(s) without two completed runs on each side not compared")
    )


def test_a_comparison_with_a_launch_that_shares_no_cell_is_refused_and_cells_of_one_side_are_named(
    tmp_path, uri, capsys
):
    """`report --compare` with a search, or with an ablation of other pairs, said "no regression in
    0 cells" and exited 0 (a script's silent pass), counting every cell of both as short of runs."""
    from orchestrator.cli.process import main

    text = ablation_text("ndr_layers_test")
    fake_launch(tmp_path, uri, "night-1", scores_for(0, rng_seed=1), text)
    search = fake_launch(
        tmp_path,
        uri,
        "search-1",
        {},
        yaml.safe_dump({k: v for k, v in yaml.safe_load(text).items() if k not in ("grid", "seeds")}),
    )
    other = fake_launch(
        tmp_path, uri, "other-1", {}, yaml.safe_dump({**yaml.safe_load(text), "models": ["transformer"]})
    )
    for target, reason in (
        (search, "is a search; launches compare cell by cell only as ablations"),
        (
            other,
            f"({other.spec_file}) has no model/task pair of night-1 "
            "(ablations/ndr_layers.yaml); nothing to compare",
        ),
    ):
        assert (
            main(["report", "night-1", "--compare", target.launch_id, "--storage-path", str(tmp_path)]) == 2
        )
        assert (
            capsys.readouterr().err == f"orchestrator: error: --compare: launch {target.launch_id} {reason}\n"
        )
    # A grid grown since: the new cells are in one launch only, not "without two completed runs".
    grown = fake_launch(
        tmp_path,
        uri,
        "night-2",
        {**scores_for(3, rng_seed=2), **{(16, s): 0.99 for s in (3, 4, 5)}},
        ablation_text("ndr_layers_test").replace("- 14\n", "- 14\n  - 16\n"),
    )
    assert main(["report", grown.launch_id, "--compare", "night-1", "--storage-path", str(tmp_path)]) == 0
    assert (
        capsys.readouterr()
        .out.splitlines()[-1]
        .endswith("code abc1234 -> abc1234); 1 cell(s) in one of the two launches only")
    )


def test_a_cell_whose_completed_runs_have_no_test_score_regresses(tmp_path, uri, capsys):
    """Runs that completed with a test score of NaN (an empty split's ratio): the cell passed as
    "without two completed runs", exit 0, though all three completed."""
    from orchestrator.cli.process import main

    text = ablation_text("ndr_layers_test")
    fake_launch(tmp_path, uri, "night-1", scores_for(0, rng_seed=1), text)
    fake_launch(
        tmp_path,
        uri,
        "night-2",
        {**scores_for(3, rng_seed=2), **{(4, s): float("nan") for s in (3, 4, 5)}},
        text,
    )
    assert main(["report", "night-2", "--compare", "night-1", "--storage-path", str(tmp_path)]) == 1
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("REGRESSION")] == [
        "REGRESSION ctl_backward__ndr n_layers=4: 0 of 3 runs completed (3 completed "
        "without a score); 3 of 3 before"
    ]


def test_a_cell_is_compared_only_with_one_config_and_a_change_of_config_is_named(tmp_path, uri, capsys):
    """Cells are matched by the grid keys of tonight's file. The earlier launch swept lr too (a key
    dropped since): its n_layers=4 runs pool two learning rates, a mean that stands for no config,
    so that cell is not compared. A cell whose one config changed (n_iters, and the data every run
    trained on) is compared, and its regression line says what changed and between which commits,
    as the console says which code each side ran."""
    from orchestrator.cli.process import main

    text = ablation_text("ndr_layers_test")
    pooled = lambda layers, seed: {"lr": 0.01 if seed % 2 or layers != 4 else 0.1}  # noqa: E731
    fake_launch(tmp_path, uri, "night-1", scores_for(0, rng_seed=1), text, trained=pooled)
    shorter = lambda layers, seed: {"lr": 0.01, **({"n_iters": 50} if layers == 6 else {})}  # noqa: E731
    worse = {key: value - (0.3 if key[0] == 6 else 0) for key, value in scores_for(3, rng_seed=2).items()}
    night = fake_launch(
        tmp_path, uri, "night-2", worse, text, trained=shorter, code="def5678", data_hash="77c1a3b5d2e4f6a8"
    )
    assert main(["report", "night-2", "--compare", "night-1", "--storage-path", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    flagged = [line for line in out if line.startswith("REGRESSION")]
    assert len(flagged) == 1 and flagged[0].startswith(
        "REGRESSION ctl_backward__ndr n_layers=6 test_acc_at_best: "
    )
    assert flagged[0].endswith(
        "; its config changed since: data_hash 3fa85f6457174562 -> 77c1a3b5d2e4f6a8, n_iters 30000 -> 50; "
        "the code changed since: abc1234 -> def5678"
    )
    markdown = (night.dir / "report" / "report.md").read_text()
    assert (
        "- ctl_backward__ndr n_layers=4: not compared, the earlier launch's runs of this "
        "cell differ in lr (0.01, 0.1)" in markdown
    )
    assert "(code abc1234, now def5678)" in markdown


def test_a_night_is_compared_with_the_last_finished_night_of_its_own_file(tmp_path):
    """Two ablation files may share an MLflow experiment: a night of one is never compared with a
    night of the other. A night that did not finish (failed, interrupted, running) is no baseline,
    for `report --compare previous` either."""
    from orchestrator.record.state import earlier_launches, previous_launch

    def night(launch_id, file, created, state="finished", night=0):
        folder = tmp_path / launch_id
        folder.mkdir()
        launch = LaunchState(
            launch_id,
            folder,
            "shared",
            f"/repo/ablations/{file}",
            "",
            "sqlite://",
            "run",
            state=state,
            night=night,
            created=created,
        )
        launch.save()
        return launch

    night("layers-1", "ndr_layers.yaml", 1)
    night("heads-1", "panm_mode1_heads.yaml", 2, night=0)
    night("layers-2", "ndr_layers.yaml", 3, state="failed", night=1)
    tonight = night("layers-3", "../ablations/ndr_layers.yaml", 4, night=2)
    assert [s.launch_id for s in earlier_launches(tonight, nightly=True)] == ["layers-1"]
    assert previous_launch(tonight).launch_id == "layers-1"


def test_a_command_without_a_launch_means_the_one_started_last(tmp_path):
    """Not the one whose launch.json was written last: accepting or resuming an old night rewrites it."""
    import os

    from orchestrator.record.state import find_launch

    for created, launch_id in ((1.0, "older"), (2.0, "newer")):
        (tmp_path / launch_id).mkdir()
        LaunchState(
            launch_id, tmp_path / launch_id, "shared", "/repo/a.yaml", "", "sqlite://", "run", created=created
        ).save()
    later = (tmp_path / "newer" / "launch.json").stat().st_mtime + 60
    os.utime(tmp_path / "older" / "launch.json", (later, later))
    assert find_launch(str(tmp_path), None) == (tmp_path / "newer").resolve()


def holm_adjusted(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni, written out: the k-th smallest p times (m - k), kept monotone, at most 1."""
    order = np.argsort(p_values)
    scaled = np.minimum(
        1.0, np.maximum.accumulate([(len(p_values) - rank) * p_values[i] for rank, i in enumerate(order)])
    )
    adjusted = np.empty(len(p_values))
    adjusted[order] = scaled
    return list(adjusted)


def test_report_compare_prints_the_verdict(tmp_path, uri, capsys):
    """`report --compare` on the console: one line when no cell regressed, else each cell that did
    with its means before and now, the drop and the Holm-adjusted p of Welch's one-sided test."""
    from scipy import stats as scipy_stats

    from orchestrator.cli.process import main

    text = ablation_text("ndr_layers_test")
    fake_launch(tmp_path, uri, "night-1", scores_for(0, rng_seed=1), text)
    before = scores_for(3, rng_seed=2)
    fake_launch(tmp_path, uri, "night-2", before, text)
    assert main(["report", "night-2", "--compare", "night-1", "--storage-path", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        out[-1]
        == "no regression in 6 cells compared with night-1 (one-sided welch test across seeds, alpha 0.05, "
        "Holm-corrected; code abc1234 -> abc1234)"
    )
    assert not any("REGRESSION" in line for line in out)

    now = scores_for(6, shift=0.2, rng_seed=3)
    fake_launch(tmp_path, uri, "night-3", now, text)
    assert main(["report", "night-3", "--compare", "night-2", "--storage-path", str(tmp_path)]) == 1
    flagged = [line for line in capsys.readouterr().out.splitlines() if line.startswith("REGRESSION")]
    seeds = lambda scores, layers: [v for (n, _), v in sorted(scores.items()) if n == layers]  # noqa: E731
    raw = [
        scipy_stats.ttest_ind(seeds(now, n), seeds(before, n), equal_var=False, alternative="less").pvalue
        for n in LAYERS
    ]
    expected = [
        (n, np.mean(seeds(before, n)), np.mean(seeds(now, n)), p) for n, p in zip(LAYERS, holm_adjusted(raw))
    ]
    assert len(flagged) == len(LAYERS)
    for line, (layers, mean_before, mean_now, p) in zip(flagged, expected):
        found = re.fullmatch(
            r"REGRESSION ctl_backward__ndr n_layers=(\d+) test_acc_at_best: (\S+) -> (\S+) "
            r"\(worse by (\S+), p = (\S+)\)",
            line,
        )
        assert found, line
        assert (
            int(found[1]) == layers and found[2] == f"{mean_before:.3f}" and found[3] == f"{mean_now:.3f}"
        ), line
        assert (
            found[4] == f"{mean_before - mean_now:.3f}"
            and float(found[5]) == pytest.approx(p, rel=1e-2)
            and p < 0.05
        ), line


def test_published_numbers_load_and_name_our_models_and_tasks():
    from trainables.config import TRAIN_KEYS
    from trainables.models import MODELS, model_fields
    from trainables.tasks import TASKS

    cells = papers.published_cells()
    assert len(cells) > 50
    for cell in cells:
        assert cell["paper"] in ("ndr", "panm", "compositional_attention"), cell
        assert cell["task"] in TASKS, cell
        assert cell["model"] in MODELS or cell.get("ours") is False, cell
        assert isinstance(cell["mean"], (int, float)), cell
        # A misspelt setting key would match no run: every key is a task option or a trial's key.
        known = {f.name for f in dataclasses.fields(TASKS[cell["task"]].config)} | TRAIN_KEYS
        if cell["model"] in MODELS:
            known |= model_fields(cell["model"])
        assert set(cell.get("setting") or {}) <= known, cell
        assert re.fullmatch(
            r"(depth\d+_)?(" + "|".join(TASKS[cell["task"]].kind.scores) + ")", cell["metric"]
        ), cell
        assert cell.get("checkpoint") in (None, "early", "final") and cell.get("statistic") in (
            None,
            "median",
        ), cell
        assert cell.get("n_iters") is None or (isinstance(cell["n_iters"], int) and cell["n_iters"] > 0), cell
        assert cell.get("runs") is None or (isinstance(cell["runs"], int) and cell["runs"] > 1), cell


@pytest.mark.parametrize(
    "file, model, grid_cell, reported, not_reported, table",
    [
        # PANM's own SCAN row: its one-value grid pins universal / relative_positions, which its cells name.
        (
            "ablations/scan_panm_table2.yaml",
            "transformer_enc_dec_panm",
            {},
            "test_seq_acc_final",
            "test_seq_acc_at_best",
            "Table 2",
        ),
        # The authors of compositional attention log the last model (100K steps; 200 epochs), no selection.
        (
            "ablations/compositional_table6_s2r4.yaml",
            "transformer_compositional",
            {},
            "test_l1_final",
            "test_l1_at_best",
            "Table 6",
        ),
        (
            "ablations/compositional_triangles_table3.yaml",
            "transformer_compositional",
            {"n_retrievals": 2},
            "test_acc_final",
            "test_acc_at_best",
            "Table 3",
        ),
    ],
)
def test_each_shipped_ablation_meets_its_papers_number_at_the_papers_checkpoint(
    file, model, grid_cell, reported, not_reported, table
):
    import itertools

    from orchestrator.plan.load import load_study

    pair = next(p for p in load_study(file).pairs if p.model == model)
    cells = [dict(zip(pair.grid, values)) for values in itertools.product(*pair.grid.values())]
    setting = next(c for c in cells if grid_cell.items() <= c.items())
    config = {**pair.base, **setting}
    cell = papers.published_for(pair.model, pair.task.task, pair.task.variant, reported, setting, config)
    assert cell is not None and cell["table"] == table
    assert (
        papers.published_for(pair.model, pair.task.task, pair.task.variant, not_reported, setting, config)
        is None
    )


def test_a_setting_fixed_off_the_papers_meets_the_table_that_varies_it_and_a_searched_one_the_headline():
    forward = {"task_options": {"direction": "forward"}, "n_iters": 30000}
    # NDR fixed at 8 layers (seeds only, no grid): Table 4's 8-layer cell, not Table 1's 14 layers.
    fixed_8 = papers.published_for(
        "ndr", "ctl", "ctl_forward", "test_acc_final", {}, {**forward, "n_layers": 8}
    )
    assert (fixed_8["table"], fixed_8["setting"], fixed_8["mean"]) == ("Table 4", {"n_layers": 8}, 0.23)
    # Table 4 prints no 9 layers and Table 1 is not NDR at 9 layers: nothing beside the row.
    assert (
        papers.published_for("ndr", "ctl", "ctl_forward", "test_acc_final", {}, {**forward, "n_layers": 9})
        is None
    )
    # At the paper's 14 layers, whether the file names them or not, the headline.
    for config in (forward, {**forward, "n_layers": 14}):
        assert (
            papers.published_for("ndr", "ctl", "ctl_forward", "test_acc_at_best", {}, config)["table"]
            == "Table 1"
        )
    # A search (or a tuning) that chose 8 layers reports the model under its best values: Table 1's.
    searched = papers.published_for(
        "ndr",
        "ctl",
        "ctl_forward",
        "test_acc_at_best",
        {},
        {**forward, "n_layers": 8},
        frozenset({"n_layers"}),
    )
    assert (searched["table"], searched["mean"]) == ("Table 1", 1.00)
    # ACT fixed on the relative Transformer meets Table 6's ACT row, not Table 1's plain one; the
    # paper ran ACT 14 steps deep (App. A, against the baseline's 11), so an 11-layer ACT run meets none.
    act = {**forward, "act": "graves", "n_layers": 14}
    cell = papers.published_for("transformer_rel", "ctl", "ctl_forward", "test_acc_at_best", {}, act)
    assert (cell["table"], cell["setting"]) == ("Table 6", {"act": "graves", "n_layers": 14})
    assert (
        papers.published_for(
            "transformer_rel", "ctl", "ctl_forward", "test_acc_at_best", {}, {**act, "n_layers": 11}
        )
        is None
    )


def test_the_launchs_answer_puts_the_papers_number_for_the_same_setting_beside_each_model(tmp_path):
    from orchestrator.plan.load import load_study
    from orchestrator.report.answer import answer_lines

    def answer(study, scores):
        summaries = {
            p.name: {
                "best_metrics": {f"{study.report.headline}_{study.score}_at_best": score},
                "best_config": {**p.base, **config},
            }
            for p, (score, config) in zip(study.pairs, scores)
        }
        return answer_lines(study, summaries)

    smoke = load_study("search_spaces/smoke.yaml")
    assert answer(smoke, [(0.857, {"lr": 0.003}), (0.36, {"lr": 0.01})]) == [
        "answer on copy: panm generalizes best, test_x2_token_acc_at_best 0.857 (+0.757 from chance, 0.100) "
        "vs lstm_seq2seq 0.360; each pair's best trial, at this launch's scale",
        "  at full scale the papers report: panm 0.84 (PANM Table 7), lstm_seq2seq 0.11 (PANM Table 7)",
    ]
    # A headline split the task does not have (test_x99) said nothing at all.
    # Confirmed over seeds: the means of each pair's confirmed candidate, and the test of the winner
    # against the runner-up; a single best trial (0.99 here) does not decide it.
    panm, lstm = [0.80, 0.84, 0.88], [0.30, 0.36, 0.42]
    confirmed = {
        p.name: {
            "best_metrics": {"test_x2_token_acc_at_best": best},
            "best_config": p.base,
            "confirmed": {"splits": {"test_x2_token_acc_at_best": seeds}, "config": {**p.base, "lr": 0.003}},
        }
        for p, best, seeds in zip(smoke.pairs, (0.5, 0.99), (panm, lstm))
    }
    p_value = stats.two_sided_p(panm, lstm, "welch")
    assert answer_lines(smoke, confirmed)[0] == (
        "answer on copy: panm generalizes best, test_x2_token_acc_at_best 0.840 (+0.740 from chance, 0.100) "
        "vs lstm_seq2seq 0.360; each pair's confirmed candidate, the mean over its seeds (panm 3, "
        f"lstm_seq2seq 3); panm against lstm_seq2seq: p = {p_value:.3g} (welch, "
        "two-sided, alpha 0.05), at this launch's scale"
    )
    reported = {
        p.name: {"best_metrics": {"test_x2_token_acc_at_best": 0.5}, "best_config": p.base}
        for p in smoke.pairs
    }
    smoke = dataclasses.replace(smoke, report=dataclasses.replace(smoke.report, headline="test_x99"))
    assert answer_lines(smoke, reported) == [
        "no answer on copy: no pair's best trial reported test_x99_token_acc_at_best"
    ]
    # NDR fixed at 8 layers is not Table 1's NDR (14), and Table 4 prints final scores, not the best
    # checkpoint's: no paper number. Searched over layers, its best is the NDR at its best: Table 1's.
    for layers, paper in (
        ({"fixed": {"n_layers": 8}}, []),
        ({"space": {"n_layers": {"choice": [8, 14]}}}, ["ndr 1.00 (NDR Table 1)"]),
    ):
        file = tmp_path / "ndr.yaml"
        file.write_text(
            yaml.safe_dump(
                {
                    "name": "ndr",
                    "metric": "best_ood_valid_acc",
                    "models": ["ndr"],
                    "tasks": [{"task": "ctl", "variant": "ctl_forward", "options": {"direction": "forward"}}],
                    "space": {"lr": {"loguniform": [1.0e-4, 1.0e-3]}, **layers.get("space", {})},
                    "fixed": layers.get("fixed", {}),
                    "budget": {"trials": 2},
                }
            )
        )
        lines = answer(load_study(file), [(0.5, {"lr": 3.0e-4, "n_layers": 8})])
        assert lines[1:] == [f"  at full scale the papers report: {', '.join(paper)}"] * bool(paper), lines


def confirmed_answer(study, seeds: dict) -> str:
    """The answer line of `study` where each model's confirmed candidate scored seeds[model]."""
    from orchestrator.report.answer import answer_lines

    metric = study.headline
    summaries = {
        p.name: {
            "best_metrics": {metric: max(seeds[p.model])},
            "best_config": p.base,
            "confirmed": {"splits": {metric: seeds[p.model]}, "config": p.base},
        }
        for p in study.pairs
    }
    return answer_lines(study, summaries)[0]


def ctl_search(tmp_path, models: list[str]):
    from orchestrator.plan.load import load_study

    file = tmp_path / "ctl.yaml"
    file.write_text(
        yaml.safe_dump(
            {
                "name": "ctl",
                "metric": "best_ood_valid_acc",
                "models": models,
                "tasks": [{"task": "ctl", "variant": "ctl_backward", "options": {"direction": "backward"}}],
                "space": {"lr": {"loguniform": [1.0e-4, 1.0e-3]}},
                "budget": {"trials": 2},
            }
        )
    )
    return load_study(file)


def test_an_answer_where_every_model_is_at_chance_crowns_none_and_still_lists_the_means(tmp_path):
    """Three models over three seeds each, none past CTL's chance (0.125) by a one-sided test at the
    report's alpha: the first words say so, the means follow, the top one's beside chance."""
    study = ctl_search(tmp_path, ["ndr", "lstm", "transformer"])
    seeds = {"ndr": [0.105, 0.135, 0.165], "lstm": [0.11, 0.127, 0.144], "transformer": [0.1, 0.12, 0.14]}
    assert all(stats.beyond_chance_p(v, 0.125) >= 0.05 for v in seeds.values())
    p_value = stats.two_sided_p(seeds["ndr"], seeds["lstm"])
    assert confirmed_answer(study, seeds) == (
        "answer on ctl_backward: no model generalizes beyond chance, test_acc_at_best ndr 0.135 "
        "(+0.010 from chance, 0.125) vs lstm 0.127, transformer 0.120; each pair's confirmed candidate, "
        f"the mean over its seeds (ndr 3, lstm 3, transformer 3); ndr against lstm: p = {p_value:.3g} "
        "(welch, two-sided, alpha 0.05), at this launch's scale"
    )
    # Each pair's best trial: one score a model, so only a score short of chance counts as chance.
    from orchestrator.report.answer import answer_lines

    best = {"ndr": 0.123, "lstm": 0.12, "transformer": 0.11}
    summaries = {
        p.name: {"best_metrics": {study.headline: best[p.model]}, "best_config": p.base} for p in study.pairs
    }
    assert answer_lines(study, summaries)[0] == (
        "answer on ctl_backward: no model generalizes beyond chance, test_acc_at_best ndr 0.123 "
        "(-0.002 from chance, 0.125) vs lstm 0.120, transformer 0.110; each pair's best trial, "
        "at this launch's scale"
    )


def test_an_answer_crowns_a_winner_only_where_it_beats_the_runner_up_at_the_reports_alpha(tmp_path):
    """Both past chance but not apart at alpha: "no significant difference" between the top two,
    means listed; the same seeds at a file's alpha above their p, and a real winner, are crowned."""
    study = ctl_search(tmp_path, ["ndr", "transformer"])
    close = {"ndr": [0.8, 0.9, 1.0], "transformer": [0.75, 0.85, 0.95]}
    p_value = stats.two_sided_p(close["ndr"], close["transformer"])
    assert 0.05 < p_value < 0.9
    assert confirmed_answer(study, close).startswith(
        "answer on ctl_backward: no significant difference between ndr and transformer, test_acc_at_best "
        "ndr 0.900 (+0.775 from chance, 0.125) vs transformer 0.850; each pair's confirmed candidate"
    )
    lenient = dataclasses.replace(study, report=dataclasses.replace(study.report, alpha=0.9))
    assert confirmed_answer(lenient, close).startswith(
        "answer on ctl_backward: ndr generalizes best, test_acc_at_best 0.900 (+0.775 from chance, 0.125) "
        "vs transformer 0.850; "
    )
    apart = {"ndr": [0.98, 0.99, 1.0], "transformer": [0.12, 0.13, 0.14]}  # the runner-up at chance
    assert confirmed_answer(study, apart).startswith(
        "answer on ctl_backward: ndr generalizes best, test_acc_at_best 0.990 (+0.865 from chance, 0.125) "
        "vs transformer 0.130; "
    )


def test_a_papers_median_is_met_by_our_median_and_a_run_of_other_length_says_so():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(pages.TEMPLATES))
    env.filters["f3"] = stats.fmt
    macro = env.from_string('{% import "cells.j2" as c %}{{ c.paper(entry)|trim }}')
    seeds = [0.0, 0.1, 1.0, 1.0, 1.0]  # SCAN's seeds land near 0 or 1: mean 0.62, median 1
    median_cell = {
        "summary": stats.summarize(seeds),
        "published": {"mean": 1.0, "statistic": "median", "table": "Table 2"},
    }
    assert macro.render(entry=median_cell) == "median 1.000 (our median 1.000, +0.000; Table 2)"
    mean_cell = {"summary": stats.summarize(seeds), "published": {"mean": 1.0, "table": "Table 7"}}
    assert macro.render(entry=mean_cell) == "1.000 (-0.380; Table 7)"
    # A run of fewer steps than the paper's (a CPU-scale check, a nightly's budget): the paper's number,
    # no difference; of more steps: the difference, and that it trained longer.
    unlike = papers.training_unlike_the_paper
    assert unlike({}, "panm", "copy", {"n_iters": 1000}) == {"key": "n_iters", "ours": 1000, "paper": 50000}
    assert unlike({}, "panm", "copy", {"n_iters": 50000}) is None
    short = {**mean_cell, "unlike": {"key": "n_iters", "ours": 1000, "paper": 50000}}
    assert (
        macro.render(entry=short) == "1.000 (Table 7; no difference shown: n_iters 1000, the paper's 50000)"
    )
    longer = {**mean_cell, "unlike": {"key": "n_iters", "ours": 100000, "paper": 50000}}
    assert (
        macro.render(entry=longer)
        == "1.000 (-0.380; Table 7; trained longer: n_iters 100000, the paper's 50000)"
    )
    # A column at another length than the paper's setting (NDR Table 6: ACT trained 60k, the preset
    # 30k) is measured against its own; an early column against the run's early budget.
    config = {
        "n_iters": 30000,
        "early_budget": 30000,
        "act": "graves",
        "n_layers": 14,
        "task_options": {"direction": "forward"},
    }
    at_60k = papers.published_for(
        "transformer_rel", "ctl", "ctl_forward", "test_acc_at_best", {"act": "graves"}, config
    )
    at_30k = papers.published_for(
        "transformer_rel", "ctl", "ctl_forward", "test_acc_at_best_early", {"act": "graves"}, config
    )
    assert (at_60k["mean"], at_30k["mean"]) == (0.99, 0.84)
    assert unlike(at_60k, "transformer_rel", "ctl", config) == {
        "key": "n_iters",
        "ours": 30000,
        "paper": 60000,
    }
    assert unlike(at_60k, "transformer_rel", "ctl", {**config, "n_iters": 60000}) is None
    assert unlike(at_30k, "transformer_rel", "ctl", config) is None
    assert unlike(at_30k, "transformer_rel", "ctl", {**config, "early_budget": 20000}) == {
        "key": "early_budget",
        "ours": 20000,
        "paper": 30000,
    }
    # A run shorter than its early budget: its early score is the whole run's best, so it is shorter too.
    assert unlike(at_30k, "transformer_rel", "ctl", {**config, "n_iters": 7000}) == {
        "key": "n_iters",
        "ours": 7000,
        "paper": 30000,
    }


def test_a_spec_that_leaves_a_task_option_at_its_default_meets_the_papers_cell():
    """SCAN's length cut-off defaults to the papers' 22: a spec that names no task option still
    meets PANM's SCAN table, as one that writes the default out does."""

    def met(**task_options):
        model = {"universal": False, "relative_positions": False}  # PANM's SCAN row (App. D.3)
        return papers.published_for(
            "transformer_enc_dec_panm",
            "scan",
            None,
            "test_seq_acc_final",
            {},
            {**model, "task_options": task_options},
        )

    written = met(length_cutoff=22)
    assert written is not None and written["setting"]["length_cutoff"] == 22
    assert met() == written
    assert met(length_cutoff=24)["setting"]["length_cutoff"] == 24
    assert papers.task_options("a_task_we_do_not_run") == frozenset()


def rendered(browser: str, url: str, budget_ms: int = 5000) -> str:
    """The DOM headless Chromium holds after `budget_ms` of virtual time on `url`."""
    import subprocess

    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1920,1080",  # a desktop's: MLflow's runs table draws only the columns in view
            f"--virtual-time-budget={budget_ms}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    ).stdout


def with_image_probe(page: str, path) -> str:
    """`page` written to `path` with a script that notes, on the body, how many images it has and
    whether every one decoded; -> its file URL."""
    probe = (
        "<script>document.body.dataset.images = [...document.images].length + ':' + "
        "[...document.images].every(i => i.complete && i.naturalWidth > 100);</script></body>"
    )
    path.write_text(page.replace("</body>", probe))
    return path.as_uri()


def test_the_page_renders_in_a_real_browser(tmp_path, uri, chromium):
    """Headless Chromium (Debian's package; .ci/run installs it) loads the HTML report: the cell
    table, the published column with the paper's number, and every embedded plot decoded."""
    state = fake_launch(tmp_path, uri, "night-1", scores_for(0), ablation_text("ndr_layers_test"))
    report.write_report(state)
    dom = rendered(
        chromium,
        with_image_probe((state.dir / "report" / "report.html").read_text(), tmp_path / "checked.html"),
    )
    assert 'data-images="2:true"' in dom, dom[-500:]  # the cell plot, the picture across models
    assert '<table class="cells">' in dom and "paper (test_acc, at the paper's checkpoint)" in dom
    assert re.search(
        r'<td class="published">1\.000 ± 0\.000 \([+-]\d\.\d{3}; Table 4, p = [0-9.e+-]+ '
        r'against its 5 runs\)</td>',
        dom,
    ), "no published number in the page"


SEARCH_TRIALS = [  # (lr, n_layers, status, OOD accuracy per evaluation at 10, 20), in the order they ran
    (1e-4, 1, "completed", [0.20, 0.40]),
    (5e-4, 2, "early_stopped", [0.15]),
    (3e-4, 2, "completed", [0.30, 0.90]),
    (8e-4, 1, "completed", [0.25, 0.50]),
]


def fake_search(
    tmp_path,
    uri: str,
    launch_id: str = "search-1",
    trials: list = SEARCH_TRIALS,
    numbers: list[int] | None = None,
) -> LaunchState:
    """A finished search launch in the store, its trial runs nested under their pair's run as the
    tracker writes them: `trials` (as SEARCH_TRIALS), each with its learning curves, named by
    `numbers` (1, 2, ... by default)."""
    text = yaml.safe_dump(
        {
            "name": "search_test",
            "tasks": [{"task": "ctl", "variant": "tiny", "options": {"direction": "forward"}}],
            "models": ["ndr"],
            "metric": "best_ood_valid_acc",
            "budget": {"trials": len(trials)},
            "space": {"lr": {"loguniform": [1e-4, 1e-3]}, "n_layers": {"int": [1, 2]}},
        }
    )
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("search_test")
    exp_id = (
        exp.experiment_id
        if exp
        else client.create_experiment("search_test", artifact_location=artifact_root(uri, tmp_path))
    )
    parent = client.create_run(
        exp_id, run_name=launch_id, tags={"launch_id": launch_id, "kind": "launch", "code_version": "abc1234"}
    )
    pair_run = runs.pair_run(stores.client(uri), exp_id, parent.info.run_id, launch_id, "tiny__ndr")
    for position, (number, (lr, layers, status, curve)) in enumerate(
        zip(numbers or range(1, len(trials) + 1), trials), 1
    ):
        config = {"task": "ctl", "model": "ndr", "lr": lr, "n_layers": layers, "seed": 0, "n_iters": 20}
        run = client.create_run(
            exp_id,
            run_name=f"#{number} lr={lr:.3g} n_layers={layers} tiny__ndr",
            start_time=1000 * position,
            tags={
                "mlflow.parentRunId": pair_run,
                "launch_id": launch_id,
                "kind": "trial",
                "trial_id": uuid.uuid4().hex[:8],
                "pair": "tiny__ndr",
                "model": "ndr",
                "task": "ctl",
                "variant": "tiny",
                "phase": "search",
                "trial_status": status,
                "trial_config": json.dumps(config),
            },
        )
        for key, value in config.items():  # as the tracker logs a trial's config
            client.log_param(run.info.run_id, key, str(value))
        for k, value in enumerate(curve, 1):
            for metric, v in {
                "ood_valid_acc": value,
                "iid_valid_acc": min(1.0, value + 0.3),
                "best_ood_valid_acc": max(curve[:k]),
                "test_acc_at_best": max(curve[:k]) - 0.1,
            }.items():
                client.log_metric(run.info.run_id, metric, v, step=10 * k)
        client.set_terminated(run.info.run_id)
    folder = tmp_path / launch_id
    folder.mkdir()
    state = LaunchState(
        launch_id,
        folder,
        "search_test",
        "search_spaces/search_test.yaml",
        text,
        uri,
        parent.info.run_id,
        state="finished",
    )
    state.save()
    return state


def test_a_search_report_shows_every_trial_the_winner_and_the_curves(tmp_path, uri, chromium):
    """Per pair: the winning config, a row per trial in the order they ran (hyperparameters,
    status, last iteration, metric, test), learning curves and the metric against each
    hyperparameter; the page loads in Chromium with its trial table and every figure decoded."""
    state = fake_search(tmp_path, uri)
    report.write_report(state)
    markdown = (state.dir / "report" / "report.md").read_text()
    rows = [line for line in markdown.splitlines() if re.match(r"\| (\*\*)?\d", line)]
    assert len(rows) == len(SEARCH_TRIALS)
    for number, ((lr, layers, status, curve), row) in enumerate(zip(SEARCH_TRIALS, rows), 1):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells == [
            f"**{number}**" if number == 3 else str(number),
            f"{lr:.3g}",
            str(layers),
            status,
            str(10 * len(curve)),
            f"{max(curve):.3f}",
            f"{max(curve) - 0.1:.3f}",
        ], row
    assert (
        "Winning config (trial #3" in markdown and "`lr` = 0.0003 (of loguniform [0.0001, 0.001])" in markdown
    )
    # The answer opens the report, as it closes the launch: the winner's test score (trial 3's).
    assert (
        "## The answer\n\n- answer on tiny: ndr generalizes best, test_acc_at_best "
        f"{max(SEARCH_TRIALS[2][3]) - 0.1:.3f}" in markdown
    ), markdown[:1500]
    assert "Hyperparameter importances" in markdown
    assert "compare-runs?runs=" in markdown and f"orchestrator ui {state.dir}" in markdown
    figures = {p.name for p in (state.dir / "report").glob("*.png")}
    assert {"tiny__ndr_curves.png", "tiny__ndr_slices.png"} <= figures
    dom = rendered(
        chromium,
        with_image_probe((state.dir / "report" / "report.html").read_text(), tmp_path / "checked.html"),
    )
    assert dom.count('<tr class="best">') == 1 and dom.count("<tr") >= len(SEARCH_TRIALS) + 1
    assert "<h2>The answer</h2>\n<ul><li>answer on tiny: ndr generalizes best" in dom
    assert re.search(r'data-images="[2-9]:true"', dom), dom[-500:]
    assert 'alt="tiny__ndr_curves.png"' in dom and 'alt="tiny__ndr_slices.png"' in dom


COPY_BY_LENGTH = {  # per model, its one trial's test token accuracy per length: only PANM copies past L
    "panm": {"L": 1.0, "x1": 0.95, "x2": 0.76, "x4": 0.41, "x8": 0.22},
    "lstm_seq2seq": {"L": 1.0, "x1": 0.52, "x2": 0.31, "x4": 0.14, "x8": 0.1},
}


def fake_copy_search(tmp_path, uri: str) -> LaunchState:
    """A finished search of two models on Copy, a trial each, with its test accuracy per length
    (COPY_BY_LENGTH) as the tracker logs it."""
    text = yaml.safe_dump(
        {
            "name": "copy_test",
            "tasks": [{"task": "copy", "options": {"eval_size": 16}}],
            "models": list(COPY_BY_LENGTH),
            "metric": "best_ood_valid_token_acc",
            "budget": {"trials": 1},
            "space": {"lr": {"loguniform": [1e-3, 1e-2]}},
            "report": {"headline": "test_x2"},
        }
    )
    client = MlflowClient(uri)
    exp_id = client.create_experiment("copy_test", artifact_location=artifact_root(uri, tmp_path))
    parent = client.create_run(
        exp_id, tags={"launch_id": "copy-1", "kind": "launch", "code_version": "abc1234"}
    )
    for model, by_length in COPY_BY_LENGTH.items():
        pair = f"copy__{model}"
        pair_run = runs.pair_run(stores.client(uri), exp_id, parent.info.run_id, "copy-1", pair)
        tags = {"launch_id": "copy-1", "kind": "trial", "pair": pair, "model": model, "task": "copy"}
        run = client.create_run(
            exp_id,
            run_name=f"#1 lr=0.003 {pair}",
            tags={
                **tags,
                "mlflow.parentRunId": pair_run,
                "trial_id": uuid.uuid4().hex[:8],
                "variant": "copy",
                "phase": "search",
                "trial_status": "completed",
                "trial_config": json.dumps({"task": "copy", "model": model, "lr": 0.003, "seed": 0}),
            },
        )
        metrics = {f"test_{split}_token_acc_at_best": value for split, value in by_length.items()}
        metrics |= {"best_ood_valid_token_acc": by_length["x1"], "test_token_acc_at_best": 0.5}
        for metric, value in metrics.items():
            client.log_metric(run.info.run_id, metric, value, step=100)
        client.set_terminated(run.info.run_id)
    folder = tmp_path / "copy-1"
    folder.mkdir()
    state = LaunchState(
        "copy-1", folder, "copy_test", "search_spaces/copy_test.yaml", text, uri, parent.info.run_id
    )
    state.state = "finished"
    state.save()
    return state


def test_the_curves_of_many_trials_are_the_best_and_an_even_spread_in_start_order():
    trials = [{"number": n} for n in range(1, 2001)]
    best = trials[1233]
    shown = drawn(trials, best)
    assert len(shown) == CURVES_DRAWN and best in shown
    numbers = [t["number"] for t in shown]
    assert numbers == sorted(numbers) and numbers[0] == 1 and numbers[-1] == 2000
    spread = [n for n in numbers if n != best["number"]]
    assert max(b - a for a, b in zip(spread, spread[1:])) <= 1999 / (CURVES_DRAWN - 2) + 1
    assert drawn(trials[:CURVES_DRAWN], best) == trials[:CURVES_DRAWN]


def test_a_trial_of_one_evaluation_is_a_point_on_the_curves(tmp_path, monkeypatch):
    drawn_figures = []
    monkeypatch.setattr(plots, "figure_png", lambda fig, path: drawn_figures.append(fig) or "")
    curves = {"ood_valid_acc": [(20, 0.4)], "iid_valid_acc": [(20, 0.9)]}
    trial = {"label": "#1", "status": "completed", "best": True, "curves": curves}
    plots.learning_curves("tiny__ndr", [trial], 1, "acc", "0.125", tmp_path)
    for ax in drawn_figures[0].axes:
        (line,) = [line for line in ax.get_lines() if list(line.get_xdata()) == [20]]
        assert line.get_marker() == "o"


def test_a_report_opens_with_one_picture_and_table_across_models(tmp_path, uri, chromium):
    """Beside the answer, before the pairs' sections: per task one figure of every model's best
    by test length, with the paper's numbers and chance, and a table of the same, a row per model
    (a search's best trial: one seed, no interval; the paper's after the slash). A pair's own
    plot by length would show its one trial again: there is none."""
    state = fake_copy_search(tmp_path, uri)
    paths, _ = report.write_report(state)
    assert "copy_across_models.png" in {p.name for p in paths}
    assert not list((state.dir / "report").glob("*_lengths.png"))
    markdown = (state.dir / "report" / "report.md").read_text()
    top = markdown[markdown.index("## Across models") : markdown.index("Each cell:")]
    assert markdown.index("## The answer") < markdown.index("## Across models")
    assert "![copy_across_models](copy_across_models.png)" in top
    assert "| copy | seeds | L | x1 | x2 | x4 | x8 |" in top
    rows = [line for line in top.splitlines() if line.startswith(("| panm", "| lstm_seq2seq"))]
    # PANM Table 7's copy numbers beside ours (published.yaml)
    assert rows == [
        "| panm | 1 | 1.000 / 1.000 | 0.950 / 1.000 | 0.760 / 0.840 | 0.410 / 0.520 | 0.220 / 0.360 |",
        "| lstm_seq2seq | 1 | 1.000 / 1.000 | 0.520 / 0.470 | 0.310 / 0.110 | 0.140 / 0.100 "
        "| 0.100 / 0.100 |",
    ], top
    dom = rendered(
        chromium,
        with_image_probe((state.dir / "report" / "report.html").read_text(), tmp_path / "checked.html"),
    )
    assert re.search(r'data-images="\d+:true"', dom), dom[-500:]
    across = dom[dom.index("<h2>Across models</h2>") : dom.index("<h2>copy__panm</h2>")]
    table = across[across.index('<table class="across-models">') :]
    assert 'alt="copy_across_models.png"' in across and table[: table.index("</table>")].count("<tr>") == 3


def test_of_trials_tied_at_the_best_the_first_answers_and_the_report_says_so(tmp_path, uri):
    """make run's three PANM trials all reach OOD 1.000; the store lists runs newest first, so the
    last of them answered while Optuna's study named the first. The first started answers now, and
    the report says which trials tie and how far apart their test scores are."""
    tied = [
        (1e-4, 1, "completed", [0.30, 0.90]),
        (5e-4, 2, "completed", [0.90]),
        (3e-4, 2, "completed", [0.60, 0.70]),
    ]
    state = fake_search(tmp_path, uri, trials=tied)
    report.write_report(state)
    markdown = (state.dir / "report" / "report.md").read_text()
    assert "Winning config (trial #1," in markdown
    assert (
        "2 trials tie at 0.900 (#1, #2; their `test_acc_at_best` 0.800 to 0.800): the tie-break chose #1 by "
        "the order the trials started."
    ) in markdown
    assert [line for line in markdown.splitlines() if line.startswith("| **")] == [
        "| **1** | 0.0001 | 1 | completed | 20 | 0.900 | 0.800 |"
    ]


def test_a_lost_trials_replacement_is_reported_under_its_runs_number(tmp_path, uri):
    """The report numbers a trial as its MLflow run is named (callbacks.TrialTracker.short_name):
    after a driver resume, the trial that replaced a lost one has the lost one's number; a launch
    tracked before that counted the lost run, and its later runs' names are what MLflow shows."""
    trials = [
        (1e-4, 1, "completed", [0.30, 0.90]),
        (5e-4, 2, "lost", [0.10]),
        (3e-4, 2, "completed", [0.60, 0.70]),
        (8e-4, 1, "diverged", [0.5]),
    ]
    for launch_id, numbers, shown in (
        ("now", [1, 2, 2, 3], ["**1**", "2", "3"]),
        ("before", [1, 2, 3, 4], ["**1**", "3", "4"]),
    ):
        state = fake_search(tmp_path, uri, launch_id, trials=trials, numbers=numbers)
        client = MlflowClient(uri)
        diverged = client.search_runs(
            [client.get_experiment_by_name("search_test").experiment_id],
            f"tags.launch_id = '{launch_id}' and tags.trial_status = 'diverged'",
        )[0]
        client.set_tag(diverged.info.run_id, DIVERGED_AT_TAG, "15")  # past its last evaluation, at 10
        report.write_report(state)
        markdown = (state.dir / "report" / "report.md").read_text()
        rows = [
            [cell.strip() for cell in line.split("|")[1:6]]
            for line in markdown.splitlines()
            if re.match(r"\| (\*\*)?\d", line)
        ]
        assert [row[:2] for row in rows] == [[n, lr] for n, lr in zip(shown, ("0.0001", "0.0003", "0.0008"))]
        assert rows[2][3:] == ["diverged at step 15", "15"]  # where it stopped


def test_a_results_folder_moved_with_its_store_is_read_and_reported_where_it_is_now(tmp_path):
    """A folder of launches moved with its SQLite store (off scratch, to a laptop): status, report
    and best read the store at its new place, and the report's artifacts land there; before, every
    command named the old path and asked for the database to be copied there. Resume is refused
    in one line: Tune's snapshot names the old places (a resume tried there failed every trial)."""
    import shutil
    import subprocess
    import sys

    before = tmp_path / "scratch"
    before.mkdir()
    state = fake_search(before, f"sqlite:///{before}/mlflow.db")
    state.snapshot_modules, state.state = SNAPSHOT_MODULES, "interrupted"
    state.save()
    recorded = (state.dir / "launch.json").read_text()
    shutil.move(before, tmp_path / "project")
    moved = tmp_path / "project" / state.launch_id

    def orchestrator(*args):
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *args, str(moved)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert f"({moved})" in orchestrator("status").stdout
    written = orchestrator("report")
    assert written.returncode == 0, written.stderr
    assert (moved / "report" / "report.md").is_file() and orchestrator("best").returncode == 0
    logged = list((tmp_path / "project" / "mlartifacts").glob("**/report/report.md"))
    assert len(logged) == 1 and logged[0].read_text() == (moved / "report" / "report.md").read_text()
    refused = orchestrator("resume")
    assert refused.returncode == 2 and refused.stderr == (
        f"orchestrator: error: {moved}: moved here from {before / state.launch_id} with its store "
        "or checkpoints; Tune's snapshot names their old places, so it resumes only there: move "
        "it back to resume it (status, report, best and export read it here)\n"
    )
    assert not before.exists() and (moved / "launch.json").read_text() == recorded


def test_a_regression_stays_flagged_until_it_is_fixed_or_accepted(tmp_path, uri):
    """A night that regressed is no baseline: the night after it, as bad, is compared with the last
    night that did not regress and flagged again (compared with the night before, it passed as
    unchanged). Once `orchestrator accept` says the drop was intended, later nights compare with it."""
    from orchestrator.cli.process import main

    text = ablation_text("ndr_layers_test")

    def night(launch_id, k, scores):
        state = fake_launch(tmp_path, uri, launch_id, scores, text)
        state.night, state.created = k, float(k + 1)  # 0 would read as "before `created` was recorded"
        state.save()
        return state

    first = night("night-1", 0, scores_for(0, rng_seed=1))
    second = night("night-2", 1, scores_for(3, shift=0.2, rng_seed=2))
    assert len(report.write_night(second)[1]) == len(LAYERS)
    second.regressed = True  # the verdict Launch.answer records
    second.save()
    third = night("night-3", 2, scores_for(6, shift=0.2, rng_seed=3))
    _, regressions = report.write_night(third)
    assert len(regressions) == len(LAYERS)
    assert (
        regressions.compared.startswith("6 cells compared with night-1 ")
        and "passed over night-2, which regressed" in regressions.compared
    )
    assert "The nights since it, night-2, regressed" in (third.dir / "report" / "report.md").read_text()

    assert (
        main(["accept", "night-1", "--storage-path", str(tmp_path)]) == 2
    )  # flagged nothing: a baseline already
    assert main(["accept", "night-2", "--storage-path", str(tmp_path)]) == 0
    _, regressions = report.write_night(third)
    assert (
        regressions == []
        and regressions.compared.startswith("6 cells compared with night-2 ")
        and "passed over" not in regressions.compared
    )
    first.night = None
    first.save()
    assert main(["accept", "night-1", "--storage-path", str(tmp_path)]) == 2  # no night of the nightly job


def test_orchestrator_report_of_a_night_keeps_its_comparison_and_the_first_says_there_is_none(
    tmp_path, uri, capsys
):
    """`orchestrator report` after `nightly` rewrites a night's report as the night wrote it (its
    baseline, its verdict, its history plot); the first night says plainly it has nothing to compare."""
    from orchestrator.cli.process import main

    text = ablation_text("ndr_layers_test")
    nights = []
    for k, scores in enumerate([scores_for(0, rng_seed=1), scores_for(3, shift=0.2, rng_seed=2)]):
        state = fake_launch(tmp_path, uri, f"night-{k + 1}", scores, text)
        state.night, state.created = k, float(k + 1)
        state.save()
        nights.append(state)
    assert len(report.write_night(nights[1])[1]) == len(LAYERS)  # as the nightly job wrote it
    assert main(["report", "night-2", "--storage-path", str(tmp_path)]) == 1
    assert "REGRESSION ctl_backward__ndr" in capsys.readouterr().out
    markdown = (nights[1].dir / "report" / "report.md").read_text()
    assert "Compared with `night-1`" in markdown and "**Regressions:**" in markdown
    assert "](ctl_backward__ndr_history.png)" in markdown and "No previous launch compared" not in markdown

    assert main(["report", "night-1", "--storage-path", str(tmp_path)]) == 0
    markdown = (nights[0].dir / "report" / "report.md").read_text()
    assert "The first night of this file: no earlier night to compare with yet" in markdown
    assert "Compared with" not in markdown and "No previous launch compared" not in markdown


def test_the_papers_table_is_laid_out_as_printed_with_ours_beside_each_number(tmp_path, uri):
    """A Table 1 launch (two of its models, both directions, three seeds): one table, a row per
    model in the paper's order, IID and longer per direction, each cell our mean ± std over the
    seeds (an independent aggregation) beside the number read from published.yaml; a pair trained
    shorter than the paper is marked."""
    models, variants, seeds = ["ndr", "transformer"], ["ctl_forward", "ctl_backward"], [0, 1, 2]
    text = yaml.safe_dump(
        {
            "name": "table1_test",
            "metric": "best_ood_valid_acc",
            "seeds": seeds,
            "models": models,
            "tasks": [
                {"task": "ctl", "variant": v, "options": {"direction": v.split("_")[1]}} for v in variants
            ],
        }
    )
    client = MlflowClient(uri)
    exp_id = client.create_experiment("table1_test", artifact_location=artifact_root(uri, tmp_path))
    parent = client.create_run(exp_id, tags={"launch_id": "t1", "kind": "launch", "code_version": "abc1234"})
    rng = np.random.default_rng(0)
    scores = {}
    for model in models:
        for variant in variants:
            for seed in seeds:
                scores[(model, variant, seed)] = {
                    "test_acc_at_best": float(rng.uniform(0.1, 1.0)),
                    "iid_valid_acc_final": float(rng.uniform(0.9, 1.0)),
                    "iid_valid_acc_at_best": float(rng.uniform(0.9, 1.0)),
                }
                config = {
                    "task": "ctl",
                    "model": model,
                    "seed": seed,
                    "n_iters": 30000 if model == "ndr" else 2000,
                    "task_options": {"direction": variant.split("_")[1]},
                }
                run = client.create_run(
                    exp_id,
                    tags={
                        "mlflow.parentRunId": parent.info.run_id,
                        "launch_id": "t1",
                        "kind": "trial",
                        "trial_id": uuid.uuid4().hex[:8],
                        "pair": f"{variant}__{model}",
                        "model": model,
                        "task": "ctl",
                        "variant": variant,
                        "trial_status": "completed",
                        "trial_config": json.dumps(config),
                    },
                )
                for metric, value in {"best_ood_valid_acc": 0.5, **scores[(model, variant, seed)]}.items():
                    client.log_metric(run.info.run_id, metric, value, step=100)
                client.set_terminated(run.info.run_id)
    (tmp_path / "t1").mkdir()
    state = LaunchState(
        "t1",
        tmp_path / "t1",
        "table1_test",
        "ablations/table1_test.yaml",
        text,
        uri,
        parent.info.run_id,
        state="finished",
    )
    state.save()
    report.write_report(state)
    markdown = (state.dir / "report" / "report.md").read_text()
    section = markdown[markdown.index("## The papers' tables") :].split("\n## ")[0]
    assert [line for line in section.splitlines() if line.startswith("### ")] == [
        "### NDR (Csordás et al., ICLR 2022), Table 1"
    ]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    # The IID columns are the runs' last values (the authors' paper/print_perf_table_ctl.py), the longer
    # ones the selected checkpoint's.
    assert (
        lines[0] == "| model | ctl_forward iid_valid final | ctl_forward test | ctl_backward iid_valid "
        "final | ctl_backward test |"
    )
    paper = {
        (c["model"], c["variant"], c["split"]): c
        for c in yaml.safe_load(papers.PUBLISHED.read_text())
        if c["table"] == "Table 1" and c["paper"] == "ndr"
    }
    order = list(dict.fromkeys(model for model, _, _ in paper))
    assert [line.split(" | ")[0][2:] for line in lines[2:]] == sorted(models, key=order.index)
    for line in lines[2:]:
        model = line.split(" | ")[0][2:]
        cells = [cell.strip() for cell in line.strip("|").split("|")[1:]]
        for cell, (variant, metric) in zip(
            cells, [(v, m) for v in variants for m in ("iid_valid_acc_final", "test_acc_at_best")]
        ):
            values = [scores[(model, variant, seed)][metric] for seed in seeds]
            split = metric.split("_acc")[0]
            published = paper[(model, variant, split)]
            mark = " †" if model == "transformer" else ""
            assert (
                cell == f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f} (3){mark} / "
                f"{published['mean']:.3f} ± {published['std']:.3f}"
            ), (model, variant, metric)
    assert '<table class="paper-table">' in (state.dir / "report" / "report.html").read_text()


def test_a_papers_table_shows_the_best_of_several_cells_and_the_baselines_we_do_not_run():
    """Three search candidates meeting one number: the one with the best selection metric stands
    beside it; PANM Table 1's 'other max' (ours: false) shows the paper's number alone."""
    cell = next(
        c
        for c in papers.published_cells()
        if (c["paper"], c["table"], c["model"], c["task"]) == ("panm", "Table 1", "panm", "copy")
    )

    def row(selection, test):
        return {
            "metrics": {
                "best_ood_valid_token_acc": {"summary": stats.summarize([selection]), "published": None},
                "test_token_acc_at_best": {
                    "summary": stats.summarize([test]),
                    "published": cell,
                    "unlike": None,
                },
            }
        }

    pairs = [{"name": "copy__panm", "rows": [row(0.6, 0.9), row(0.8, 0.4), row(0.7, 0.2)]}]
    [table] = papers.paper_tables(pairs, "best_ood_valid_token_acc", "max")
    by_model = {(r["model"], r["setting"]): r["cells"] for r in table["rows"]}
    ours = by_model[(cell["model"], ", ".join(f"{k}={v}" for k, v in (cell.get("setting") or {}).items()))]
    assert [c["ours"].mean for c in ours.values() if c["ours"]] == [0.4]
    assert {m for m, _ in by_model} == {cell["model"], "other_max"}
    assert all(c["ours"] is None for c in by_model[("other_max", "")].values())
    [table] = papers.paper_tables(pairs, "best_ood_valid_token_acc", "min")
    assert [c["ours"].mean for r in table["rows"] for c in r["cells"].values() if c["ours"]] == [0.9]


def test_a_papers_task_settings_are_columns_and_its_earlier_budget_is_named():
    """PANM Table 2 prints SCAN's length cut-offs as columns and the models' settings as rows; NDR
    Table 2 its 50K column beside the 200K one: our early score meets the first, the rest the second."""

    def table(paper, name, model, metrics):
        cells = [
            c
            for c in papers.published_cells()
            if (c["paper"], c["table"], c["model"]) == (paper, name, model)
        ]
        row = {"metrics": {}}
        for metric, (cell, unlike) in metrics(cells).items():
            row["metrics"][metric] = {
                "summary": stats.summarize([0.5, 0.7]),
                "published": cell,
                "unlike": unlike,
            }
        return next(
            t
            for t in papers.paper_tables([{"name": "pair", "rows": [row]}], "best", "max")
            if t["table"] == name
        ), cells

    panm, cells = table(
        "panm", "Table 2", "transformer_enc_dec_panm", lambda cells: {"test_seq_acc_final": (cells[0], None)}
    )
    row = next(r for r in panm["rows"] if any(c["ours"] for c in r["cells"].values()))
    labels = [c["label"] for c in panm["columns"]]
    assert "length_cutoff" not in row["setting"] and all("length_cutoff=" in label for label in labels), (
        row["setting"],
        labels,
    )
    cutoffs = {
        c["setting"]["length_cutoff"]
        for c in cells
        if c["setting"]
        and {k: v for k, v in c["setting"].items() if k != "length_cutoff"}
        == {k: v for k, v in cells[0]["setting"].items() if k != "length_cutoff"}
    }
    assert len(row["cells"]) == len(cutoffs) > 1  # one row, a cell per cut-off
    ndr, cells = table(
        "ndr",
        "Table 2",
        "ndr",
        lambda cells: {
            "test_acc_at_best": (
                next(c for c in cells if c["split"] == "test" and not c.get("checkpoint")),
                {"ours": 300000, "paper": 200000},
            ),
            "test_acc_at_best_early": (next(c for c in cells if c.get("checkpoint") == "early"), None),
        },
    )
    labels = [c["label"] for c in ndr["columns"]]
    assert labels == [
        "arithmetic iid_valid final",
        "arithmetic test",
        "arithmetic test best within 50,000",
    ], labels
    [row] = ndr["rows"]
    assert [c["trained"] for c in row["cells"].values()] == [None, "longer", None]


def test_runs_on_other_data_are_neither_pooled_nor_compared():
    """A pair's runs whose data hash differs from most runs of their task config (a resume after the
    generator changed) are left out of its rows, and the section says how many and which hash."""
    import pandas as pd

    pair = type("Pair", (), {"task": type("Entry", (), {"task": "ctl", "variant": "ctl"})()})()
    frame = pd.DataFrame(
        {
            "pair": ["ctl__ndr"] * 3 + ["ctl__lstm"] * 2 + ["other__ndr"],
            "task": ["ctl"] * 5 + ["listops"],
            "variant": ["ctl"] * 5 + ["other"],
            "data_hash": ["a", "a", "b", "a", "a", "c"],
        }
    )
    ndr = frame[frame["pair"] == "ctl__ndr"]
    kept, note = frames.one_data(ndr, frames.task_runs(frame, pair))
    assert list(kept["data_hash"]) == ["a", "a"]
    assert note.startswith("1 run(s) trained on other data (data_hash b) than the task's other runs (a)")
    lstm = frame[frame["pair"] == "ctl__lstm"]
    assert frames.one_data(lstm, frames.task_runs(frame, pair)) == (lstm, "")  # all on the task's data


def test_a_regression_names_both_commits_where_the_code_changed():
    moved = stats.Comparison(("ctl__ndr", "n_layers=2", "test_acc_at_best"), 0.9, 0.5, 0.01, True)
    line = compare.regression_text(moved, "data_hash 3fa8 -> 77c1", ("abc1234", "def5678"))
    assert line.endswith(
        "its config changed since: data_hash 3fa8 -> 77c1; the code changed since: abc1234 -> def5678"
    )
    assert "code changed" not in compare.regression_text(moved, None, ("abc1234", "abc1234"))
