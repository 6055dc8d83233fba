"""Where one training step's device time goes: the kernels of a stack of N members, by total time.

  python benchmarks/profile_step.py [--preset ctl/ndr] [--device cuda] [--members 1,20] [--steps 10]
                                    [--fp32] [--bf16] [--set key=value ...] [--rows 25]

For each stack size, the step (graphed where the model allows, as a launch runs it) is warmed up
until every length bucket is captured, then profiled over --steps steps: the share of the device
time each kernel takes, how many it launches per step, and the device time per step against the
wall time per step (the rest is the GPU waiting). Issue 21 asks why stacked NDR stops scaling: this
says which kernels fill the step.
"""

from __future__ import annotations

import argparse
import time

import torch

from trainables.batched import Stack
from trainables.config import parse_trial_config, preset, set_override
from trainables.devices import setup_device, synchronize
from trainables.tasks import load_task

WARMUP_STEPS = (
    12  # usually past the captures of every length bucket (graphs.N_BUCKETS; batches are drawn at random)
)


def profile(cfg, n: int, steps: int, rows: int) -> None:
    device = setup_device(cfg)
    task = load_task(cfg.task, cfg.task_options)
    stack = Stack(cfg, [{"seed": seed} for seed in range(n)], task, device)
    for _ in range(WARMUP_STEPS):
        stack.step()
    synchronize(device)
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    )
    with torch.profiler.profile(activities=activities, acc_events=True) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            stack.step()
        synchronize(device)
        wall = (time.perf_counter() - start) / steps
    on_device = device.type == "cuda"
    events = [
        e for e in prof.key_averages() if (e.device_type == torch.autograd.DeviceType.CUDA) == on_device
    ]

    def self_us(e) -> float:
        return (
            (getattr(e, "self_device_time_total", None) or e.self_cuda_time_total)
            if on_device
            else e.self_cpu_time_total
        )

    total = sum(self_us(e) for e in events) / steps
    print(
        f"\n{cfg.task}/{cfg.model}, {n} member(s), graphed {stack.graphed}: wall {wall * 1e3:.2f} ms/step, "
        f"{'device busy' if on_device else 'CPU ops'} {total / 1e3:.2f} ms/step ({total / 1e6 / wall:.2f}), "
        f"{sum(e.count for e in events) / steps:.0f} kernels/step, {n / wall:.1f} member-steps/s"
    )
    print(f"{'share':>6s} {'us/step':>9s} {'calls/step':>10s}  kernel")
    for e in sorted(events, key=self_us, reverse=True)[:rows]:
        print(
            f"{self_us(e) / steps / total:6.3f} {self_us(e) / steps:9.1f} "
            f"{e.count / steps:10.1f}  {e.key[:110]}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="ctl/ndr", help="task/model")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--members", default="1,20")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--fp32", action="store_true", help="float32 matmuls on CUDA (the default is TF32)")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--set", action="append", default=[], help="key=value over the preset")
    args = parser.parse_args()
    task, model = args.preset.split("/")
    flat = {
        **preset(task, model),
        "device": args.device,
        "tf32": not args.fp32,
        "bf16": args.bf16,
        "compile": False,
    }  # the graphed step's kernels (--set compile=true for the compiled one's)
    for assignment in args.set:
        set_override(flat, assignment)
    cfg = parse_trial_config(flat)
    for n in (int(n) for n in args.members.split(",")):
        profile(cfg, n, args.steps, args.rows)


if __name__ == "__main__":
    main()
