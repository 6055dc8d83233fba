"""ESBN's generator checked as numbers: every trial of every split of the 16 cells (four problems x
hold-out m = 0, 50, 85, 95) answered again by the independent evaluator of tests/test_esbn.py,
each set's size beside the distinct trials its objects make, the trial types' balance, and the time
to build a cell.

    python benchmarks/check_esbn.py [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_esbn import evaluate  # noqa: E402 - the evaluator lives with the tests, apart from the generator

from trainables.tasks import esbn  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = []
    for problem, holdout in itertools.product(esbn.PROBLEMS, (0, 50, 85, 95)):
        config = esbn.ESBNConfig(problem=problem, holdout=holdout, seed=args.seed)
        start = time.perf_counter()
        task = esbn.build(config)
        seconds = time.perf_counter() - start
        checked = disagree = 0
        for split in task.splits.values():
            answers = np.array([evaluate(problem, row.tolist()) for row in split.image_ids])
            checked += len(answers)
            disagree += int((answers != split.labels).sum())
        train, test = task.splits["train"], task.splits["test"]
        types = np.bincount(train.depths)
        rows.append(
            {
                "problem": problem,
                "m": holdout,
                "train": len(train),
                "distinct train": len({tuple(r) for r in train.image_ids.tolist()}),
                "test": len(test),
                "train types": "/".join(map(str, types)),
                "checked": checked,
                "disagreements": disagree,
                "build s": round(seconds, 2),
            }
        )
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    print(
        f"trials checked: {table['checked'].sum():,}; disagreements with the evaluator: "
        f"{table['disagreements'].sum()}"
    )


if __name__ == "__main__":
    main()
