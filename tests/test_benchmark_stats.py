"""The statistics the benchmarks judge their targets by (benchmarks/common.py, run.py): the paired
ratios' confidence interval, the host's steal time, and the section-8 verdict."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import interleave, ratio_ci, steal_time  # noqa: E402
from benchmarks.run import overhead_met  # noqa: E402


def test_ratio_ci_needs_three_pairs_and_handles_no_spread():
    assert ratio_ci([1.2, 1.3]) is None
    assert ratio_ci([1.2, 1.2, 1.2]) == pytest.approx((1.2, 1.2, 1.2))


def test_ratio_ci_is_the_geometric_mean_with_an_interval_around_it():
    rng = np.random.default_rng(1)
    ratios = list(np.exp(rng.normal(np.log(1.2), 0.08, size=12)))
    mean, low, high = ratio_ci(ratios)
    assert mean == pytest.approx(float(np.exp(np.mean(np.log(ratios)))))
    assert low < mean < high
    # an independent interval: the t interval of the mean log ratio, which a bootstrap of 12
    # near-normal values should come close to
    from scipy import stats

    logs = np.log(ratios)
    t_low, t_high = stats.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
    assert np.log(low) == pytest.approx(t_low, abs=0.03) and np.log(high) == pytest.approx(t_high, abs=0.03)


def test_ratio_ci_covers_the_true_ratio_about_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    true = 1.15
    covered = 0
    for _ in range(120):
        ratios = np.exp(rng.normal(np.log(true), 0.1, size=10))
        _, low, high = ratio_ci(list(ratios))
        covered += low <= true <= high
    # BCa over 10 pairs undercovers a little; a broken interval (e.g. of the median, or of one
    # tail) lands far from 95 %
    assert 0.85 <= covered / 120 <= 0.99


def test_a_target_is_met_only_where_the_whole_interval_is_within_it():
    assert overhead_met({"ratio": 1.20, "pair_ci95": [1.15, 1.24]}, 1.25)
    assert not overhead_met({"ratio": 1.20, "pair_ci95": [1.15, 1.30]}, 1.25)  # under it, not shown
    assert not overhead_met({"ratio": 1.30, "pair_ci95": [1.26, 1.35]}, 1.25)
    assert overhead_met({"ratio": 1.04}, 1.05) and not overhead_met({"ratio": 1.06}, 1.05)  # < 3 pairs


def test_steal_time_counts_up_from_zero():
    first = steal_time()
    assert first >= 0.0
    sum(range(200_000))
    assert steal_time() >= first


def test_interleave_records_steal_and_the_pairs_interval():
    # arms of tens of ms: steal is counted in ticks of 10 ms
    paired = interleave(lambda i: sum(range(1_000_000)), lambda i: sum(range(1_500_000)), repeats=4, warmup=0)
    summary = paired.summary()
    assert len(paired.baseline_steal) == len(paired.candidate_steal) == 4
    assert all(s >= 0 for s in paired.baseline_steal + paired.candidate_steal)
    assert 0.0 <= summary["steal_share"] <= 1.0
    ratios = [c / b for c, b in zip(paired.candidate, paired.baseline)]
    assert summary["pair_ratios"] == pytest.approx(ratios, abs=1e-4)
    low, high = summary["pair_ci95"]
    assert low <= summary["pair_gmean"] <= high
