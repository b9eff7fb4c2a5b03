"""analyses.depth against direct numpy on synthetic streams, and on a store written by
specs/depth_norms.yaml (tiny-llama through nnsight's in-process simulation of the remote path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from analyses.depth import mean_norm, mean_update_ratio, massive_activations, token_norms, top_activations, update_ratio

ROOT = Path(__file__).resolve().parents[1]


def stream(tokens: int = 6, layers: int = 4, dim: int = 16, seed: int = 0) -> xr.DataArray:
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(tokens, layers, dim)).astype(np.float32)
    h = np.cumsum(h, axis=1)  # a residual stream: each layer adds to the previous one
    return xr.DataArray(h, dims=("token", "layer", "dim"), coords={"layer": np.arange(layers)}, name="hidden")


def test_norms_and_update_ratio_match_numpy():
    h = stream()
    x = h.values.astype(np.float64)
    np.testing.assert_allclose(token_norms(h).values, np.linalg.norm(x, axis=-1))
    np.testing.assert_allclose(mean_norm(h).values, np.linalg.norm(x, axis=-1).mean(0))
    expected = np.linalg.norm(x[:, 1:] - x[:, :-1], axis=-1) / np.linalg.norm(x[:, :-1], axis=-1)
    ratio = update_ratio(h)
    assert ratio.dims == ("token", "decoder_layer") and ratio.decoder_layer.values.tolist() == [0, 1, 2]
    np.testing.assert_allclose(ratio.values, expected)
    np.testing.assert_allclose(mean_update_ratio(h).values, expected.mean(0))


def test_update_ratio_pairs_only_consecutive_stored_layers():
    h = stream(layers=6).sel(layer=[0, 1, 3, 4])
    assert update_ratio(h).decoder_layer.values.tolist() == [0, 3]
    with pytest.raises(ValueError, match="two consecutive layers"):
        update_ratio(h.sel(layer=[0, 3]))


def test_top_activations_find_a_planted_massive_channel():
    h = stream(tokens=5, layers=3, dim=32)
    values = h.values.copy()
    values[0, 1:, 7] = -900.0    # token 0, from layer 1 on: channel 7 is massive (negative sign too)
    values[3, 2, 19] = 450.0
    h = h.copy(data=values)
    top = top_activations(h, k=3)
    assert top.channel.dims == ("token", "layer", "rank")
    assert top.channel.values[0, 1, 0] == 7 and top.channel.values[0, 2, 0] == 7
    assert top.magnitude.values[0, 1, 0] == 900.0
    median = np.median(np.abs(values[0, 1]))
    np.testing.assert_allclose(top.ratio.values[0, 1, 0], 900.0 / median)
    # ranks are sorted, and agree with a full sort
    full = np.sort(np.abs(values), axis=-1)[..., ::-1][..., :3]
    np.testing.assert_allclose(top.magnitude.values, full)
    table = massive_activations(h, k=3, min_ratio=100)
    assert set(zip(table.token, table.layer, table.channel)) == {(0, 1, 7), (0, 2, 7), (3, 2, 19)}
    assert table.ratio.is_monotonic_decreasing


def test_lazy_input_gives_the_same_result():
    h = stream(tokens=10)
    lazy = h.chunk({"token": 3, "layer": 1, "dim": 8})
    xr.testing.assert_allclose(top_activations(lazy, k=2).compute(), top_activations(h, k=2))
    xr.testing.assert_allclose(mean_update_ratio(lazy).compute(), mean_update_ratio(h))


def test_analyses_depth_does_not_import_torch_or_nnsight():
    code = "import sys, analyses.depth; bad = {'torch', 'nnsight'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_depth_spec_runs_and_analyses_read_its_store(tmp_path, workbench_cache):
    import workbench
    from workbench.cli import main
    from workbench.spec import load_spec

    spec = load_spec(ROOT / "specs" / "depth_norms.yaml")
    assert spec.models == ["meta-llama/Llama-3.1-8B"] and spec.backend.kind == "remote"
    store = tmp_path / "depth.zarr"
    argv = ["run", str(ROOT / "specs" / "depth_norms.yaml"), "--models", "tiny-llama", "--remote", "local",
            "--limit", "2", "--store", str(store), "--no-progress", "--no-table"]
    assert main(argv) == 0
    h = workbench.open_store(store, model="tiny-llama").hidden
    assert h.sizes["layer"] == 3  # tiny-llama: 2 decoder layers -> residual layers 0..2
    assert mean_norm(h).sizes == {"layer": 3}
    assert mean_update_ratio(h).sizes == {"decoder_layer": 2}
    top = top_activations(h, k=2).compute()
    assert (top.ratio.values >= 1).all()
    assert set(np.unique(top.token.to_index().get_level_values("sample"))) == {"builtin/counting/000", "builtin/color/001"}
