"""Two measurements of evaluation, alternated in one process:

What scoring a shared validation split once saves: one evaluation (trainables.evaluation.Selection,
the first, so a new best that scores the test set too) of a small SCAN model, whose IID hold-out
fills both validation slots, against the same task with the OOD slot a copy (as every evaluation
scored it before); median seconds of --repeats.

  python benchmarks/bench_evaluation.py [--repeats 5] [--eval-size 500]

What an evaluation costs against its price (--price): a preset's (or a trial config file's)
training step, timed, then each of its evaluation sets scored once, beside the seconds the cost
model gives it at that step time (orchestrator/run/cost_model.py) and the share of a trained
position an evaluated one measured (what cost_model.FORWARD_SHARE stands for).

  python benchmarks/bench_evaluation.py --price copy/panm [--set threads=1 --set batch_size=64]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time
from pathlib import Path

import torch
import yaml

from orchestrator.run import cost_model
from trainables.config import parse_trial_config, preset, set_override
from trainables.evaluation import Selection, evaluate
from trainables.learners import Single
from trainables.steps import make_model
from trainables.tasks import eval_sizes, load_task


def shared_split(repeats: int, eval_size: int) -> None:
    torch.set_num_threads(1)
    cfg = parse_trial_config(
        {
            "task": "scan",
            "model": "transformer_enc_dec",
            "task_options": {"eval_size": eval_size},
            "d_model": 64,
            "n_heads": 4,
            "encoder_layers": 2,
            "decoder_layers": 2,
        }
    ).settled("cpu")
    shared = load_task("scan", cfg.task_options)
    copied = dataclasses.replace(
        shared, splits={**shared.splits, "ood_valid": copy.deepcopy(shared.splits["iid_valid"])}
    )
    model = make_model(cfg, shared).eval()
    seconds: dict[str, list[float]] = {"shared split": [], "a copy": []}
    for _ in range(repeats):
        for name, task in (("shared split", shared), ("a copy", copied)):
            selection = Selection(cfg, task, torch.device("cpu"), None, "scan")
            start = time.perf_counter()
            selection(model, 1, 1.0, {}, 1.0)
            seconds[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    for name, value in medians.items():
        print(f"{name:14s} {value:6.2f} s per evaluation")
    print(f"shared / copy  {medians['shared split'] / medians['a copy']:6.2f}")


def step_seconds(single: Single, steps: int = 8) -> float:
    """The median of `steps` training steps, after two to warm up."""
    single.step(), single.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        single.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def trial_config(source: str) -> dict:
    """A trial config file's flat config (a best file's `config`), else the preset task/model."""
    path = Path(source)
    if path.is_file():
        data = yaml.safe_load(path.read_text())
        return data.get("config", data)
    return preset(*source.split("/", 1))


def price(source: str, assignments: list[str]) -> None:
    flat = trial_config(source)
    for assignment in assignments:
        set_override(flat, assignment)
    cfg = parse_trial_config(flat).settled("cpu")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    sizes = eval_sizes(cfg.task, cfg.task_options)
    single = Single(cfg, torch.device("cpu"), log=None)
    before = step_seconds(single)
    measured = {}
    for s in (*sizes.validation, *sizes.tests):
        start = time.perf_counter()
        split = single.task.splits[s.name]
        evaluate(single.model, single.task, split, cfg.eval_batch_size, torch.device("cpu"), by_depth=True)
        measured[s.name] = time.perf_counter() - start
    per_step = (before + step_seconds(single)) / 2  # the step timed on either side of the evaluations
    per_position = per_step / (cfg.batch_size * sizes.train_length)
    print(
        f"{source}: {per_step:.4f} s per training step of {cfg.batch_size}, {torch.get_num_threads()} threads"
    )
    for s in (*sizes.validation, *sizes.tests):
        calls = s.outputs if sizes.decodes else 1
        priced = cost_model.FORWARD_SHARE * per_position * s.rows * s.length * calls
        share = measured[s.name] / (per_position * s.rows * s.length * calls)
        print(
            f"  {s.name:12s} {s.rows:6d} rows x {s.length:5.1f}: {measured[s.name]:7.2f} s, priced "
            f"{priced:7.2f} s; an evaluated position {share:.2f} of a trained one"
        )
    priced = cost_model.evaluation_seconds(per_step, cfg.batch_size, sizes)
    print(f"  one evaluation: {sum(measured.values()):.2f} s, priced {priced:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--eval-size", type=int, default=500)
    parser.add_argument("--price", metavar="SOURCE", help="a preset task/model or a trial config file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.price:
        price(args.price, args.set)
    else:
        shared_split(args.repeats, args.eval_size)


if __name__ == "__main__":
    main()
