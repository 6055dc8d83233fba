"""How many operators one training step dispatches: what a GPU launches (or replays as graph nodes)
per step, counted on any device, so that a machine without a GPU can see a change cut kernels.

  python benchmarks/ops_per_step.py [--preset ctl/ndr] [--members 1,4,20] [--rows 20] [--set key=value ...]

A stack of N members (trainables.batched.Stack, as a launch trains seeds) is warmed up, then one
step runs under a counting TorchDispatchMode: every aten operator below autograd and vmap, the
backward's and the optimizer's included. Views (which launch nothing) are counted apart. Counts
depend on the device only where an operator has a device-specific decomposition (on CUDA, torch's
own dropout is one fused operator, on the CPU three).
"""
from __future__ import annotations

import argparse
from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

from trainables.batched import Stack
from trainables.config import parse_trial_config, preset, set_override
from trainables.tasks import load_task
from trainables.train import setup_device

WARMUP_STEPS = 3
LAUNCH_NOTHING = ("_unsafe_view",)  # a view, though its schema does not say so


class CountOperators(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.computed: Counter[str] = Counter()
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view or func.overloadpacket.__name__ in LAUNCH_NOTHING:
            self.views += 1
        else:
            self.computed[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count(cfg, n: int, rows: int) -> None:
    device = setup_device(cfg)
    stack = Stack(cfg, [{"seed": seed} for seed in range(n)], load_task(cfg.task, cfg.task_options), device)
    for _ in range(WARMUP_STEPS):
        stack.step()
    with CountOperators() as mode:
        stack.step()
    print(f"\n{cfg.task}/{cfg.model}, {n} member(s) on {device}: {sum(mode.computed.values())} operators per step "
          f"(and {mode.views} views)")
    for name, c in mode.computed.most_common(rows):
        print(f"{c:8d}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="ctl/ndr", help="task/model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--members", default="1,4,20")
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], help="key=value over the preset (default: batch_size=32, a small train set)")
    args = parser.parse_args()
    task, model = args.preset.split("/")
    flat = preset(task, model)
    flat = {**flat, "device": args.device, "batch_size": 32, "task_options": {**flat.get("task_options", {}), "train_size": 2000}}
    for assignment in args.set:
        set_override(flat, assignment)
    cfg = parse_trial_config(flat)
    for n in (int(n) for n in args.members.split(",")):
        count(cfg, n, args.rows)


if __name__ == "__main__":
    main()
