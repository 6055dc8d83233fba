"""A researcher's own model, in one file outside the package: named in a search-space file, it is
checked before anything launches, searched, stacked and reported as the package's models are."""

import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml
from test_bad_input import refused, run_in

from trainables.batched import train_seeds
from trainables.config import parse_trial_config
from trainables.models import model_spec
from trainables.train import train

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "my_model.py"
TINY_CTL = {
    "train_size": 400,
    "eval_size": 40,
    "train_depths": [1, 3],
    "ood_valid_depths": [4, 4],
    "test_depths": [5, 5],
}
TINY_COPY = {"train_size": 200, "eval_size": 20, "max_train_length": 5, "test_multipliers": [1, 2]}
SMALL = {
    "d_model": 16,
    "n_heads": 2,
    "n_layers": 1,
    "dropout": 0.0,
    "n_iters": 4,
    "eval_every": 2,
    "batch_size": 8,
}

GOOD_MODEL = """
    from dataclasses import dataclass
    from torch import nn
    from trainables.kinds import SEQUENCE_CLASSIFICATION

    @dataclass
    class Config:
        width: int = 8

    class Net(nn.Module):
        Config = Config
        kinds = (SEQUENCE_CLASSIFICATION,)

        def __init__(self, cfg, task):
            super().__init__()
            self.embed = nn.Embedding(len(task.vocab), cfg.width)
            self.out = nn.Linear(cfg.width, task.n_classes)

        def forward(self, tokens, lengths):
            return self.out(self.embed(tokens).mean(1))
"""
# Each a way of stating a model wrongly, and the words its one line says it with.
BROKEN = {
    "forward(self, tokens)": (
        "def forward(self, tokens, lengths):",
        "def forward(self, tokens):",
        "cannot take what a sequence_classification task",
    ),
    "__init__(self, cfg)": (
        "def __init__(self, cfg, task):",
        "def __init__(self, cfg):\n            task = None",
        "must be built as Net(config, task)",
    ),
    "a kind by its name": (
        "kinds = (SEQUENCE_CLASSIFICATION,)",
        'kinds = ("sequence_classification",)',
        "kinds must be a tuple of trainables.kinds",
    ),
    "no Config": ("        Config = Config\n", "", "Config must be a dataclass"),
    "a key without a default": ("width: int = 8", "width: int", "Config.width needs a default"),
    "an import it lacks": (
        "from torch import nn",
        "from torch import nn\n    import not_installed_anywhere",
        "does not load: ModuleNotFoundError",
    ),
}


def model_file(folder: Path, source: str) -> str:
    path = folder / "net.py"
    path.write_text(textwrap.dedent(source))
    return f"{path}:Net"


def search_file(folder: Path, model: str) -> Path:
    spec = {
        "name": "own",
        "metric": "best_ood_valid_acc",
        "tasks": [{"task": "ctl", "variant": "tiny", "options": TINY_CTL}],
        "models": [model, "lstm"],
        "budget": {"trials": 2, "max_concurrent": 1},
        "resources": {"cpu": 1},
        "fixed": {"n_iters": 20, "eval_every": 10, "batch_size": 16},
        "space": {"lr": {"loguniform": [1e-3, 1e-2]}},
        "warm_start": False,
        "tracking": {"uri": f"sqlite:///{folder}/mlflow.db"},
    }
    path = folder / "own.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_model_file_stated_wrongly_is_refused_in_one_line_before_anything_runs(tmp_path, case):
    old, new, reason = BROKEN[case]
    assert old in GOOD_MODEL
    model = model_file(tmp_path, GOOD_MODEL.replace(old, new))
    line = refused(tmp_path, ["launch", str(search_file(tmp_path, model))])
    assert "models[0]: " in line and reason in line, line
    assert "models[0]: " in refused(
        tmp_path, ["launch", str(search_file(tmp_path, f"{tmp_path}/missing.py:Net")), "--dry-run"]
    )


def test_a_model_file_stated_rightly_plans_beside_the_baselines(tmp_path):
    model = model_file(tmp_path, GOOD_MODEL)
    code, out, err = run_in(
        tmp_path, ["launch", str(search_file(tmp_path, model)), "--dry-run", "--no-calibrate"]
    )
    assert code == 0, err.getvalue()
    assert "pair tiny__Net:" in out.getvalue() and "pair tiny__lstm:" in out.getvalue()


def test_the_example_model_trains_alone_and_stacked_on_both_kinds_it_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("SYSGEN_DATA_CACHE", str(tmp_path / "data"))
    for task, options in (("ctl", TINY_CTL), ("copy", TINY_COPY)):
        cfg = parse_trial_config(
            {"task": task, "model": f"{EXAMPLE}:RelBiasTransformer", "task_options": options, **SMALL}
        )
        alone = train(cfg, log=None)
        assert alone["status"] == "completed"
        assert model_spec(cfg.model).stacks
        stacked = train_seeds(cfg, [cfg.seed, cfg.seed + 1], log=None)
        # without dropout a stack's member is its lone run, within rounding
        assert stacked[cfg.seed]["loss"] == pytest.approx(alone["loss"], rel=1e-4)
        assert all(m["status"] == "completed" for m in stacked.values())


@pytest.mark.slow
def test_a_search_of_ones_own_model_launches_and_is_reported_beside_a_baseline(tmp_path):
    code, out, err = run_in(tmp_path, ["launch", str(search_file(tmp_path, f"{EXAMPLE}:RelBiasTransformer"))])
    assert code == 0, err.getvalue()[-3000:]
    launch = json.loads(next((tmp_path / "runs").glob("*/launch.json")).read_text())
    assert launch["state"] == "finished"
    report = next((tmp_path / "runs").glob("*/report/report.md")).read_text()
    assert "tiny__RelBiasTransformer" in report and "tiny__lstm" in report
    # The phase's cap on Tune's pending trials is put back: a next launch in this process (the CI's
    # eight-trial launch, a notebook's) would otherwise start only this one's slots at once.
    assert "TUNE_MAX_PENDING_TRIALS_PG" not in os.environ
