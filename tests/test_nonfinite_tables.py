"""Samples with NaN/Inf captures are excluded from every table, and each table says how many."""

from __future__ import annotations

import numpy as np

from analyses.tables import EXCLUDED_COLUMN, Options, build_tables
from workbench.store import StoreWriter, Variable


def write(path, samples: list[int], poisoned: int | None = None) -> None:
    with StoreWriter(path) as store:
        store.ensure_model("m", {"family": "synthetic", "n_layers": 1})
        for i in samples:
            rng = np.random.default_rng(i)
            modality = np.array(["text"] * 3 + ["vision"] * 4 + ["text"] * 2)
            hidden = rng.standard_normal((9, 2, 4)).astype(np.float32)
            hidden[modality == "vision"] *= 5 + i
            if i == poisoned:
                hidden[1, 1, 0] = np.nan  # layer 1 only: the layer-0 ratio would still be finite
            store.write_sample("m", "baseline", f"s{i}", {
                "position": Variable(("token",), np.arange(9)),
                "modality": Variable(("token",), modality),
                "token_id": Variable(("token",), np.arange(9)),
                "hidden": Variable(("token", "layer", "dim"), hidden, {"layer": np.array([0, 1])}),
                "nonfinite": Variable(("run",), np.array([int(i == poisoned)])),
            })


def test_a_sample_with_nan_is_excluded_and_counted_in_the_table(tmp_path):
    write(tmp_path / "poisoned.zarr", [0, 1, 2, 3], poisoned=2)
    write(tmp_path / "clean.zarr", [0, 1, 3])  # the same store never holding sample 2
    options = Options(n_resamples=200)
    poisoned = build_tables(tmp_path / "poisoned.zarr", ["norm-ratio", "depth"], options)
    clean = build_tables(tmp_path / "clean.zarr", ["norm-ratio", "depth"], options)
    for a, b in zip(poisoned, clean):
        assert a.columns[-1] == EXCLUDED_COLUMN and a.columns == b.columns
        rows_a, rows_b = a.formatted_rows(), b.formatted_rows()
        assert [r[-1] for r in rows_a] == ["1"] * len(rows_a) and [r[-1] for r in rows_b] == ["0"] * len(rows_b)
        assert [r[:-1] for r in rows_a] == [r[:-1] for r in rows_b]  # the estimates without sample 2
        assert "n = 3" in a.markdown()
