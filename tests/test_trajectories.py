"""Vision trajectories against α (`analyses.trajectories`, table `trajectories`, figure
`trajectories_vs_alpha`) from an α sweep capturing every layer, checked against numpy on the
stored residual stream."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import workbench
from analyses.bootstrap import bootstrap_array
from analyses.builtin.trajectories import trajectories_vs_alpha
from analyses.tables import Options, build_tables, open_models
from analyses.trajectories import vision_trajectories
from workbench.runner import run_spec
from workbench.spec import parse_spec

MODEL = "tiny-qwen3vl"
ALPHAS = (0.5, 1.0, 3.0)


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory, workbench_cache) -> Path:
    store = tmp_path_factory.mktemp("trajectories") / "sweep.zarr"
    run_spec(parse_spec(f"""\
name: trajectories
models: [{MODEL}]
data: {{source: builtin, n: 3}}
conditions:
  baseline: {{}}
  alpha: {{sweep: {{alpha: [{", ".join(map(str, ALPHAS))}]}}, interventions: [{{kind: scale, site: projector, positions: vision, factor: $alpha}}]}}
capture: [{{site: layer, layers: all}}]
backend: {{dtype: float32, device: cpu}}
store: {{path: {store}}}
"""), progress=False, log=lambda _: None)
    return store


def _labels(ds, name):
    return np.asarray(ds[name].values).astype(object).astype(str)


def test_trajectories_equal_numpy(sweep_store):
    ds = workbench.open_store(sweep_store, model=MODEL)
    hidden = np.asarray(ds["hidden"].values, np.float64)
    condition, modality, sample = (_labels(ds, n) for n in ("condition", "modality", "sample"))
    per_sample = vision_trajectories(ds, per_sample=True, cache=False)
    summary = vision_trajectories(ds, n_resamples=100, seed=2, cache=False)
    for alpha in ALPHAS:
        name = f"alpha[alpha={alpha}]"
        norms, cosines = [], []
        for s in sorted(set(sample)):
            mine = hidden[(condition == name) & (sample == s) & (modality == "vision")]
            ref = hidden[(condition == "baseline") & (sample == s) & (modality == "vision")]
            norms.append(np.linalg.norm(mine, axis=-1).mean(0))
            cos = (mine * ref).sum(-1) / (np.linalg.norm(mine, axis=-1) * np.linalg.norm(ref, axis=-1))
            cosines.append(cos.mean(0))
        for measure, expected in (("norm", np.stack(norms, -1)), ("cos_reference", np.stack(cosines, -1))):
            got = per_sample[measure].sel(condition=name).transpose("layer", "sample").values
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(summary[measure].sel(condition=name).values,
                                       bootstrap_array(expected, n_resamples=100, seed=2), rtol=1e-9, atol=1e-12)
    # α = 1 is the reference itself; α = 3 moves the vision tokens off its direction after layer 0
    np.testing.assert_allclose(per_sample["cos_reference"].sel(condition="alpha[alpha=1.0]").values, 1.0, atol=1e-6)
    assert (per_sample["cos_reference"].sel(condition="alpha[alpha=3.0]").isel(layer=slice(1, None)) < 1 - 1e-4).any()


def test_trajectories_table_and_figure(sweep_store, tmp_path):
    table = build_tables(sweep_store, ["trajectories"], Options(n_resamples=50))[0]
    assert not table.skipped
    layers = workbench.open_store(sweep_store, model=MODEL).sizes["layer"]
    assert len(table.rows) == len(ALPHAS) * layers
    assert [r[1] for r in table.rows[::layers]] == [f"{a:g}" for a in ALPHAS]
    figure = trajectories_vs_alpha(open_models(sweep_store), Options(n_resamples=50), tmp_path)
    assert figure.skipped is None and figure.path.stat().st_size > 0
    no_sweep = build_tables(sweep_store, ["trajectories"], Options(sweep="beta"))[0]
    assert "conditions sweeping beta" in no_sweep.skipped
