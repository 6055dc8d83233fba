"""Cluster utilization of `orchestrator launch` on this machine.

  python benchmarks/bench_orchestration.py [--pairs 1] [--trials 4] [--concurrent 2] [--seconds 30]

Launches P model/task pairs (the same small NDR on P variants of the task) of N trials each, with
fixed work (lr searched, no early stopping), through the real CLI on a local Ray instance with a
SQLite MLflow store, at most `--concurrent` trials of a pair and `--concurrent` trials in all at
once (one CPU each), then prints
  utilization = total trial time / (launch wall time x concurrent trials)   (target >= 0.85 for 30 s trials)
and the time from `launch` to the first trial running. Trial time is Tune's time_total_s of each
trial, read back from MLflow; the wall time includes starting Ray and writing the best configs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

from trainables.config import parse_trial_config
from trainables.train import train

TASK = {
    "train_size": 4000,
    "eval_size": 200,
    "train_depths": [1, 3],
    "ood_valid_depths": [4, 5],
    "test_depths": [6, 6],
}
MODEL = {"d_model": 64, "n_layers": 4, "n_heads": 4, "batch_size": 64, "threads": 1}


def calibrate_steps_per_s() -> float:
    reports = []
    cfg = parse_trial_config(
        {"task": "ctl", "model": "ndr", "task_options": TASK, "n_iters": 150, "eval_every": 50, **MODEL}
    )
    train(cfg, report=lambda m, s: reports.append(m), log=None)
    return reports[-1]["steps_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=1, help="model/task pairs in the launch")
    parser.add_argument("--trials", type=int, default=4, help="trials per pair")
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30.0, help="target training time per trial")
    args = parser.parse_args()

    speed = calibrate_steps_per_s()
    n_iters = max(100, int(speed * args.seconds / 50) * 50)
    print(
        f"calibration: {speed:.1f} steps/s alone -> {n_iters} iterations per trial (~{args.seconds:.0f} s)",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        spec = {
            "name": "orchestration-benchmark",
            "tasks": [{"task": "ctl", "variant": f"bench{k}", "options": TASK} for k in range(args.pairs)],
            "models": ["ndr"],
            "budget": {
                "trials": args.trials,
                "max_concurrent": args.concurrent,
                "cluster_concurrent": args.concurrent,
                "n_iters": n_iters,
                "eval_every": max(50, n_iters // 5),
            },
            "scheduler": {"name": "fifo"},
            "resources": {"cpu": 1},
            "fixed": MODEL,
            "warm_start": False,
            "space": {"lr": {"loguniform": [5e-4, 2e-3]}},
            "tracking": {"uri": uri},
            "storage_path": f"{tmp}/runs",
        }
        path = Path(tmp) / "bench.yaml"
        path.write_text(yaml.safe_dump(spec))
        start = time.time()
        subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "launch", str(path)],
            check=True,
            cwd=tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wall = time.time() - start

        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("orchestration-benchmark")
        runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("kind") == "trial"]
        trial_time = sum(r.data.metrics["time_total_s"] for r in runs)
        first_start = min(r.info.start_time for r in runs) / 1000
        spans = sorted(
            (r.info.start_time / 1000 - start, r.info.end_time / 1000 - start, r.data.metrics["time_total_s"])
            for r in runs
        )
    print(
        f"pairs {args.pairs}, trials {len(runs)}, concurrent {args.concurrent}, total trial time "
        f"{trial_time:.1f} s, launch wall time {wall:.1f} s"
    )
    print(f"cluster utilization: {trial_time / (wall * args.concurrent):.3f}")
    print(f"launch -> first trial running: {first_start - start:.1f} s")
    print("trial spans (MLflow run start / end, s after launch; Tune time_total_s):")
    for begin, end, total in spans:
        print(f"  {begin:6.1f} -> {end:6.1f}   {total:5.1f} s")
    print(f"last trial end -> launch exit: {wall - max(e for _, e, _ in spans):.1f} s")


if __name__ == "__main__":
    main()
