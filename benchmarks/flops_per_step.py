"""Arithmetic in one training step at a preset's size: what a throughput target asks of the hardware.

  python benchmarks/flops_per_step.py [--presets ctl/ndr,ctl/transformer] [--batches 3] [--rate 1000]

For each preset: parameters, the widths of a few training batches as a trial draws them (padded
as a graphed step on a GPU pads them), and the floating-point operations of their forward and
backward passes as torch.utils.flop_counter counts them (matrix products and attention, 2 per
multiply-add; the elementwise work is not counted). Then the sustained TFLOP/s that `--rate`
member-steps/s would need, to set beside a GPU's peak (H100 SXM dense: about 67 float32, 495
TF32, 990 bf16). Runs on the CPU: the count does not depend on the device.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from trainables.batches import batch_source, batch_tensors
from trainables.config import parse_trial_config, preset
from trainables.steps import forward_loss, make_model
from trainables.tasks import load_task


def step_gflop(task_model: str, batches: int) -> tuple[int, list[int], list[float]]:
    task_name, model_name = task_model.split("/")
    cfg = parse_trial_config({**preset(task_name, model_name), "device": "cpu"}).settled("cpu")
    task = load_task(cfg.task, cfg.task_options)
    model = make_model(cfg, task)
    next_batch, _ = batch_source(cfg, task, np.random.default_rng(cfg.seed))
    widths, gflops = [], []
    for _ in range(batches):
        split, index = next_batch()
        batch = batch_tensors(split, index, torch.device("cpu"), bucketed=True)
        with FlopCounterMode(display=False) as counter:
            _, loss = forward_loss(cfg, model, task.kind, batch, torch.device("cpu"))
            loss.backward()
        model.zero_grad(set_to_none=True)
        widths.append(batch["tokens"].shape[1] if "tokens" in batch else 0)
        gflops.append(counter.get_total_flops() / 1e9)
    return sum(p.numel() for p in model.parameters()), widths, gflops


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", default="ctl/ndr,ctl/transformer", help="task/model, comma-separated")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1000.0, help="member-steps/s to price")
    args = parser.parse_args()
    print(
        f"{'task/model':28s} {'params':>9s} {'batch widths':>14s} {'GFLOP/step':>11s} "
        f"{f'TFLOP/s at {args.rate:,.0f}/s':>18s}"
    )
    for task_model in args.presets.split(","):
        params, widths, gflops = step_gflop(task_model.strip(), args.batches)
        median = statistics.median(gflops)
        print(
            f"{task_model:28s} {params:9,d} {','.join(map(str, widths)):>14s} {median:11.1f} "
            f"{median * args.rate / 1e3:18.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
