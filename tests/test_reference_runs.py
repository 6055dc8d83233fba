"""Reference runs: a fixed set of short deterministic CPU runs whose numbers are pinned in
tests/reference_runs.json (docs/design/architecture.md#reference-runs).

Every model alone on a task of its first kind, every task kind, and stacks of the models that stack.
A refactor must leave every number as it was; a change meant to move them rewrites the file in the
same commit, with one line of why:

    python tests/test_reference_runs.py --update "why the numbers move"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
from pathlib import Path

import pytest
import torch
from test_multi30k import write_sentences
from test_train import TINY_SIZES

from trainables import batched
from trainables import train as train_module
from trainables.batched import train_members
from trainables.config import model_fields, parse_trial_config
from trainables.models import BATCHABLE_MODELS, MODELS
from trainables.train import train

PINNED = Path(__file__).with_name("reference_runs.json")
# Same machine and build: bit-identical (a CPU run is). Another CPU's vector units may round a few
# last bits differently; nudging a model's initial weights by NUDGE moves its loss far beyond this.
REL_TOL, ABS_TOL = 1e-5, 1e-7
NUDGE = 1e-3

TASKS = {  # one small task of each kind
    "ctl": {
        "train_size": 200,
        "eval_size": 20,
        "train_depths": [1, 3],
        "ood_valid_depths": [4, 4],
        "test_depths": [5, 5],
    },
    "copy": {"train_size": 200, "eval_size": 20, "max_train_length": 5, "test_multipliers": [1, 2]},
    "contextual_retrieval": {"train_size": 200, "eval_size": 20},
    "sort_of_clevr": {"train_images": 20, "eval_images": 4},
    "scan": {"length_cutoff": 40, "eval_size": 40},
    "dyck": {"train_size": 100, "eval_size": 20, "test_multipliers": [2]},
    "triangles": {"train_size": 64, "eval_size": 16},
    "esbn": {"problem": "same_different", "holdout": 95, "train_size": 64, "test_size": 16, "eval_size": 16},
    "multi30k": {"eval_size": 8},
}
FIRST_TASK = {  # a model's first kind's task
    "sequence_classification": "ctl",
    "sequence_to_sequence": "copy",
    "set_regression": "contextual_retrieval",
    "visual_question_answering": "sort_of_clevr",
    "autoregressive_seq2seq": "scan",
    "next_symbol_sets": "dyck",
}


def flat_config(model: str, task: str) -> dict:
    """A run of 24 steps, evaluated twice, float32 and uncompiled on one thread."""
    flat = {
        "task": task,
        "model": model,
        "task_options": TASKS[task],
        "n_iters": 24,
        "eval_every": 12,
        "batch_size": 16,
        "lr": 1e-3,
        "threads": 1,
        "device": "cpu",
        "compile": False,
        "bf16": False,
    }
    return {**flat, **{k: v for k, v in TINY_SIZES.items() if k in model_fields(model)}}


def runs() -> dict[str, tuple[dict, list[int] | None]]:
    """name -> (flat config, the seeds of its stack's members or None for a lone run)."""
    out = {
        f"{m}/{FIRST_TASK[str(MODELS[m].kinds[0])]}": (m, FIRST_TASK[str(MODELS[m].kinds[0])]) for m in MODELS
    }
    out.update(
        {
            "transformer/contextual_retrieval": ("transformer", "contextual_retrieval"),
            "transformer/sort_of_clevr": ("transformer", "sort_of_clevr"),
            "transformer/triangles": ("transformer", "triangles"),
            "transformer/esbn": ("transformer", "esbn"),
            "transformer_enc_dec/multi30k": ("transformer_enc_dec", "multi30k"),
        }
    )
    lone = {name: (flat_config(*pair), None) for name, pair in out.items()}
    stacked = {
        f"{m}/ctl stacked": (flat_config(m, "ctl"), [0, 1])
        for m in ("transformer", "ndr", "transformer_compositional")
        if m in BATCHABLE_MODELS
    }
    stacked["transformer_compositional/contextual_retrieval stacked"] = (
        flat_config("transformer_compositional", "contextual_retrieval"),
        [0, 1],
    )
    return {**lone, **stacked}


def numbers(metrics: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in sorted(metrics.items())
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("steps_per_s",)
    }


def run_one(flat: dict, seeds: list[int] | None) -> dict:
    """The run's losses at each evaluation and its final numbers (a stack's: each member's)."""
    cfg = parse_trial_config(flat)
    if seeds is None:
        evaluations = []
        final = train(cfg, report=lambda m, state: evaluations.append(m["loss"]), log=None)
        return {"losses": evaluations, "final": numbers(final)}
    finals = train_members(cfg, [{"seed": s} for s in seeds], log=None)
    return {"members": [numbers(m) for m in finals]}


def differences(pinned, now, where: str = "") -> list[str]:
    """Every number of `now` beyond the tolerance from `pinned`'s, or missing on one side."""
    if isinstance(pinned, dict) and isinstance(now, dict):
        out = [f"{where}.{k}: only pinned" for k in pinned if k not in now]
        out += [f"{where}.{k}: not pinned" for k in now if k not in pinned]
        return out + [d for k in pinned if k in now for d in differences(pinned[k], now[k], f"{where}.{k}")]
    if isinstance(pinned, list) and isinstance(now, list) and len(pinned) == len(now):
        return [d for i, (a, b) in enumerate(zip(pinned, now)) for d in differences(a, b, f"{where}[{i}]")]
    if isinstance(pinned, float) and isinstance(now, float):
        same = (math.isnan(pinned) and math.isnan(now)) or math.isclose(
            pinned, now, rel_tol=REL_TOL, abs_tol=ABS_TOL
        )
        return [] if same else [f"{where}: {pinned!r} pinned, {now!r} now"]
    return [] if pinned == now else [f"{where}: {pinned!r} pinned, {now!r} now"]


@pytest.fixture(autouse=True)
def data(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("SYSGEN_DATA_CACHE", str(folder / "data"))
    monkeypatch.setenv("MULTI30K_DATA", str(write_sentences(folder / "multi30k")))


def pinned() -> dict:
    return json.loads(PINNED.read_text())


@pytest.mark.parametrize("name", sorted(runs()))
def test_a_reference_run_gives_its_pinned_numbers(name):
    flat, seeds = runs()[name]
    found = differences(pinned()["runs"].get(name), run_one(flat, seeds), name)
    assert not found, (
        f"{name} moved ({len(found)} number(s)); if meant, rewrite the file with one line of why "
        f"(python tests/test_reference_runs.py --update WHY): " + "; ".join(found[:5])
    )


def test_every_reference_run_is_pinned_and_no_other():
    assert sorted(pinned()["runs"]) == sorted(runs())


@pytest.mark.parametrize("name", ["ndr/ctl", "panm/copy", "lstm/ctl", "transformer/esbn"])
def test_a_nudge_of_the_initial_weights_moves_the_numbers_beyond_the_tolerance(name, monkeypatch):
    """The tolerance is tight: every weight of the model times 1 + NUDGE at the start is caught."""
    make = train_module.make_model

    def nudged(cfg, task):
        model = make(cfg, task)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + NUDGE)
        return model

    monkeypatch.setattr(train_module, "make_model", nudged)
    monkeypatch.setattr(batched, "make_model", nudged, raising=False)
    flat, seeds = runs()[name]
    assert differences(pinned()["runs"][name], run_one(flat, seeds), name)


def update(why: str) -> None:
    """Run every reference run here and write the pinned file with `why`."""
    with tempfile.TemporaryDirectory() as folder:
        os.environ["SYSGEN_DATA_CACHE"] = str(Path(folder) / "data")
        os.environ["MULTI30K_DATA"] = str(write_sentences(Path(folder) / "multi30k"))
        found = {}
        for name, (flat, seeds) in sorted(runs().items()):
            print(name, flush=True)
            found[name] = run_one(flat, seeds)
    PINNED.write_text(
        json.dumps(
            {"why": why, "torch": torch.__version__, "machine": platform.machine(), "runs": found},
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", metavar="WHY", required=True, help="one line: why the numbers move")
    update(parser.parse_args().update)
