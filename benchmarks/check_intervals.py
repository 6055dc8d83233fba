"""How often a report's 95% interval of a cell's mean holds the true mean, at the seed counts
ablations run (3 by default): the Student-t interval the reports give against the percentile
bootstrap they gave before, on normal seeds; and Mann-Whitney's p where seeds tie, exact against
scipy's default (its normal approximation).

    python benchmarks/check_intervals.py [--draws 2000]
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats as scipy_stats

from orchestrator.report import stats


def percentile_bootstrap(values, seed: int, resamples: int = 2000) -> tuple[float, float]:
    means = (
        np.random.default_rng(seed).choice(values, size=(resamples, len(values)), replace=True).mean(axis=1)
    )
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000, help="cells drawn per seed count")
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    print(
        f"{'seeds':>5s} {'percentile bootstrap':>21s} {'Student-t':>10s}   (share of {args.draws} cells "
        "whose interval holds the mean)"
    )
    for n in (2, 3, 5, 20):
        draws = [rng.normal(0.5, 0.1, n) for _ in range(args.draws)]
        boot = np.mean(
            [low <= 0.5 <= high for low, high in (percentile_bootstrap(d, k) for k, d in enumerate(draws))]
        )
        t = np.mean([low <= 0.5 <= high for low, high in map(stats.mean_ci, draws)])
        print(f"{n:5d} {boot:21.3f} {t:10.3f}")
    now, before = [0.96, 0.98, 0.99, 1.0], [1.0] * 4
    print(
        f"Mann-Whitney, {now} below {before}: exact p "
        f"{stats.worse_p_value(now, before, test='mannwhitney'):.4f}, scipy's default "
        f"{scipy_stats.mannwhitneyu(now, before, alternative='less').pvalue:.4f}"
    )


if __name__ == "__main__":
    main()
