"""trainables.config.check: a trial's config judged once, by the fields of its config dataclasses,
without building anything."""

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest

from trainables import config
from trainables.config import ConfigError, check, keys_of, model_problem, parse_trial_config, task_problem
from trainables.fields import hints, problem_text, type_range
from trainables.models import MODELS, model_fields
from trainables.models.configs import EncDecConfig, PANMConfig, TransformerConfig

ROOT = Path(__file__).resolve().parents[1]


def package_configs() -> set[type]:
    return {spec.config for spec in MODELS.values()} | {config.TrainConfig}


@pytest.mark.parametrize("cls", sorted(package_configs(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_number_of_a_package_config_states_its_range(cls):
    """No package field falls back on its type's range: each says its own (trainables.fields)."""
    types = hints(cls)
    for f in dataclasses.fields(cls):
        if type_range(types[f.name]) is not None or types[f.name] in (float | None,):
            assert {"range", "choices"} & set(f.metadata), f"{cls.__name__}.{f.name}"
    cls(**({"task": "ctl", "model": "ndr"} if cls is config.TrainConfig else {}))  # the defaults pass


def test_check_finds_every_problem_and_parse_raises_the_first():
    flat = {"task": "ctl", "model": "ndr", "dropout": 2, "lr": -1, "bogus": 1, "seed": "x"}
    found = check(flat)
    assert found == [
        ("bogus", "not an option of model 'ndr' or of training"),
        ("seed", "expected an integer, got 'x'"),
        ("lr", "must be at least 0, got -1.0"),
        ("dropout", "must be at least 0 and less than 1, got 2.0"),
    ]
    with pytest.raises(ConfigError) as refused:
        parse_trial_config(flat)
    assert (
        str(refused.value) == problem_text(*found[0]) == "bogus: not an option of model 'ndr' or of training"
    )
    assert check({"task": "ctl", "model": "ndr", "dropout": 0.5, "lr": "1e-3"}) == []


def test_heads_that_do_not_divide_the_width_are_one_rule_of_the_config():
    flat = {"task": "ctl", "model": "transformer", "d_model": 128, "n_heads": 3}
    text = "d_model=128 is not divisible by n_heads=3"
    assert check(flat) == [("", text)]
    with pytest.raises(ConfigError, match=f"^{text}$"):
        parse_trial_config(flat)
    for cls in (TransformerConfig, EncDecConfig):
        with pytest.raises(ValueError, match=f"^{text}$"):
            cls(d_model=128, n_heads=3)
    # a field's own problem comes first, and the rule between keys is not asked of it
    assert check({**flat, "n_heads": 0}) == [("n_heads", "must be at least 1, got 0")]


def test_a_config_checks_itself():
    with pytest.raises(ValueError, match=r"^mode1_heads: must be at least 0 and at most 3, got 4$"):
        PANMConfig(mode1_heads=4)
    with pytest.raises(ValueError, match=r"^dropout: must be at least 0 and less than 1, got 1.0$"):
        TransformerConfig(dropout=1.0)
    with pytest.raises(ValueError, match=r"^device: must be auto, cpu, cuda, cuda:N or mps, got 'tpu'$"):
        config.TrainConfig(task="ctl", model="ndr", device="tpu")
    with pytest.raises(ValueError, match=r"^gate_bias_init: must be a finite number, got nan$"):
        TransformerConfig(gate_bias_init=math.nan)


def test_check_builds_nothing(monkeypatch):
    def no_build(*_):
        raise AssertionError("check built a model")

    monkeypatch.setattr(config, "build_model", no_build)
    assert check({"task": "ctl", "model": "ndr", "n_layers": 3}) == []
    assert check({"task": "ctl", "model": "ndr", "n_layers": 0}) == [
        ("n_layers", "must be at least 1 and at most 1000, got 0")
    ]


def test_names_keys_and_whole_configs():
    assert keys_of("lstm") == config.TRAIN_KEYS | model_fields("lstm")
    assert "n_heads" in keys_of("ndr") and "n_heads" not in keys_of("lstm")
    assert task_problem("ctl") is None and model_problem("ndr") is None
    assert task_problem("ctll").startswith("unknown task 'ctll' (did you mean 'ctl'?); known: ")
    assert model_problem("ndrr").startswith("unknown model 'ndrr' (did you mean 'ndr'?); known: ")
    assert model_problem(["ndr"]).startswith("unknown model ['ndr']")
    assert check({"task": "ctll", "model": "ndrr"}) == [
        ("task", task_problem("ctll")),
        ("model", model_problem("ndrr")),
    ]
    assert check([1]) == [("", "a trial config is a mapping of keys to values, got [1]")]
    assert check({"model": "ndr"}) == [("task", "missing")]
    assert check({"task": "ctl", "model": "ndr", "task_options": {"nope": 1}})[0][0] == "task_options"


def test_the_fields_import_no_torch():
    """The plan may read what a field takes without torch."""
    code = "import sys, trainables.fields; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
