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
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from test_multi30k import write_sentences
from test_train import TINY_SIZES

from trainables import batched, learners
from trainables.batched import train_members
from trainables.config import parse_trial_config
from trainables.models import BATCHABLE_MODELS, MODELS, model_fields
from trainables.train import train

PINNED = Path(__file__).with_name("reference_runs.json")
# Same kernels and build: bit-identical (a CPU run on one thread is). Nudging a model's initial
# weights by NUDGE moves its loss far beyond this.
REL_TOL, ABS_TOL = 1e-5, 1e-7
NUDGE = 1e-3
NUDGED = ("ndr/ctl", "panm/copy", "lstm/ctl", "transformer/esbn")
# The kernels a CPU run's sums go through depend on the CPU: ATen's vector width, MKL's and oneDNN's
# code paths. Training amplifies their rounding (transformer/esbn's loss agrees to 1e-7 after its
# first step and differs by 1% after its second, AVX2 against no vector unit), so the runs run in a
# child process on the code paths every x86-64 CPU takes alike, and without oneDNN and NNPACK, whose
# kernels differ between CPUs even at one instruction set (docs/design/architecture.md#reference-runs).
PORTABLE = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}

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


def pinned() -> dict:
    return json.loads(PINNED.read_text())


def nudged_model(monkeypatch) -> None:
    """Every model built from here on has its initial weights times 1 + NUDGE."""
    make = learners.make_model

    def nudged(cfg, task):
        model = make(cfg, task)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + NUDGE)
        return model

    monkeypatch.setattr(learners, "make_model", nudged)
    monkeypatch.setattr(batched, "make_model", nudged, raising=False)


def emit(out: Path) -> None:
    """Run every reference run and the nudged ones in this process; write them to `out`."""
    # convolutions and LSTMs through ATen's own kernels and MKL
    torch.backends.mkldnn.enabled = False
    torch.backends.nnpack.set_flags(False)
    with tempfile.TemporaryDirectory() as folder:
        os.environ["SYSGEN_DATA_CACHE"] = str(Path(folder) / "data")
        os.environ["MULTI30K_DATA"] = str(write_sentences(Path(folder) / "multi30k"))
        found = {name: run_one(flat, seeds) for name, (flat, seeds) in sorted(runs().items())}
        with pytest.MonkeyPatch.context() as monkeypatch:
            nudged_model(monkeypatch)
            nudges = {name: run_one(*runs()[name]) for name in NUDGED}
    out.write_text(json.dumps({"runs": found, "nudged": nudges}))


def computed(folder: Path) -> dict:
    """Every run's numbers, from a child process on the PORTABLE kernels."""
    out = folder / "computed.json"
    subprocess.run(
        [sys.executable, __file__, "--emit", str(out)],
        env={**os.environ, **PORTABLE},
        cwd=Path(__file__).parent,
        check=True,
    )
    return json.loads(out.read_text())


def test_the_reference_runs_give_their_pinned_numbers_and_a_nudge_moves_them(tmp_path):
    """One child process for all (about a minute): the kernels are chosen when torch starts."""
    now = computed(tmp_path)
    moved = {name: differences(pinned()["runs"].get(name), now["runs"][name], name) for name in runs()}
    moved = {name: found for name, found in moved.items() if found}
    assert not moved, (
        f"{', '.join(moved)} moved; if meant, rewrite the file with one line of why "
        "(python tests/test_reference_runs.py --update WHY): "
        + "; ".join(found for numbers in moved.values() for found in numbers[:3])
    )
    # the tolerance is tight: every weight times 1 + NUDGE at the start is caught
    unmoved = [name for name in NUDGED if not differences(pinned()["runs"][name], now["nudged"][name], name)]
    assert not unmoved, f"a nudge of the initial weights left {', '.join(unmoved)} within the tolerance"


def test_every_reference_run_is_pinned_and_no_other():
    assert sorted(pinned()["runs"]) == sorted(runs())


def update(why: str) -> None:
    """Run every reference run on the PORTABLE kernels and write the pinned file with `why`."""
    with tempfile.TemporaryDirectory() as folder:
        found = computed(Path(folder))["runs"]
    PINNED.write_text(
        json.dumps(
            {
                "why": why,
                "torch": torch.__version__,
                "machine": platform.machine(),
                "kernels": {**PORTABLE, "oneDNN": "off"},
                "runs": found,
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--update", metavar="WHY", help="one line: why the numbers move")
    action.add_argument(
        "--emit", metavar="FILE", type=Path, help="compute here, write FILE (the tests' child)"
    )
    args = parser.parse_args()
    emit(args.emit) if args.emit else update(args.update)
