"""Statistics over seeds against known values and direct implementations."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from orchestrator.report import stats


def test_summary_of_known_values():
    s = stats.summarize([0.9, 1.0, 1.0, 0.5], threshold=0.95)
    assert s.n == 4 and s.mean == pytest.approx(0.85) and s.best == 1.0
    assert s.std == pytest.approx(math.sqrt((0.05**2 + 2 * 0.15**2 + 0.35**2) / 3))  # deviations from 0.85
    assert s.solved == 0.5  # two of four seeds at or above 0.95
    low = stats.summarize([0.2, 0.05, 0.1], threshold=0.1, lower_is_better=True)
    assert low.solved == pytest.approx(2 / 3) and low.best == 0.05
    one = stats.summarize([0.7])
    assert one.std is None and one.ci is None and one.solved is None  # no "± 0.00" for a single seed


def test_mean_interval_is_the_t_formula_and_covers_the_true_mean_95_percent_of_the_time_with_three_seeds():
    values = [0.8, 0.9, 0.95]
    half = (
        4.302652729911275 * np.std(values, ddof=1) / math.sqrt(3)
    )  # t(0.975, 2 degrees of freedom), from a table
    assert stats.mean_ci(values) == pytest.approx((np.mean(values) - half, np.mean(values) + half))
    rng = np.random.default_rng(1)
    for n in (
        3,
        20,
    ):  # the percentile bootstrap the reports had: 76% with 3 seeds (benchmarks/check_intervals.py)
        covered = sum(
            low <= 0.5 <= high
            for low, high in (stats.mean_ci(rng.normal(0.5, 0.1, size=n)) for _ in range(2000))
        )
        assert 0.93 <= covered / 2000 <= 0.97, n  # 2000 draws: +-0.5% standard error


def test_welch_p_value_matches_the_formula():
    now, before = [0.80, 0.85, 0.83], [0.90, 0.93, 0.88, 0.91]
    n1, n2 = len(now), len(before)
    v1, v2 = np.var(now, ddof=1), np.var(before, ddof=1)
    t = (np.mean(now) - np.mean(before)) / math.sqrt(v1 / n1 + v2 / n2)
    df = (v1 / n1 + v2 / n2) ** 2 / ((v1 / n1) ** 2 / (n1 - 1) + (v2 / n2) ** 2 / (n2 - 1))
    assert stats.worse_p_value(now, before) == pytest.approx(scipy_stats.t.cdf(t, df))
    # Lower is better (L1): the same numbers mean "now is better", so p is the other tail.
    assert stats.worse_p_value(now, before, lower_is_better=True) == pytest.approx(
        1 - scipy_stats.t.cdf(t, df)
    )


def test_mann_whitney_exact_p_for_complete_separation():
    # 4 vs 4 seeds, every "now" below every "before": 1 of C(8, 4) = 70 orderings.
    assert stats.worse_p_value([1, 2, 3, 4], [5, 6, 7, 8], test="mannwhitney") == pytest.approx(1 / 70)


def direct_mann_whitney_p(now, before, alternative: str) -> float:
    """Every way to split the pooled seeds into sides of their sizes, each scored by U counted pair
    by pair (a tie counts a half): the share of splits at least as extreme as the one observed."""

    def u(xs, ys):
        return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in xs for y in ys)

    if alternative == "two-sided":  # twice the smaller tail, as scipy's exact tests define it
        return min(
            1.0,
            2
            * min(direct_mann_whitney_p(now, before, "less"), direct_mann_whitney_p(now, before, "greater")),
        )
    pooled, n = list(now) + list(before), len(now)
    observed = u(now, before)
    splits = [
        u([pooled[i] for i in idx], [pooled[i] for i in range(len(pooled)) if i not in idx])
        for idx in itertools.combinations(range(len(pooled)), n)
    ]
    extreme = (lambda v: v <= observed + 1e-9) if alternative == "less" else (lambda v: v >= observed - 1e-9)
    return sum(map(extreme, splits)) / len(splits)


def test_mann_whitney_p_counts_every_split_also_where_seeds_tie():
    """scipy's default went to a normal approximation when two seeds tied: 0.035 for the first case
    (one cell flagged at alpha 0.05) against an exact 5 / 70."""
    assert stats.worse_p_value([0.96, 0.98, 0.99, 1.0], [1.0] * 4, test="mannwhitney") == pytest.approx(
        5 / 70
    )
    rng = np.random.default_rng(3)
    for _ in range(40):
        n, m = rng.integers(2, 6, size=2)
        now, before = (
            list(rng.choice([0.9, 0.95, 0.97, 1.0], n)),
            list(rng.choice([0.9, 0.95, 0.97, 1.0], m)),
        )  # saturated scores tie
        for low in (False, True):
            assert stats.worse_p_value(now, before, low, "mannwhitney") == pytest.approx(
                direct_mann_whitney_p(now, before, "greater" if low else "less")
            ), (now, before, low)
        assert stats.two_sided_p(now, before, "mannwhitney") == pytest.approx(
            direct_mann_whitney_p(now, before, "two-sided")
        ), (now, before)


def test_holm_adjustment():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_regression_needs_the_test_and_the_effect():
    before = [0.90, 0.92, 0.91]
    flagged = stats.regressions(
        [(("a",), [0.50, 0.52, 0.51], before, False), (("b",), [0.905, 0.915, 0.91], before, False)]
    )
    assert [c.regressed for c in flagged] == [True, False]
    # A significant but tiny change is below the minimum effect.
    tiny = stats.regressions(
        [(("c",), [0.9050, 0.9051, 0.9052], [0.9100, 0.9101, 0.9102], False)], min_effect=0.01
    )
    assert not tiny[0].regressed
    assert stats.regressions([(("d",), [0.1], before, False)]) == []  # one seed: nothing to test
    # A fall of exactly the minimum effect is one, though its float falls short of it by a rounding.
    assert (
        0.57 - 0.56 < 0.01
        and stats.regressions([(("e",), [0.56] * 3, [0.57] * 3, False)], min_effect=0.01)[0].regressed
    )


def test_false_alarm_rate_of_unchanged_nights_stays_below_five_percent():
    """Two nights of the same code, different seeds: 2000 simulated pairs of nights of 6 cells x 3
    seeds, each cell's seeds from its own noisy distribution."""
    rng = np.random.default_rng(0)
    centres = rng.uniform(0.3, 0.95, size=6)
    nights_flagged = 0
    for _ in range(2000):
        cells = [
            ((k,), list(rng.normal(c, 0.05, 3)), list(rng.normal(c, 0.05, 3)), False)
            for k, c in enumerate(centres)
        ]
        nights_flagged += any(c.regressed for c in stats.regressions(cells))
    assert nights_flagged / 2000 < 0.05


def test_tied_seeds_give_exact_answers_without_scipy_warnings(recwarn):
    # Three tied 0.1s have a mean of 0.10000000000000002 and a std of about 1e-17, not 0.
    assert stats.worse_p_value([0.1] * 3, [0.1] * 3) == 1.0 and stats.two_sided_p([0.1] * 3, [0.1] * 3) == 1.0
    assert (
        stats.worse_p_value([0.7] * 3, [0.9] * 3) == 0.0 and stats.worse_p_value([0.9] * 3, [0.7] * 3) == 1.0
    )
    # Tied seeds, one side a seed short (it diverged): three 0.7s average to 0.6999999999999998, two
    # to 0.7, and the means' rounding read as a clear fall (p = 0, flagged at min_effect 0).
    assert stats.worse_p_value([0.7] * 3, [0.7] * 2) == 1.0 and stats.two_sided_p([0.7] * 3, [0.7] * 2) == 1.0
    assert stats.worse_p_value([0.1] * 2, [0.1] * 3, lower_is_better=True) == 1.0
    assert not stats.regressions([(("f",), [0.7] * 3, [0.7] * 2, False)], min_effect=0)[0].regressed
    # One side tied: Welch with that side's variance 0, i.e. a one-sample t test of the other side (df n - 1).
    before = [0.9, 0.9, 0.91]
    t = (0.7 - np.mean(before)) / math.sqrt(np.var(before, ddof=1) / 3)
    assert stats.worse_p_value([0.7] * 3, before) == pytest.approx(scipy_stats.t.cdf(t, 2))
    assert stats.two_sided_p([0.7] * 3, before) == pytest.approx(2 * scipy_stats.t.cdf(t, 2))
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)], [
        str(w.message) for w in recwarn
    ]


def test_the_paper_test_is_welchs_from_the_papers_mean_std_and_runs():
    ours, mean, std, runs = [0.91, 0.95, 0.99, 0.97], 0.90, 0.03, 5
    # Welch's t and the Welch-Satterthwaite degrees of freedom, written out.
    a, b = np.var(ours, ddof=1) / len(ours), std**2 / runs
    t = (np.mean(ours) - mean) / math.sqrt(a + b)
    df = (a + b) ** 2 / (a**2 / (len(ours) - 1) + b**2 / (runs - 1))
    assert stats.paper_p(ours, mean, std, runs) == pytest.approx(2 * (1 - scipy_stats.t.cdf(abs(t), df)))
    # A printed 0.00 beside seeds that vary is a one-sample t test of ours (the paper's variance 0).
    t = (np.mean(ours) - mean) / math.sqrt(np.var(ours, ddof=1) / len(ours))
    assert stats.paper_p(ours, mean, 0.0, runs) == pytest.approx(
        2 * (1 - scipy_stats.t.cdf(abs(t), len(ours) - 1))
    )
    # What cannot be tested: one seed, a paper without a run count or a std.
    assert stats.paper_p([0.9], mean, std, runs) is None and stats.paper_p(ours, mean, std, None) is None
    assert stats.paper_p(ours, mean, None, runs) is None
    # Exact numbers without spread on either side: equal (three 0.7s, whose mean rounds to
    # 0.6999999999999998), or a clear difference.
    assert stats.paper_p([0.7] * 3, 0.7, 0.0, 5) == 1.0 and stats.paper_p([0.5] * 3, 0.7, 0.0, 5) == 0.0


def welch_p(ours, mean, std, runs):
    """Welch's two-sided p from the t statistic and Welch-Satterthwaite's degrees of freedom."""
    a, b = np.var(ours, ddof=1) / len(ours), std**2 / runs
    if a + b == 0:
        return 1.0 if np.ptp([*ours, mean]) == 0 else 0.0
    t = (np.mean(ours) - mean) / math.sqrt(a + b)
    df = (a + b) ** 2 / ((a**2 / (len(ours) - 1) if a else 0) + (b**2 / (runs - 1) if b else 0))
    return 2 * (1 - scipy_stats.t.cdf(abs(t), df))


def test_the_paper_test_allows_for_the_papers_rounding():
    # 0.996 over three seeds beside a printed 1.00 ± 0.00 (5 runs): read as exact, p = 0.008; the
    # paper's runs may have scored a mean of 0.996 with a std under 0.005, so nothing can be said.
    ours = [0.996, 0.997, 0.996]
    assert welch_p(ours, 1.0, 0.0, 5) < 0.01
    assert stats.paper_p(ours, 1.0, 0.0, 5, mean_unit=0.01, std_unit=0.01) == pytest.approx(1.0)
    # Tied seeds beside a tied paper: nothing against them, once its 0.00 may be 0.004.
    assert stats.paper_p([1.0] * 3, 1.0, 0.0, 5, 0.01, 0.01) == 1.0
    # A difference that no reading of the printed numbers removes is still found.
    assert stats.paper_p([0.97, 0.98, 0.97], 1.0, 0.0, 5, 0.01, 0.01) < 0.05
    # The largest p of any mean and std the printed ones round from, over a grid of them.
    rng = np.random.default_rng(0)
    for _ in range(60):
        ours = np.round(rng.uniform(0.5, 1.0, rng.integers(2, 7)), 3).tolist()
        mean, std, runs = (
            round(rng.uniform(0.5, 1.0), 2),
            round(abs(rng.normal(0, 0.08)), 2),
            int(rng.integers(2, 7)),
        )
        means = [
            *np.linspace(mean - 0.005, mean + 0.005, 21),
            np.clip(np.mean(ours), mean - 0.005, mean + 0.005),
        ]
        grid = max(
            welch_p(ours, m, s, runs)
            for m in means
            for s in np.linspace(max(0.0, std - 0.005), std + 0.005, 21)
        )
        assert stats.paper_p(ours, mean, std, runs, 0.01, 0.01) == pytest.approx(grid, abs=1e-9), (
            ours,
            mean,
            std,
            runs,
        )
