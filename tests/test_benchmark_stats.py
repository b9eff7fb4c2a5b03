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


def _results(rows: dict[str, list[float]], real: dict[str, list[float]] | None = None) -> dict:
    """A section-8 results file as benchmarks.run writes one (only what pooling reads)."""
    tiny = {name: {"pair_ratios": ratios, "store_writes": "no store" not in name,
                   "commit_interval_s": 0 if "commit per forward" in name else None,
                   "nnsight_only": "nnsight loop" in name} for name, ratios in rows.items()}
    sections = {"overhead_tiny": tiny}
    for name, ratios in (real or {}).items():
        sections[f"real:{name}"] = {"overhead": {"pair_ratios": ratios, "store_writes": True}}
    return {"sections": sections}


def test_pooled_interval_is_students_t_over_the_runs_means():
    from scipy import stats

    from benchmarks.pooled import pooled_ci

    runs = [[1.10, 1.20, 1.15], [1.30, 1.25], [1.05, 1.08, 1.02, 1.11]]
    gmean, low, high = pooled_ci(runs)
    # computed independently: each run's mean log ratio, one value per run, whatever its pairs
    means = np.array([np.mean(np.log(r)) for r in runs])
    half = stats.t.ppf(0.975, len(means) - 1) * means.std(ddof=1) / np.sqrt(len(means))
    assert gmean == pytest.approx(np.exp(means.mean()))
    assert (low, high) == pytest.approx((np.exp(means.mean() - half), np.exp(means.mean() + half)))
    # one run (no spread between runs to estimate): its geometric mean, no interval
    mean, low, high = pooled_ci([[1.1, 1.2]])
    assert mean == pytest.approx(np.sqrt(1.1 * 1.2)) and np.isnan(low) and np.isnan(high)
    assert pooled_ci([[1.1, 1.2], [1.2, 1.1]]) == pytest.approx((np.sqrt(1.1 * 1.2),) * 3)
    with pytest.raises(ValueError):
        pooled_ci([[]])


def test_pooled_interval_covers_a_ratio_that_moves_between_runs():
    # each run sees the true ratio shifted by the machine's state of the moment, and its pairs
    # scatter around that: a within-run interval misses the truth far more often than 5 %; the
    # pooled one over 6 runs covers it about 95 % of the time
    from benchmarks.pooled import pooled_ci

    rng = np.random.default_rng(3)
    true, covered, single = 1.18, 0, 0
    for _ in range(200):
        runs = [list(np.exp(np.log(true) + rng.normal(0, 0.05) + rng.normal(0, 0.08, size=16))) for _ in range(6)]
        _, low, high = pooled_ci(runs)
        covered += low <= true <= high
        _, low1, high1 = ratio_ci(runs[0])
        single += low1 <= true <= high1
    assert 0.89 <= covered / 200 <= 0.99
    assert single / 200 < 0.8


def test_pool_judges_each_row_by_its_own_target_and_leaves_diagnostics_unjudged(tmp_path):
    import json

    from benchmarks.pooled import pool, read, table

    files = []
    for i, shift in enumerate([0.0, 0.02, -0.01]):
        rows = {"tiny-a": [1.10 + shift, 1.12 + shift, 1.11 + shift],
                "tiny-a | no store": [1.0, 1.01, 0.99],
                "tiny-b | files in RAM": [1.24 + shift, 1.30 + shift, 1.27 + shift]}
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps(_results(rows, {"big": [1.02 + shift, 1.03 + shift, 1.04]})))
        files.append(path)
    pooled = {p["row"]: p for p in pool(read(files))}
    assert pooled["tiny-a"]["met"] is True and pooled["tiny-a"]["target"] == 1.25
    assert pooled["tiny-b | files in RAM"]["met"] is False  # its runs' means sit over 1.25
    assert pooled["tiny-a | no store"]["met"] is None and pooled["tiny-a | no store"]["target"] is None
    assert pooled["real:big"]["target"] == 1.05 and pooled["real:big"]["runs"] == 3
    assert pooled["tiny-a"]["runs"] == 3 and pooled["tiny-a"]["pairs"] == 9
    one = {p["row"]: p for p in pool(read(files[:1]))}
    assert one["tiny-a"]["met"] is None and one["tiny-a | no store"]["met"] is None  # one run is not judged
    assert one["tiny-a"]["ci95"] is None
    assert "needs 2 runs" in table(list(one.values())) and "nan" not in table(list(one.values()))
    text = table(list(pooled.values()))
    assert "tiny-b, files in RAM" in text and text.count("\n") == len(pooled) + 1
