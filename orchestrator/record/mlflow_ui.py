"""MLflow's UI on a launch's store: where it answers, the runs views and links the report and the
console give, and `orchestrator ui`, which serves it.

What a link into MLflow 3's UI can carry (its bundle, mlflow/server/js/build/static/js): in the URL
of an experiment's runs page, the search facets (searchFilter, orderByKey, orderByAsc, startTime,
lifecycleFilter, datasetsFilter, modelVersionFilter), `compareRunsMode` (TABLE, the default, or
CHART) and `workflowType`; the table's columns are no URL state. `viewStateShareKey=KEY` opens a
shared view instead: the experiment tag `mlflow.sharedViewState.KEY` holds it as JSON, the facets
and the table's state (`selectedColumns` among them); a facet in the URL makes the UI ignore it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from urllib.parse import quote

from .secrets import redact
from .stores import TrackingError, client, reveal

DEFAULT_URL = "http://127.0.0.1:5000"  # `mlflow ui`'s own address
VIEW_TAG = "mlflow.sharedViewState."
# Without it the UI shows an experiment as a GenAI app's, on its overview, whatever its runs.
MODEL_TRAINING = "workflowType=machine_learning"


def ui_address(uri: str, given: str | None = None, launch_dir=None) -> dict[str, str]:
    """Where MLflow's UI on the store `uri` answers, and the command that serves it there: the
    address `given` (`--mlflow-url`, or `orchestrator ui`'s), else a tracking server is its own UI
    and `orchestrator ui` serves a database (on port 5000 where it is free)."""
    if given:
        return {"url": given.rstrip("/"), "command": ""}
    if uri.startswith(("http://", "https://")):
        return {"url": redact(uri), "command": ""}
    return {"url": DEFAULT_URL, "command": f"orchestrator ui {launch_dir}"}


def trials_view(study, launch_id: str, pair=None) -> dict:
    """The runs table of the launch's trials (of `pair`, else of every pair, with a pair column),
    flat (their parent runs do not match), best first by the metric; columns: the metric, the
    headline test score and the values the trials differ in (searched, or an ablation's grid and
    seed)."""
    pairs = [pair] if pair is not None else study.pairs
    keys = sorted({key for p in pairs for key in [*p.space, *p.grid]})
    keys += ["seed"] if study.is_ablation else []
    return {
        "searchFilter": f"tags.launch_id = '{launch_id}'"
        + (f" and tags.pair = '{pair.name}'" if pair is not None else "")
        + " and tags.kind = 'trial'",
        "orderByKey": f"metrics.`{study.metric}`",
        "orderByAsc": study.mode == "min",
        "selectedColumns": [
            f"metrics.`{study.metric}`",
            f"metrics.`{study.headline}`",
            *(f"params.`{key}`" for key in keys),
            *([] if pair is not None else ["tags.`pair`"]),
        ],
    }


def save_view(mlflow, experiment_id: str, view: dict) -> str:
    """`view` kept in the experiment where MLflow's UI finds a shared view: -> its key, a digest
    of it (saving the same view again changes nothing)."""
    text = json.dumps(view, sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()[:32]
    mlflow.set_experiment_tag(experiment_id, VIEW_TAG + key, text)
    return key


def runs_link(ui: str, experiment_id: str, view_key: str) -> str:
    """The experiment's runs table in MLflow's UI at `ui`, as the saved view `view_key` sets it."""
    page = f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs"
    return f"{page}?viewStateShareKey={view_key}&{MODEL_TRAINING}"


def ui_links(ui: str, experiment_id: str, view_key: str, run_ids: list[str], metrics: list[str]) -> dict:
    """Links into MLflow's UI at `ui` for a group of runs: `runs`, the saved view `view_key`
    (trials_view's); `compare`, MLflow's comparison page (params and metrics side by side, parallel
    coordinates, scatter and contour plots); and `curves`, their `metrics` against steps, one line
    per run."""

    def q(value) -> str:
        return quote(json.dumps(value, separators=(",", ":")), safe="")

    runs, experiments = q(run_ids), q([experiment_id])
    base = ui.rstrip("/") + "/#/"
    return {
        "runs": runs_link(ui, experiment_id, view_key),
        "compare": f"{base}compare-runs?runs={runs}&experiments={experiments}",
        "curves": (
            f"{base}metric/?runs={runs}&metric={q(metrics[0])}&experiments={experiments}"
            f"&plot_metric_keys={q(metrics)}"
            "&plot_layout=%7B%7D&x_axis=step&y_axis_scale=linear&line_smoothness=1&show_point=true"
            "&deselected_curves=%5B%5D"
            "&last_linear_y_axis_range=%5B%5D"
        ),
    }


def launch_lines(state, ui: str) -> list[str]:
    """What `orchestrator ui` prints: the launch's trials in MLflow's UI at `ui`, then each pair's
    (trials_view's views, saved in the launch's experiment)."""
    mlflow, study = client(state.tracking_uri), state.study()
    experiment_id = mlflow.get_run(state.parent_run_id).info.experiment_id

    def link(pair=None) -> str:
        view = trials_view(study, state.launch_id, pair)
        return runs_link(ui, experiment_id, save_view(mlflow, experiment_id, view))

    return [f"launch {state.launch_id}, its trials best first: {link()}"] + [
        f"  {pair.name}: {link(pair)}" for pair in study.pairs
    ]


def free_port(asked: int | None = None) -> int:
    """The loopback port `orchestrator ui` listens on: `asked` (0: one the system picks; OSError
    where it is taken), else 5000, `mlflow ui`'s port, where the report's links point by default,
    where it is free, else one the system picks."""
    candidates = [asked] if asked is not None else [5000, 0]
    for n, port in enumerate(candidates, 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                if n == len(candidates):
                    raise
                continue
            return s.getsockname()[1]


class Server:
    """`mlflow server` with one worker on the store `uri`, on 127.0.0.1:`port`, in a process group
    of its own (its workers too), until it is stopped: `with Server(...)` stops it on leaving."""

    def __init__(self, uri: str, port: int):
        self.uri, self.address = uri, f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()  # what it says, for the line that says why it stopped
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
            + ["--workers", "1"],  # each of its default four imports MLflow: a minute on two busy cores
            # The store off its command line, which ps shows, password and all.
            env={**os.environ, "MLFLOW_BACKEND_STORE_URI": reveal(uri)},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *_) -> None:
        self.stop()

    def wait_until_it_answers(self) -> None:
        """Until its /health answers (a minute on a busy machine); TrackingError where it stopped."""
        while True:
            try:
                with urllib.request.urlopen(self.address + "/health", timeout=2):
                    return
            except OSError:
                if self.process.poll() is not None:
                    raise TrackingError(self.why_stopped()) from None
                time.sleep(0.5)

    def why_stopped(self) -> str:
        self.log.seek(0)
        said = [line.strip() for line in self.log.read().decode(errors="replace").splitlines()]
        said = [line for line in said if line]
        return f"mlflow server on {redact(self.uri)} stopped (exit status {self.process.returncode}): " + (
            said[-1] if said else "it said nothing"
        )

    def stop(self) -> None:
        """Asked to stop, with its workers, and killed where they have not within 30 s."""
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()
