"""Compiled stacks one after another in one process, as a Ray Tune actor that is reused runs a
search's trials (`reuse_actors`): each trial a stack of its own configuration. Prints per trial
the batch widths it trained on, the compiles it cost, its seconds, and whether the process has run
past torch's recompile limit by its end (from then on, whatever is not compiled yet runs
uncompiled, with one log line).

  python benchmarks/bench_recompiles.py [--device cpu] [--model "ctl / ndr"] [--size small] [--members 2]
                                        [--steps 20]
                                        [--trials "dropout=0.1; dropout=0.3; d_model=32 n_heads=2; ..."]

With --members 1 each trial is a plain trial, as the service trains a lone member, compiled as a
single model: its steps and one evaluation.

A trial's `key=value`s (space-separated) override the row's config, as a search's suggestion does;
trials are separated by ";". The default mimics a search over rates and sizes (search_spaces/ctl.yaml
searches both).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time

from bench_trainables import chosen_rows, model_rows
from torch._dynamo.utils import counters

from trainables.batched import Stack
from trainables.config import TrainConfig, parse_trial_config, set_override
from trainables.devices import setup_device, synchronize
from trainables.tasks import load_task
from trainables.train import train

SEARCH_LIKE = (
    "dropout=0.1; dropout=0.3; d_model=32; dropout=0.2 d_model=32; n_layers=3; dropout=0.45 n_layers=3"
)


class LimitHits(logging.Handler):
    """Counts torch's log line for a function past its recompile limit (once: it is not compiled again)."""

    def __init__(self):
        super().__init__()
        self.hits = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.hits += "recompile_limit" in record.getMessage()


def stack_trial(cfg: TrainConfig, members: int, steps: int) -> set[int]:
    """`steps` steps of a stack of `members` seeds: -> the batch widths it trained on."""
    device = setup_device(cfg)
    stack = Stack(
        cfg,
        [{"seed": seed} for seed in range(members)],
        load_task(cfg.task, cfg.task_options),
        device,
        log=None,
    )
    widths = set()
    for _ in range(steps):
        batch = stack.next_batch()
        widths.add(next(t.shape[2] for t in batch.values() if t.dim() > 2))  # (members, rows, width)
        stack.run(batch)
    synchronize(device)
    return widths


def single_trial(cfg: TrainConfig) -> set[int]:
    """A plain trial, as the service trains a lone member: its steps and one evaluation (widths not
    seen here)."""
    train(dataclasses.replace(cfg, eval_every=cfg.n_iters), log=None)
    return set()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="ctl / ndr")
    parser.add_argument("--size", default="small", choices=("small", "paper"))
    parser.add_argument(
        "--members", type=int, default=2, help="1: each trial a plain trial (compiled as a single model)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--trials", default=SEARCH_LIKE)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="over every trial's config"
    )
    args = parser.parse_args()
    ((_, _, _, _, flat),) = [row for row in chosen_rows(model_rows(), args.model) if row[3] == args.size]
    limit_hits = LimitHits()
    logging.getLogger("torch._dynamo").addHandler(limit_hits)
    print(f"{'trial':32s} {'widths':>12s} {'compiles':>9s} {'seconds':>8s} {'past limit':>11s}")
    for trial in args.trials.split(";"):
        config = {**flat, "device": args.device, "compile": True, "n_iters": args.steps}
        for assignment in [*args.set, *trial.split()]:
            set_override(config, assignment)
        cfg = parse_trial_config(config)
        compiled_before, start = counters["frames"]["ok"], time.perf_counter()
        widths = single_trial(cfg) if args.members == 1 else stack_trial(cfg, args.members, args.steps)
        print(
            f"{trial.strip():32s} {','.join(map(str, sorted(widths))) or '-':>12s} "
            f"{counters['frames']['ok'] - compiled_before:9d} {time.perf_counter() - start:8.1f} "
            f"{'yes' if limit_hits.hits else 'no':>11s}",
            flush=True,
        )


if __name__ == "__main__":
    main()
