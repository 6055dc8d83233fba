"""How often an unchanged night of a nightly file exits 1, with its own files' cells and seeds.

  python benchmarks/nightly_family.py [deploy/nightly.yaml] [--nights 1000] [--sd 0.03]

Reads the nightly file as `orchestrator nightly` does (each listed ablation with the file's budget
and its share of alpha: plan.nightly), counts each ablation's cells (its pairs x grid cells)
and seeds, and draws pairs of unchanged nights: every seed's test score normal around the same mean
with standard deviation --sd on both nights. Each file's comparison is stats.regressions at the
file's alpha (Holm over its cells, minimum effect); a night exits 1 when any file flags a cell.
Printed: the rate at the shares the file gets, and at the whole alpha for each file (as before
nightly_files split it), side by side on the same draws' seeds.
"""

from __future__ import annotations

import argparse
import math
import warnings

import numpy as np

from orchestrator.plan.load import load_study
from orchestrator.plan.nightly import nightly_files
from orchestrator.report import stats


def flagged(rng: np.random.Generator, cells: int, seeds: int, sd: float, alpha: float, report) -> bool:
    pairs = [
        (
            (c,),
            list(0.8 + sd * rng.standard_normal(seeds)),
            list(0.8 + sd * rng.standard_normal(seeds)),
            False,
        )
        for c in range(cells)
    ]
    return any(c.regressed for c in stats.regressions(pairs, alpha, report.min_effect, report.test))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("file", nargs="?", default="deploy/nightly.yaml")
    parser.add_argument("--nights", type=int, default=1000)
    parser.add_argument(
        "--sd", type=float, default=0.03, help="seed-to-seed standard deviation of a cell's test score"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # scipy's precision notes on near-tied draws
    files = []
    for path, text in nightly_files(args.file):
        study = load_study(path, text)
        cells = sum(math.prod(len(v) for v in pair.grid.values()) for pair in study.pairs)
        files.append((path, cells, len(study.seeds), study.report))
        print(
            f"{path}: {cells} cells x {len(study.seeds)} seeds, {study.report.test} at "
            f"alpha {study.report.alpha:g}"
        )
    shared = [report.alpha for *_, report in files]
    for label, alphas in (
        ("as nightly_files shares alpha", shared),
        ("each file at the whole alpha", [a * len(files) for a in shared]),
    ):
        rng = np.random.default_rng(0)
        rate = (
            sum(
                any(
                    flagged(rng, cells, seeds, args.sd, alpha, report)
                    for (_, cells, seeds, report), alpha in zip(files, alphas)
                )
                for _ in range(args.nights)
            )
            / args.nights
        )
        print(f"{label}: {rate:.3f} of {args.nights} unchanged nights exit 1")


if __name__ == "__main__":
    main()
