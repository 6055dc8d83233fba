"""Statistics over seeds, for reports and the nightly check.

A cell (one configuration, several seeds) is summarised by n, mean, sample std, a Student-t 95%
interval of the mean, the solved rate (fraction of seeds at or past a threshold, as
length-generalization papers report) and the best seed. A regression is decided by a one-sided
test across seeds (Welch's t or Mann-Whitney U) at a level, Holm-corrected over every cell tested
in one comparison so that a night of many cells keeps its false-alarm rate at that level (a nightly
of k files tests each at level / k: plan.nightly), and only when the mean moved by at least a
minimum effect.
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    median: float  # set beside a paper's median over runs (PANM's SCAN table prints medians)
    std: float | None  # sample std (n - 1); None for one seed
    ci: tuple[float, float] | None  # Student-t 95% interval of the mean; None for one seed
    solved: float | None  # fraction of seeds at or past the threshold; None without a threshold
    best: float  # the best seed: max, or min where lower is better


def mean_ci(values, level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean over seeds. Not a percentile bootstrap, as the reports had:
    with 2, 3 and 5 seeds (3 is the default) it covered the true mean 48%, 76% and 84% of the time
    under its "95%" label; wide is what a mean of three seeds is."""
    from scipy import stats  # noqa: PLC0415 - 3 s of imports, paid only when a statistic is computed

    values = np.asarray(values, dtype=float)
    half = stats.t.ppf(1 - (1 - level) / 2, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values))
    return float(values.mean() - half), float(values.mean() + half)


def summarize(values, threshold: float | None = None, lower_is_better: bool = False) -> Summary:
    values = [float(v) for v in values]
    n = len(values)
    mean = float(np.mean(values))
    several = n > 1
    solved = None
    if threshold is not None:
        solved = sum((v <= threshold) if lower_is_better else (v >= threshold) for v in values) / n
    return Summary(
        n=n,
        mean=mean,
        median=float(np.median(values)),
        std=float(np.std(values, ddof=1)) if several else None,
        ci=mean_ci(values) if several else None,
        solved=solved,
        best=min(values) if lower_is_better else max(values),
    )


def constant(values) -> bool:
    """All seeds tied. Not np.std(values) == 0: the mean of tied floats is rounded (3 x 0.1), so
    their std comes out about 1e-17."""
    return bool(np.ptp(values) == 0)


@contextmanager
def tied_seeds_quiet():
    """Silence scipy's "Precision loss ... catastrophic cancellation" for a side whose seeds tie:
    its variance is 0 up to rounding, which Welch's test handles; both sides tied never get here."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message="Precision loss occurred in moment calculation",
            category=RuntimeWarning,
            module="scipy",
        )
        yield


# Mann-Whitney's p by every split of the pooled seeds up to this many splits (9 seeds a side: 48,620).
EXACT_SPLITS = 50_000


def mann_whitney_p(now, before, alternative: str) -> float:
    """Mann-Whitney U's p-value, exact wherever the splits can be counted. scipy's default goes to
    its normal approximation as soon as two seeds tie (accuracies saturate at 1.0), which gave
    p = 0.035 for [0.96, 0.98, 0.99, 1.0] below [1.0] x 4, whose exact p is 5 / 70 = 0.071."""
    from scipy import stats  # noqa: PLC0415 - 3 s of imports, paid only when a statistic is computed

    if math.comb(len(now) + len(before), len(now)) <= EXACT_SPLITS:
        method = stats.PermutationMethod(n_resamples=np.inf)  # every split: exact, ties by mid-ranks
    else:
        method = "asymptotic"
    return float(stats.mannwhitneyu(now, before, alternative=alternative, method=method).pvalue)


def worse_p_value(now, before, lower_is_better: bool = False, test: str = "welch") -> float:
    """One-sided p-value of "now is worse than before" across seeds."""
    from scipy import stats  # noqa: PLC0415 - 3 s of imports, paid only when a statistic is computed

    now, before = np.asarray(now, dtype=float), np.asarray(before, dtype=float)
    # Worse is lower for accuracies: test before > now, i.e. the alternative "now less than before".
    alternative = "greater" if lower_is_better else "less"
    if test == "mannwhitney":
        return mann_whitney_p(now, before, alternative)
    if constant(now) and constant(before):  # Welch is undefined: identical constants or a clear shift
        # The tied values, not their means: three 0.7s average to 0.6999999999999998, two to 0.7.
        worse = (now[0] > before[0]) if lower_is_better else (now[0] < before[0])
        return 0.0 if worse else 1.0
    with tied_seeds_quiet():
        return float(stats.ttest_ind(now, before, equal_var=False, alternative=alternative).pvalue)


def beyond_chance_p(values, level: float, lower_is_better: bool = False, test: str = "welch") -> float:
    """One-sided p-value of "these seeds score better than chance (`level`)": the seeds against
    `level` as a side of as many seeds that never varies (Welch's test is then Student's one-sample t)."""
    return worse_p_value([level] * len(values), values, lower_is_better, test)


def two_sided_p(values, baseline, test: str = "welch") -> float:
    """p-value of "this cell differs from the baseline cell" across seeds."""
    from scipy import stats  # noqa: PLC0415 - 3 s of imports, paid only when a statistic is computed

    values, baseline = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    if test == "mannwhitney":
        return mann_whitney_p(values, baseline, "two-sided")
    if constant(values) and constant(baseline):
        return 1.0 if values[0] == baseline[0] else 0.0
    with tied_seeds_quiet():
        return float(stats.ttest_ind(values, baseline, equal_var=False).pvalue)


def paper_p(
    values, mean: float, std: float | None, runs: int | None, mean_unit: float = 0.0, std_unit: float = 0.0
) -> float | None:
    """Two-sided Welch p-value of "our seeds differ from a paper's number", from the paper's mean,
    std and run count (its std taken as a sample std): the largest p the printed numbers allow. A
    paper rounds to a unit (1.00 ± 0.00: a mean in [0.995, 1.005], a std under 0.005), and the
    printed value itself read as exact called 0.996 over three seeds "p = 0.008" from a 1.00 ± 0.00,
    which the paper's own runs may have scored. So ours is tested against the mean within half a
    unit nearest to ours, and the std at either end of its half unit (the larger p; Welch's degrees
    of freedom make either end the larger, and tests/test_stats.py finds no larger p inside).
    None where that cannot be said: fewer than two runs on a side, or no printed std."""
    from scipy import stats  # noqa: PLC0415 - 3 s of imports, paid only when a statistic is computed

    if len(values) < 2 or not runs or runs < 2 or std is None:
        return None
    ours = float(values[0]) if constant(values) else float(np.mean(values))  # tied: not their mean's rounding
    nearest = min(max(ours, mean - mean_unit / 2), mean + mean_unit / 2)
    p = 0.0
    for paper_std in {max(0.0, std - std_unit / 2), std + std_unit / 2}:
        if constant(values) and paper_std == 0:  # no spread on either side: equal, or a clear difference
            p = max(p, 1.0 if ours == nearest else 0.0)
            continue
        with tied_seeds_quiet():
            welch = stats.ttest_ind_from_stats(
                ours, np.std(values, ddof=1), len(values), nearest, paper_std, runs, equal_var=False
            )
        p = max(p, float(welch.pvalue))
    return p


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Comparison:
    key: tuple  # what was compared (pair, cell, metric)
    before: float
    now: float
    p: float  # one-sided, Holm-adjusted over the comparisons made together
    regressed: bool


def regressions(
    pairs: list[tuple[tuple, list[float], list[float], bool]],
    alpha: float = 0.05,
    min_effect: float = 0.01,
    test: str = "welch",
) -> list[Comparison]:
    """Each (key, now, before, lower_is_better) compared; regressed where the Holm-adjusted p is
    below alpha and the mean got worse by at least min_effect. Cells with fewer than two seeds on
    either side cannot be tested and never regress."""
    testable = [
        (key, now, before, low) for key, now, before, low in pairs if len(now) > 1 and len(before) > 1
    ]
    raw = [worse_p_value(now, before, low, test) for _, now, before, low in testable]
    out = []
    for (key, now, before, low), p in zip(testable, holm(raw)):
        m_now, m_before = float(np.mean(now)), float(np.mean(before))
        worse_by = (m_now - m_before) if low else (m_before - m_now)
        # Means of decimal scores differ by a float's rounding: 0.57 - 0.56 is 0.0099999999999999.
        out.append(Comparison(key, m_before, m_now, p, p < alpha and worse_by >= min_effect - 1e-12))
    return out


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"
