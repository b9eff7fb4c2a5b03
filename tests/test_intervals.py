"""Honest intervals (analyses/bootstrap.py MIN_SAMPLES, SMALL_SAMPLES): an estimate from fewer
samples than a bootstrap needs has no interval, and its table says so instead of printing one of
zero width; small samples get intervals called rough. Checked against the synthetic store, whose
layer-0 vision/text ratio is the model's `ratio` by construction."""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest

from analyses import bootstrap, tables
from analyses.synthetic import DEFAULT_MODELS, write_synthetic_store
from workbench.cli import main

MODEL = DEFAULT_MODELS[0]
_nothing = contextlib.nullcontext


def test_no_interval_below_the_minimum_and_a_resampled_one_from_it():
    values = np.array([[1.29, np.nan, np.nan], [1.0, 2.0, np.nan], [1.0, 2.0, 4.0]])
    out = bootstrap.bootstrap_array(values, n_resamples=200, seed=5)
    assert bootstrap.MIN_SAMPLES == 2
    assert out[0, 0] == 1.29 and np.isnan(out[0, 1:]).all()  # one sample: the estimate, no interval
    idx = np.random.default_rng(5).integers(0, 3, size=(200, 3))
    for row in (1, 2):  # from MIN_SAMPLES on: the percentile interval of the resampled means
        with np.errstate(all="ignore"), pytest.warns(RuntimeWarning) if row == 1 else _nothing():
            boot = [np.nanmean(values[row][k]) for k in idx]  # row 1: a resample of only the NaN has no mean
        np.testing.assert_allclose(out[row, 1:], np.nanpercentile(boot, [2.5, 97.5]), rtol=1e-12)


def test_a_cell_from_one_sample_prints_no_interval():
    assert str(tables.Cell(1.29, np.nan, np.nan, 2, n=1)) == "1.29 (n = 1, no CI)"
    assert str(tables.Cell(1.29, np.nan, np.nan, 2)) == "1.29 (no CI)"
    assert str(tables.Cell(1.29, 1.1, 1.4, 2, n=3)) == "1.29 [1.10, 1.40]"
    assert str(tables.Cell(2e-5, np.nan, np.nan, 2, n=1)) == "2.0e-05 (n = 1, no CI)"
    assert str(tables.Cell(np.nan, np.nan, np.nan, 2, n=0)) == "n/a"


@pytest.mark.parametrize("n_samples", [1, 3])
def test_a_table_from_few_samples_says_so(tmp_path, capsys, n_samples):
    store = tmp_path / "few.zarr"
    write_synthetic_store(store, models=(MODEL,), n_samples=n_samples, alphas=(), extra_conditions=(),
                          variables=("hidden",))
    assert main(["analyze", str(store), "norm-ratio"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(f"| {MODEL.model_id} |"))
    cell = row.split("|")[2].strip()
    note = next(line for line in out.splitlines() if line.startswith("Estimates are"))
    assert f"n = {n_samples}" in note
    assert f"fewer than {bootstrap.SMALL_SAMPLES} samples the intervals are rough" in note
    if n_samples == 1:
        assert cell == f"{MODEL.ratio:.2f} (n = 1, no CI)"  # the constructed ratio, and no [x, x]
        assert not re.search(r"\[[-\d.e]+, [-\d.e]+\]", out)
        assert f"fewer than {bootstrap.MIN_SAMPLES} samples has no interval" in note
    else:
        assert re.fullmatch(rf"{MODEL.ratio:.2f} \[[\d.]+, [\d.]+\]", cell), cell
        assert "has no interval" not in note
