"""What scoring a shared validation split once saves: one evaluation (trainables.train.Selection,
the first, so a new best that scores the test set too) of a small SCAN model, whose IID hold-out
fills both validation slots, against the same task with the OOD slot a copy (as every evaluation
scored it before), alternated in one process; median seconds of --repeats.

  python benchmarks/bench_evaluation.py [--repeats 5] [--eval-size 500]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time

import torch

from trainables.config import parse_trial_config
from trainables.tasks import load_task
from trainables.train import Selection, make_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--eval-size", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = parse_trial_config(
        {
            "task": "scan",
            "model": "transformer_enc_dec",
            "task_options": {"eval_size": args.eval_size},
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
    for _ in range(args.repeats):
        for name, task in (("shared split", shared), ("a copy", copied)):
            selection = Selection(cfg, task, torch.device("cpu"), None, "scan")
            start = time.perf_counter()
            selection(model, 1, 1.0, {}, 1.0)
            seconds[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    for name, value in medians.items():
        print(f"{name:14s} {value:6.2f} s per evaluation")
    print(f"shared / copy  {medians['shared split'] / medians['a copy']:6.2f}")


if __name__ == "__main__":
    main()
