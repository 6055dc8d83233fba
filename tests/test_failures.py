"""Trials that fail on their own, caused by models of one's own: one whose loss turns NaN, one that
raises, at a given step. The diverged model stays in the answer and the report with its best before
it; the raising one is restarted once, not again when it fails the same way; the launch exits 3; the
error's last line is in the report's trial table and in `export`."""

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_bad_input import run_in
from test_service import optuna_trial_states

TINY_CTL = {
    "train_size": 200,
    "eval_size": 20,
    "train_depths": [1, 3],
    "ood_valid_depths": [4, 4],
    "test_depths": [5, 5],
}
# A counter of training steps in the model's weights, so a trial restored from its checkpoint counts
# on from there; `fault` runs once it reaches AT.
MODELS = """
    from dataclasses import dataclass
    from pathlib import Path

    import torch
    from torch import nn
    from trainables.kinds import SEQUENCE_CLASSIFICATION

    @dataclass
    class Config:
        width: int = 8

    class Base(nn.Module):
        Config = Config
        kinds = (SEQUENCE_CLASSIFICATION,)
        AT = None

        def __init__(self, cfg, task):
            super().__init__()
            self.embed = nn.Embedding(len(task.vocab), cfg.width)
            self.out = nn.Linear(cfg.width, task.n_classes)
            self.register_buffer("steps", torch.zeros((), dtype=torch.long))

        def forward(self, tokens, lengths):
            logits = self.out(self.embed(tokens).mean(1))
            if self.training:
                self.steps += 1
                if self.AT is not None and int(self.steps) >= self.AT:
                    return self.fault(logits)
            return logits

    class Fine(Base):
        pass

    class Nan(Base):
        AT = 60

        def fault(self, logits):
            return logits * float("nan")

    class Raises(Base):
        AT = 50

        def fault(self, logits):
            with open(Path(__file__).with_name("raised"), "a") as f:
                f.write("raised\\n")
            raise RuntimeError(f"the model broke at step {int(self.steps)}")
"""


def launch_file(folder: Path) -> Path:
    models = folder / "models.py"
    models.write_text(textwrap.dedent(MODELS))
    spec = {
        "name": "faults",
        "metric": "best_ood_valid_acc",
        "tasks": [{"task": "ctl", "variant": "tiny", "options": TINY_CTL}],
        "models": [f"{models}:{name}" for name in ("Fine", "Nan", "Raises")],
        "budget": {"trials": 1, "max_concurrent": 1},
        "resources": {"cpu": 1},
        "fixed": {"n_iters": 80, "eval_every": 10, "batch_size": 8},
        "space": {"lr": {"loguniform": [1e-3, 1e-2]}},
        "warm_start": False,
        "tracking": {"uri": f"sqlite:///{folder}/mlflow.db"},
    }
    path = folder / "faults.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_a_diverged_and_a_raising_model_are_in_the_answer_the_report_and_export(tmp_path):
    code, out, err = run_in(tmp_path, ["launch", str(launch_file(tmp_path))])
    console = out.getvalue()
    assert code == 3, console[-3000:] + err.getvalue()[-3000:]
    # Raised at step 50, restarted from its checkpoint at 40, raised again the same way: no more.
    assert (tmp_path / "raised").read_text().count("raised") == 2, console
    assert console.count("restarting it from its last checkpoint") == 1, console
    assert "failed again as on its try before, after iteration 40: RuntimeError: the model broke" in console
    [answer] = [line for line in console.splitlines() if "answer on tiny" in line]
    assert "models.py:Fine generalizes best" in answer
    assert "models.py:Nan diverged at step 60, test_acc_at_best 0.150 before it" in answer, answer
    assert "models.py:Raises failed (RuntimeError: the model broke at step 50)" in answer, answer
    assert "[launch] every run of tiny__Nan, tiny__Raises diverged or failed" in console
    launch = next((tmp_path / "runs").glob("*/launch.json")).parent
    assert json.loads((launch / "launch.json").read_text())["state"] == "finished"
    report = (launch / "report" / "report.md").read_text()
    assert answer.removeprefix("[launch] ") in report
    trial_rows = [line for line in report.splitlines() if line.startswith("| 1 |")]
    assert any("| diverged at step 60 | 60 |" in row for row in trial_rows), trial_rows
    assert any("| failed (RuntimeError: the model broke at step 50) | 40 |" in row for row in trial_rows)
    code, _, err = run_in(tmp_path, ["export", str(launch), "--output", str(tmp_path / "runs.csv")])
    assert code == 0, err.getvalue()
    frame = pd.read_csv(tmp_path / "runs.csv").set_index("pair")
    assert frame.loc["tiny__Raises", "trial_status"] == "failed"
    assert frame.loc["tiny__Raises", "error"] == "RuntimeError: the model broke at step 50"
    assert frame.loc["tiny__Nan", "trial_status"] == "diverged"
    assert frame.loc["tiny__Nan", "diverged_at"] == 60
    assert pd.isna(frame.loc["tiny__Fine", "error"])
    states = optuna_trial_states(f"sqlite:///{tmp_path}/mlflow.optuna.db", "faults")
    assert states == {"tiny__Fine": ["COMPLETE"], "tiny__Nan": ["PRUNED"], "tiny__Raises": ["FAIL"]}
