"""The nightly check's false-alarm rate on real training runs: unchanged code, different seeds.

  python benchmarks/bench_nightly.py [--seeds 24] [--per-night 3] [--test welch|mannwhitney]

Trains a small LSTM on a small CTL variant for every (cell, seed): cells are learning rates and
widths, seeds as many as --seeds. Then every way of cutting a cell's seeds into disjoint nights of
--per-night seeds gives pairs of "unchanged nights" (same code, other seeds); each pair of nights
is compared as `orchestrator nightly` compares them (stats.regressions: one-sided test, Holm over
the cells, minimum effect 0.01), and the script prints how many pairs of nights raised a flag.
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile

import numpy as np

from orchestrator.report import stats
from trainables.config import parse_trial_config
from trainables.train import train

TASK = {
    "train_size": 400,
    "eval_size": 100,
    "train_depths": [1, 2],
    "ood_valid_depths": [2, 2],
    "test_depths": [2, 2],
}
CELLS = [{"lr": lr, "d_model": d} for lr in (3e-3, 1e-2) for d in (32, 64)]


def score(cell: dict, seed: int) -> float:
    cfg = parse_trial_config(
        {
            "task": "ctl",
            "model": "lstm",
            "task_options": TASK,
            "n_layers": 1,
            "batch_size": 64,
            "dropout": 0.0,
            "n_iters": 300,
            "eval_every": 100,
            "seed": seed,
            "threads": 1,
            **cell,
        }
    )
    return train(cfg, log=None)["test_acc_at_best"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=24)
    parser.add_argument("--per-night", type=int, default=3)
    parser.add_argument("--test", default="welch", choices=["welch", "mannwhitney"])
    args = parser.parse_args()
    os.environ.setdefault("SYSGEN_DATA_CACHE", tempfile.mkdtemp())
    scores = {k: [score(cell, seed) for seed in range(args.seeds)] for k, cell in enumerate(CELLS)}
    for k, cell in enumerate(CELLS):
        print(
            f"cell {cell}: test accuracy over {args.seeds} seeds {np.mean(scores[k]):.3f} ± "
            f"{np.std(scores[k], ddof=1):.3f}"
        )
    nights = [
        list(range(start, start + args.per_night))
        for start in range(0, args.seeds - args.per_night + 1, args.per_night)
    ]
    pairs = list(
        itertools.permutations(nights, 2)
    )  # (last night, tonight): both directions are separate checks
    flagged = cells_flagged = 0
    for before, now in pairs:
        compared = [
            ((k,), [scores[k][s] for s in now], [scores[k][s] for s in before], False) for k in scores
        ]
        found = [c for c in stats.regressions(compared, test=args.test) if c.regressed]
        flagged += bool(found)
        cells_flagged += len(found)
    print(
        f"{len(pairs)} pairs of unchanged nights ({len(nights)} nights of {args.per_night} seeds, "
        f"{len(CELLS)} cells each, {args.test}): {flagged} raised a flag ({flagged / len(pairs):.1%}); "
        f"{cells_flagged} of {len(pairs) * len(CELLS)} cell checks"
    )


if __name__ == "__main__":
    main()
