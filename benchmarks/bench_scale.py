"""A search of many small trials: `orchestrator launch` against raw Ray Tune + OptunaSearch.

  python benchmarks/bench_scale.py [--trials 40 500 2000] [--concurrent 2] [--steps 20]

The same tiny Transformer on CTL (`--steps` training steps a trial, one evaluation at the end, lr,
weight decay and dropout searched by TPE, no early stopping) runs N trials twice, one after the
other, each in a driver process of its own on a new local Ray instance:

- service: `orchestrator launch` of a search-space file (SQLite MLflow store and Optuna storage),
  which also logs each trial's config, metrics and tags to MLflow, checkpoints it at its evaluation,
  keeps the Optuna study in SQL, and writes the launch record, best configs and the closing report;
- raw: `tune.Tuner` + `OptunaSearch` (Optuna's in-memory storage), actors reused, the same
  trainables.train call, its metrics reported to Tune and nothing else kept.

For each it prints the driver's wall time, the time from the first trial's start to the last one's
end (without the driver's start and closing writes), trials per minute of driver wall time, the
driver's peak memory (VmHWM) and the mean gap between trial starts in five windows of the trials,
in start order; for the service, the times of the read commands (`status`, `best`, `export`,
`report`, `board`) on the finished launch.
Start and end times: the service's MLflow runs', the raw trainable's own clock at its start and end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

TASK = {"train_size": 2000, "eval_size": 100, "train_depths": [1, 3], "ood_valid_depths": [4, 5],
        "test_depths": [6, 6]}  # fmt: skip
MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 2, "batch_size": 32, "threads": 1}
SPACE = {"lr": (1e-4, 1e-2), "weight_decay": (0.0, 0.1), "dropout": (0.0, 0.3)}
METRIC = "best_ood_valid_acc"
READS = ("status", "best", "export", "report", "board")
WINDOWS = 5


def service_spec(trials: int, concurrent: int, steps: int, tmp: Path) -> dict:
    low_high = {"lr": "loguniform", "weight_decay": "uniform", "dropout": "uniform"}
    return {
        "name": "scale",
        "metric": METRIC,
        "tasks": [{"task": "ctl", "options": TASK}],
        "models": ["transformer"],
        "budget": {"trials": trials, "max_concurrent": concurrent, "n_iters": steps, "eval_every": steps},
        "scheduler": {"name": "fifo"},
        "resources": {"cpu": 1},
        "fixed": MODEL,
        "warm_start": False,
        "space": {key: {low_high[key]: list(bounds)} for key, bounds in SPACE.items()},
        "tracking": {"uri": f"sqlite:///{tmp}/mlflow.db"},
        "storage_path": f"{tmp}/runs",
    }


def peak_memory_mb(process: subprocess.Popen) -> float:
    """The driver's peak resident memory (the kernel's high-water mark), polled until it exits."""
    peak = 0.0
    while process.poll() is None:
        try:
            for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) / 1024)
        except OSError:  # it exited between poll and read
            break
        time.sleep(0.5)
    return peak


def timed_driver(argv: list[str], cwd: Path, log: Path) -> tuple[float, float]:
    """(wall seconds, peak MB) of a driver process; its output goes to `log`."""
    start = time.time()
    with log.open("w") as out:
        process = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        peak = peak_memory_mb(process)
        if process.wait():
            sys.exit(f"{argv[:4]} failed ({process.returncode}); its output: {log}")
    return time.time() - start, peak


def service(trials: int, concurrent: int, steps: int, tmp: Path) -> dict:
    from mlflow.tracking import MlflowClient  # noqa: PLC0415 - the raw driver process goes without it

    path = tmp / "scale.yaml"
    path.write_text(yaml.safe_dump(service_spec(trials, concurrent, steps, tmp)))
    cli = [sys.executable, "-m", "orchestrator.cli"]
    wall, peak = timed_driver([*cli, "launch", str(path)], tmp, tmp / "service.log")
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    experiment = client.get_experiment_by_name("scale").experiment_id
    runs = client.search_runs([experiment], "tags.kind = 'trial'", max_results=50_000)
    starts = sorted(run.info.start_time / 1000 for run in runs)
    last_end = max(run.info.end_time / 1000 for run in runs)
    reads = {}
    for read in READS:
        begin = time.time()
        out = tmp / f"{read}.out"
        argv = [*cli, read, "--storage-path", f"{tmp}/runs"]
        with out.open("w") as sink:
            subprocess.run(argv, cwd=tmp, stdout=sink, stderr=subprocess.STDOUT, check=True)
        reads[read] = time.time() - begin
    span, trials = last_end - starts[0], len(runs)
    return {"wall": wall, "peak_mb": peak, "starts": starts, "span": span, "trials": trials, "reads": reads}


def raw(trials: int, concurrent: int, steps: int, tmp: Path) -> dict:
    starts = tmp / "raw-starts"
    argv = [sys.executable, __file__, "--raw-driver", str(tmp), "--trials", str(trials),
            "--concurrent", str(concurrent), "--steps", str(steps)]  # fmt: skip
    wall, peak = timed_driver(argv, tmp, tmp / "raw.log")
    times = sorted(float(line) for line in starts.read_text().split())
    last_end = max(float(line) for line in (tmp / "raw-ends").read_text().split())
    return {"wall": wall, "peak_mb": peak, "starts": times, "span": last_end - times[0], "trials": len(times)}


def raw_driver(tmp: Path, trials: int, concurrent: int, steps: int) -> None:
    """Raw Tune + OptunaSearch on the same trials: what the service's launch is measured against."""
    # Ray, Optuna and torch load here only, in the raw driver's own process.
    from ray import tune  # noqa: PLC0415
    from ray.tune.search.optuna import OptunaSearch  # noqa: PLC0415

    from trainables.config import parse_trial_config  # noqa: PLC0415
    from trainables.train import train  # noqa: PLC0415

    starts = tmp / "raw-starts"

    def trainable(config):
        with starts.open("a") as f:
            f.write(f"{time.time()}\n")
        flat = {"task": "ctl", "model": "transformer", "task_options": TASK, "n_iters": steps,
                "eval_every": steps, **MODEL, **config}  # fmt: skip
        train(parse_trial_config(flat), report=lambda metrics, snapshot: tune.report(metrics), log=None)
        with (tmp / "raw-ends").open("a") as f:
            f.write(f"{time.time()}\n")

    space = {
        "lr": tune.loguniform(*SPACE["lr"]),
        "weight_decay": tune.uniform(*SPACE["weight_decay"]),
        "dropout": tune.uniform(*SPACE["dropout"]),
    }
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            search_alg=OptunaSearch(metric=METRIC, mode="max"),
            num_samples=trials,
            max_concurrent_trials=concurrent,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(storage_path=str(tmp / "raw-runs"), verbose=0),
    )
    tuner.fit()


def windows(starts: list[float]) -> list[float]:
    """The mean gap between consecutive trial starts in each of WINDOWS windows of the trials."""
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    size = max(1, len(gaps) // WINDOWS)
    return [statistics.fmean(gaps[k * size : (k + 1) * size]) for k in range(min(WINDOWS, len(gaps)))]


def row(name: str, result: dict) -> str:
    gaps = windows(result["starts"])
    per_minute = result["trials"] / result["wall"] * 60
    return (
        f"{name:8} {result['trials']:6d} {result['wall']:8.1f} {result['span']:8.1f} {per_minute:8.1f}"
        f" {result['peak_mb']:8.0f}"
        f"   {' '.join(f'{g:5.2f}' for g in gaps)}   (last/first {gaps[-1] / gaps[0]:.2f})"
    )


def measure(trials: int, concurrent: int, steps: int) -> None:
    with tempfile.TemporaryDirectory() as service_tmp, tempfile.TemporaryDirectory() as raw_tmp:
        ours = service(trials, concurrent, steps, Path(service_tmp))
        theirs = raw(trials, concurrent, steps, Path(raw_tmp))
    print(f"\n{trials} trials, {concurrent} at once, {steps} steps each")
    print(f"{'driver':8} {'trials':>6} {'wall s':>8} {'trials s':>8} {'per min':>8} {'peak MB':>8}"
          "   gap between starts (s)")  # fmt: skip
    print(row("service", ours))
    print(row("raw", theirs))
    print(f"service/raw wall time: {ours['wall'] / theirs['wall']:.2f}, "
          f"first trial's start to last one's end: {ours['span'] / theirs['span']:.2f}")  # fmt: skip
    print("reads (s): " + ", ".join(f"{read} {seconds:.1f}" for read, seconds in ours["reads"].items()))
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, nargs="+", default=[40, 500, 2000])
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--raw-driver", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_driver:
        raw_driver(args.raw_driver, args.trials[0], args.concurrent, args.steps)
        return
    os.environ.setdefault("SYSGEN_DATA_CACHE", str(Path(tempfile.gettempdir()) / "bench-scale-data"))
    for trials in args.trials:
        measure(trials, args.concurrent, args.steps)


if __name__ == "__main__":
    main()
