"""The benchmarks a CPU can run still run: each as its docstring says, with the smallest arguments
that reach its numbers (the figures themselves are docs/performance.md's, never checked here).
flops_per_step.py had stopped at its first step (its config left bf16 'auto' for autocast) with
no test to say so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'benchmarks'}"}
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "script, args, printed",
    [
        ("flops_per_step.py", ["--presets", "ctl/lstm", "--batches", "1"], "ctl/lstm"),
        ("bench_dropout.py", ["--models", "ctl/ndr", "--steps", "2", "--repeats", "1"], "ctl / ndr"),
        ("bench_evaluation.py", ["--repeats", "1", "--eval-size", "20"], "shared / copy"),
        (
            "bench_evaluation.py",
            ["--price", "copy/panm", "--set", "task_options.eval_size=8", "--set", "batch_size=8"]
            + ["--set", "d_model=16", "--set", "hidden=16", "--set", "mlp_hidden=16", "--set", "threads=1"],
            "one evaluation: ",
        ),
        (
            "bench_gpu.py",
            [
                "--device",
                "cpu",
                "--sizes",
                "small",
                "--sections",
                "models",
                "--models",
                "ctl / ndr",
                "--steps",
                "2",
                "--repeats",
                "1",
            ],
            "ctl / ndr",
        ),
        ("ops_per_step.py", ["--members", "1", "--set", "batch_size=8", "--rows", "3"], "add"),
        ("bench_search_store.py", ["--stored", "5", "--asks", "1"], "service/cached"),
        (
            "profile_step.py",
            ["--device", "cpu", "--members", "1", "--steps", "1", "--rows", "3", "--set", "batch_size=8"],
            "aten::",
        ),
        ("nightly_family.py", ["--nights", "20"], "unchanged nights"),
        ("check_intervals.py", ["--draws", "20"], "Student-t"),
        pytest.param(
            "bench_scale.py",
            ["--trials", "3", "--steps", "2"],
            "service/raw wall time",
            marks=pytest.mark.long,  # two launches on Ray and the five reads: a minute and more
        ),
        pytest.param(
            "bench_recompiles.py",
            [
                "--set",
                "d_model=16",
                "--set",
                "n_layers=1",
                "--set",
                "batch_size=8",
                "--steps",
                "1",
                "--trials",
                "dropout=0.1",
            ],
            "dropout=0.1",
            marks=pytest.mark.long,  # torch.compile: a minute on two cores
        ),
    ],
)
def test_benchmark_runs_on_the_cpu(script, args, printed):
    done = bench(script, *args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert printed in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("script", ["bench_dropout.py", "bench_gpu.py"])
def test_a_model_no_row_has_is_refused_before_the_header(script):
    """A misspelt --models used to print the table's header and no row, as if nothing was there to time."""
    done = (
        bench(script, "--device", "cpu", "--models", "ctl/nd", "--steps", "1")
        if script == "bench_gpu.py"
        else bench(script, "--models", "ctl/nd")
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert (
        done.stderr.startswith("--models: no row named 'ctl / nd'; the rows: ") and "ctl / ndr" in done.stderr
    )
