"""Ablation reports from a real MLflow store (SQLite) holding runs written as the tracker writes them:
every number equals an independent aggregation of the runs, rows come in numeric order, the
published numbers stand beside ours, and a regression needs a test across seeds."""
import json
import re
import uuid

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator import report
from orchestrator.state import LaunchState

LAYERS = [4, 6, 8, 10, 12, 14]  # as text, 10 would sort before 4


def ablation_text(name: str, **extra) -> str:
    data = {"name": name, "tasks": [{"task": "ctl", "variant": "ctl_backward", "options": {"direction": "backward"}}], "models": ["ndr"],
            "metric": "best_ood_valid_acc", "grid": {"n_layers": LAYERS}, "seeds": [0, 1, 2], "report": {"solved_at": 0.95, **extra}}
    return yaml.safe_dump(data)


def fake_launch(tmp_path, uri: str, launch_id: str, scores, text: str) -> LaunchState:
    """A finished ablation launch in the store: scores[(n_layers, seed)] -> test accuracy."""
    client = MlflowClient(uri)
    experiment = "ndr_layers_test"
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    parent = client.create_run(exp_id, tags={"launch_id": launch_id, "kind": "launch", "code_version": "abc1234"})
    for (layers, seed), score in scores.items():
        config = {"task": "ctl", "model": "ndr", "n_layers": layers, "seed": seed, "n_iters": 100}
        run = client.create_run(exp_id, tags={"mlflow.parentRunId": parent.info.run_id, "launch_id": launch_id, "kind": "trial",
                                              "trial_id": uuid.uuid4().hex[:8], "pair": "ctl_backward__ndr", "model": "ndr", "task": "ctl",
                                              "variant": "ctl_backward", "trial_status": "completed", "trial_config": json.dumps(config)})
        for metric, value in {"best_ood_valid_acc": score - 0.01, "test_acc_at_best": score, "test_acc_final": score - 0.002,
                              "iid_valid_acc_at_best": 1.0}.items():
            client.log_metric(run.info.run_id, metric, value, step=100)
        client.set_terminated(run.info.run_id)
    folder = tmp_path / launch_id
    folder.mkdir()
    state = LaunchState(launch_id, folder, experiment, "ablations/ndr_layers.yaml", text, uri, parent.info.run_id, state="finished")
    state.save()
    return state


def scores_for(seed_offset: int, shift: float = 0.0, rng_seed: int = 0) -> dict:
    rng = np.random.default_rng(rng_seed)
    return {(layers, seed): float(min(1.0, 0.5 + 0.035 * layers + rng.normal(0, 0.01)) - shift)
            for layers in LAYERS for seed in (seed_offset, seed_offset + 1, seed_offset + 2)}


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
    assert [int(re.match(r"\| n_layers=(\d+)", r).group(1)) for r in rows] == LAYERS  # numeric, not 10, 12, 14, 4
    for layers, row in zip(LAYERS, rows):
        values = [scores[(layers, seed)] for seed in (0, 1, 2)]
        mean, std = np.mean(values), np.std(values, ddof=1)
        assert f"{mean:.3f} ± {std:.3f} [" in row
        solved = sum(v >= 0.95 for v in values) / 3
        assert f"solved {round(solved * 100)}%" in row and f"best {max(values):.3f}" in row
    # The selection metric is a column, numbers have 3 decimals, the launch's metadata heads the page.
    assert "best_ood_valid_acc" in markdown.splitlines()[next(i for i, line in enumerate(markdown.splitlines()) if line.startswith("| cell"))]
    assert "code abc1234" in markdown and "Launch `night-1`" in markdown and "No previous launch compared" in markdown
    # NDR Table 4 (CTL backward, 14 layers) from published.yaml beside ours.
    assert "Table 4" in rows[-1], rows[-1]
    page = (state.dir / "report" / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 1 and "<table class=\"cells\">" in page
    assert {p.name for p in paths} >= {"report.md", "report.html", "ctl_backward__ndr.png"}
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(state.parent_run_id, "report")}
    assert {"report/report.md", "report/report.html", "report/ctl_backward__ndr.png"} <= artifacts


def test_one_seed_shows_no_spread_and_the_baseline_is_tested(tmp_path, uri):
    scores = {(layers, 0): 0.5 + 0.03 * layers for layers in LAYERS}
    state = fake_launch(tmp_path, uri, "one-seed", scores, ablation_text("ndr_layers_test"))
    report.write_report(state)
    markdown = (state.dir / "report" / "report.md").read_text()
    assert "(one seed)" in markdown and "± 0.000 [" not in markdown  # ours; the paper's own "1.00 ± 0.00" may show
    state = fake_launch(tmp_path, uri, "with-baseline", scores_for(0), ablation_text("ndr_layers_test", baseline={"n_layers": 14}))
    report.write_report(state)
    rows = [line for line in (state.dir / "report" / "report.md").read_text().splitlines() if line.startswith("| n_layers=")]
    assert "vs baseline p = " in rows[0] and "vs baseline p" not in rows[-1]


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


def test_published_numbers_load_and_name_our_models_and_tasks():
    from trainables.models import MODELS
    from trainables.tasks import TASKS

    cells = report.published_cells()
    assert len(cells) > 50
    for cell in cells:
        assert cell["paper"] in ("ndr", "panm", "compositional_attention"), cell
        assert cell["task"] in TASKS, cell
        assert cell["model"] in MODELS or cell.get("ours") is False, cell
        assert isinstance(cell["mean"], (int, float)), cell


def test_the_page_renders_in_a_real_browser(tmp_path, uri):
    """Headless Chromium (Debian's package; .ci/run installs it) loads the HTML report: the cell
    table, the published column with the paper's number, and every embedded plot decoded."""
    import shutil
    import subprocess

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is not installed: apt-get install chromium (as .ci/run does)"
    state = fake_launch(tmp_path, uri, "night-1", scores_for(0), ablation_text("ndr_layers_test"))
    report.write_report(state)
    page = (state.dir / "report" / "report.html").read_text()
    probe = ("<script>document.body.dataset.images = [...document.images].length + ':' + "
             "[...document.images].every(i => i.complete && i.naturalWidth > 100);</script></body>")
    checked = tmp_path / "checked.html"
    checked.write_text(page.replace("</body>", probe))
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--dump-dom",
                          checked.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert 'data-images="1:true"' in dom, dom[-500:]
    assert '<table class="cells">' in dom and "paper (test_acc_at_best)" in dom
    assert re.search(r'<td class="published">1\.000 ± 0\.000 \([+-]\d\.\d{3}; Table 4\)</td>', dom), "no published number in the page"
