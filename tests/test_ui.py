"""`orchestrator ui` and the links into MLflow's UI: a real `mlflow server` it starts on a launch's
store, MLflow's React UI in a real Chromium opened by the report's links, which take the address
given (`--mlflow-url`) instead of MLflow's default port."""

import contextlib
import io
import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from mlflow.tracking import MlflowClient
from test_report import SEARCH_TRIALS, fake_search, rendered

from orchestrator.cli.process import main
from orchestrator.record.mlflow_ui import VIEW_TAG


@pytest.fixture()
def uri(tmp_path):
    return f"sqlite:///{tmp_path}/mlflow.db"


def refusal(argv: list[str]) -> str:
    """The CLI refusing `argv`: exit status 2 and one line (argparse's or the command's). -> the line."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's refusal
            code = e.code
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1, (argv, code, lines)
    return lines[0]


def test_bad_addresses_ports_and_launches_are_refused_in_one_line(tmp_path, uri):
    fake_search(tmp_path, uri)
    where = ["--storage-path", str(tmp_path)]
    for address in ("ftp://127.0.0.1:5000", "127.0.0.1:5000", "http://", "http://h:99999", "http://h/#/x"):
        assert "is not the http(s) address of MLflow's UI" in refusal(
            ["report", "search-1", *where, "--mlflow-url", address]
        )
    assert "70000 is not a port" in refusal(["ui", "search-1", *where, "--port", "70000"])
    assert "no-such-launch" in refusal(["ui", "no-such-launch", *where])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert refusal(["ui", "search-1", *where, "--port", str(port)]).startswith(
            f"orchestrator: error: --port: cannot listen on 127.0.0.1:{port} ("
        )


def test_the_reports_links_take_the_address_given_and_open_a_saved_view_of_the_trials(tmp_path, uri):
    """The runs link names a view saved in the experiment (MLflow's shared view state: its URL
    cannot carry columns): the pair's trials, best first, the metric, the test score and the
    searched values as columns; nothing points at MLflow's default port."""
    fake_search(tmp_path, uri)
    address = "http://127.0.0.1:5999"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["report", "search-1", "--storage-path", str(tmp_path), "--mlflow-url", address]) == 0
    markdown = (tmp_path / "search-1" / "report" / "report.md").read_text()
    assert "127.0.0.1:5000" not in markdown and "orchestrator ui" not in markdown
    runs = re.search(r"\[these trials, best first\]\((\S+)\)", markdown).group(1)
    experiment = MlflowClient(uri).get_experiment_by_name("search_test")
    key = re.fullmatch(
        rf"{address}/#/experiments/{experiment.experiment_id}/runs\?viewStateShareKey=(\w+)"
        "&workflowType=machine_learning",
        runs,
    ).group(1)
    assert json.loads(experiment.tags[VIEW_TAG + key]) == {
        "searchFilter": "tags.launch_id = 'search-1' and tags.pair = 'tiny__ndr' and tags.kind = 'trial'",
        "orderByKey": "metrics.`best_ood_valid_acc`",
        "orderByAsc": False,
        "selectedColumns": [
            "metrics.`best_ood_valid_acc`",
            "metrics.`test_acc_at_best`",
            "params.`lr`",
            "params.`n_layers`",
        ],
    }
    for text in ("compare them", "their learning curves"):
        assert re.search(rf"\[{text}\]\({re.escape(address)}/#/", markdown), text


@pytest.mark.slow
def test_orchestrator_ui_serves_the_trials_best_first_with_their_columns_in_a_real_browser(
    tmp_path, uri, chromium
):
    """`orchestrator ui` starts a real `mlflow server` on the launch's store and prints where; the
    report built with that address links there, and MLflow's React UI in Chromium opens the pair's
    trials best first with the metric and the searched values as columns, and MLflow's comparison
    of them; SIGTERM stops it, its server too."""
    state = fake_search(tmp_path, uri)
    ui = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "ui", "search-1", "--storage-path", str(tmp_path)]
        + ["--port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [ui.stdout.readline()]
        while lines[-1] and lines[-1] != "Ctrl-C stops it\n":
            lines.append(ui.stdout.readline())
        assert lines[-1], (lines, ui.stderr.read())
        address = re.search(r"starting at (http://127\.0\.0\.1:\d+)$", lines[0]).group(1)
        assert lines[1].startswith(f"launch search-1, its trials best first: {address}/#/experiments/")
        assert lines[2].startswith(f"  tiny__ndr: {address}/#/experiments/")
        with urllib.request.urlopen(lines[2].split()[-1], timeout=30) as page:
            assert page.status == 200
        with contextlib.redirect_stdout(io.StringIO()):
            main(["report", "search-1", "--storage-path", str(tmp_path), "--mlflow-url", address])
        markdown = (state.dir / "report" / "report.md").read_text()
        link = lambda text: re.search(rf"\[{text}\]\((\S+)\)", markdown).group(1)  # noqa: E731
        assert link("these trials, best first") == lines[2].split()[-1]
        dom = rendered(chromium, link("these trials, best first"), budget_ms=30000)
        names = [
            f"#{number} lr={lr:.3g} n_layers={layers} tiny__ndr"
            for number, (lr, layers, _, _) in enumerate(SEARCH_TRIALS, 1)
        ]
        best_first = sorted(names, key=lambda name: -max(SEARCH_TRIALS[names.index(name)][3]))
        assert [dom.index(name) for name in best_first] == sorted(dom.index(name) for name in names), dom[
            -1000:
        ]
        for column in ("best_ood_valid_acc", "test_acc_at_best", "lr", "n_layers"):
            assert f'data-testid="sort-header-{column}"' in dom, column
        dom = rendered(chromium, link("compare them"), budget_ms=30000)
        assert f"Comparing {len(SEARCH_TRIALS)} Runs" in dom, dom[-1000:]
        for name in names:
            assert name in dom
        experiment = MlflowClient(uri).get_experiment_by_name("search_test").experiment_id
        assert "search-1" in rendered(chromium, f"{address}/#/experiments/{experiment}/runs", budget_ms=30000)
    finally:
        ui.send_signal(signal.SIGTERM)
        code = ui.wait(timeout=60)
    assert code == 0 and ui.stdout.read() == "MLflow's UI stopped\n", ui.stderr.read()
    with pytest.raises(OSError):
        urllib.request.urlopen(address + "/health", timeout=5)
