"""CPU training steps with trainables' Dropout (a uniform-noise mask) against torch's own
(nn.Dropout's Bernoulli draw), side by side in one process: the same model and batches, the
dropout forward swapped between rounds, the median seconds per step over --repeats rounds each.

  python benchmarks/bench_dropout.py [--sizes small,paper] [--models "ctl / ndr,..."] [--steps 20]
                                     [--repeats 5] [--threads 1]

Prints per model the two medians and their ratio (ours / torch's; under 1 is faster).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_trainables import chosen_rows, model_rows
from torch import nn

from trainables.config import parse_trial_config
from trainables.models.dropout import Dropout
from trainables.timing import seconds_per_step

OURS = Dropout.forward


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="small")
    parser.add_argument("--models", default="ctl / ndr,ctl / transformer,ctl / lstm,copy / panm")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes, rows = args.sizes.split(","), chosen_rows(model_rows(), args.models)
    print(f"{'task / model':32s} {'size':6s} {'torch s/step':>13s} {'ours s/step':>12s} {'ours/torch':>11s}")
    for label, _, _, size, flat in rows:
        if size not in sizes:
            continue
        cfg = parse_trial_config({**flat, "device": "cpu", "threads": args.threads})
        times = {"torch": [], "ours": []}
        for _ in range(args.repeats):
            for name, forward in (("torch", nn.Dropout.forward), ("ours", OURS)):
                Dropout.forward = forward
                times[name].append(seconds_per_step(cfg, args.steps))
        Dropout.forward = OURS
        torch_s, ours_s = statistics.median(times["torch"]), statistics.median(times["ours"])
        print(f"{label:32s} {size:6s} {torch_s:13.4f} {ours_s:12.4f} {ours_s / torch_s:11.2f}", flush=True)


if __name__ == "__main__":
    main()
