"""The analysis cache, the study's tables and report through the CLI, and analyses on a machine
without torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import workbench
from analyses import cache, logits, norms, registry, tables
from analyses.cache import COMPUTED, cache_entries, open_model
from analyses.residual import residual_geometry
from analyses.synthetic import DEFAULT_MODELS, synthetic_store_once, write_synthetic_store
from workbench.cli import main
from workbench.store import StoreError, StoreWriter, list_models, store_info

ROOT = Path(__file__).resolve().parents[1]
FULL, PARTIAL = DEFAULT_MODELS[0].model_id, DEFAULT_MODELS[1].model_id
N_SAMPLES = 3


@pytest.fixture(scope="session")
def shared_store(tmp_path_factory):
    """The synthetic store of test_analyses.py (written once per session)."""
    return synthetic_store_once(tmp_path_factory.getbasetemp() / "analyses-synthetic.zarr", n_samples=N_SAMPLES).path


@pytest.fixture
def store(shared_store, tmp_path):
    """A private copy: these tests write caches and samples into it."""
    copy = tmp_path / "store.zarr"
    shutil.copytree(shared_store, copy, ignore=shutil.ignore_patterns("_analyses"))
    return copy


@pytest.fixture(scope="module")
def analysed(shared_store, tmp_path_factory):
    """A copy of the store after `workbench analyze` (its caches filled), and what it printed."""
    import contextlib
    import io

    copy = tmp_path_factory.mktemp("analysed") / "store.zarr"
    shutil.copytree(shared_store, copy, ignore=shutil.ignore_patterns("_analyses"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["analyze", str(copy)]) == 0
    return copy, printed.getvalue()


def without_attrs(ds: xr.Dataset) -> xr.Dataset:
    out = ds.copy()
    out.attrs = {}
    return out


# -- the cache ---------------------------------------------------------------------------------


def test_cache_hit_force_and_invalidation_by_a_new_sample(store, monkeypatch):
    ds = open_model(store, FULL)
    first = residual_geometry(ds)
    assert first.attrs["cache"] == "computed"
    computed = COMPUTED["residual_geometry"]

    # the unchanged store: the entry is read back from disk, nothing is computed
    cache._MEMO.clear()
    monkeypatch.setattr("analyses.residual.token_metrics", lambda *a: pytest.fail("recomputed a cached result"))
    again = residual_geometry(ds)
    assert again.attrs["cache"] == "hit" and COMPUTED["residual_geometry"] == computed
    xr.testing.assert_identical(without_attrs(again), without_attrs(first))
    monkeypatch.undo()

    forced = residual_geometry(ds, force=True)
    assert forced.attrs["cache"] == "computed" and COMPUTED["residual_geometry"] == computed + 1
    xr.testing.assert_identical(without_attrs(forced), without_attrs(first))
    assert len([e for e in cache_entries(store) if e["analysis"] == "residual_geometry"]) == 1

    # one more sample in the store: another fingerprint, recomputed over 4 samples
    write_synthetic_store(store, models=DEFAULT_MODELS[:1], n_samples=1, first_sample=N_SAMPLES)
    grown_ds = open_model(store, FULL)
    grown = residual_geometry(grown_ds)
    assert grown.attrs["cache"] == "computed" and grown.sizes["sample"] == N_SAMPLES + 1
    xr.testing.assert_allclose(grown.sel(sample=first.sample.values)[["norm", "cos_first"]], first[["norm", "cos_first"]])
    assert residual_geometry(grown_ds).attrs["cache"] == "hit"


def test_parameters_and_subsets_get_their_own_entries(store):
    ds = open_model(store, FULL)
    by_baseline = logits.next_token_comparison(ds, "baseline")
    by_blank = logits.next_token_comparison(ds, "blank")
    assert by_baseline.attrs["cache"] == by_blank.attrs["cache"] == "computed"
    assert not np.allclose(by_baseline["kl"], by_blank["kl"], equal_nan=True)
    assert logits.next_token_comparison(ds, "baseline").attrs["cache"] == "hit"
    keep = ["baseline", "alpha=0.1"]
    subset = ds.isel(token=np.isin(ds["condition"].values.astype(object).astype(str), keep),
                     run=np.isin(ds["run_condition"].values.astype(object).astype(str), keep))
    part = residual_geometry(subset)
    whole = residual_geometry(ds)
    assert part.attrs["cache"] == whole.attrs["cache"] == "computed"
    assert list(part.condition.values) == ["baseline", "alpha=0.1"] and whole.sizes["condition"] == 7
    assert residual_geometry(subset).attrs["cache"] == "hit"


def test_plain_datasets_are_not_cached_and_the_cache_group_is_not_a_model(store):
    ds = workbench.open_store(store, model=FULL)
    assert logits.next_token_comparison(ds).attrs["cache"] == "off" and not (store / cache.CACHE_GROUP).exists()
    ds.attrs[cache.STORE_ATTR] = str(store)                  # what open_model does
    assert logits.next_token_comparison(ds).attrs["cache"] == "computed"
    assert (store / cache.CACHE_GROUP / "zarr.json").exists()
    assert list_models(store) == [FULL, PARTIAL]
    assert sorted(store_info(store)["models"]) == sorted([FULL, PARTIAL])
    assert sorted(workbench.open_store(store).children) == sorted(["syn--a-small", "syn--b-deeper"])
    with pytest.raises(StoreError, match="not in store"):
        workbench.open_store(store, model=cache.CACHE_GROUP)
    with StoreWriter(store) as writer:                      # repair walks models only
        assert writer.repairs == []


# -- tables ------------------------------------------------------------------------------------


def test_analyze_prints_every_table_with_the_api_numbers_and_caches(analysed, capsys):
    store, out = analysed
    for title in ("Vision/text norm ratio", "Relative first update", "Correlation of text-token curves",
                  "Scaling the projector output", "Vision-token keys and values", "KV-cache substitution"):
        assert f"### {title}" in out
    assert "| model | vision/text norm ratio |" in out
    assert "| model | modality | ‖u₁‖/‖h₀‖ | cos(h₁,h₀) |" in out
    assert "| model | α | vision/text norm ratio | attention KL | logit KL | median rank |" in out
    assert "| model | α | cos(K′,K) | cos(V′,V) |" in out
    assert "| model | condition | D_KL(z_real ‖ z_hybrid) | D_KL(z_blank ‖ z_hybrid) | D_KL(z_real ‖ z_blank) | D_KL(z_real ‖ z_self) |" in out
    # every α of the store, for every model that has the inputs
    for alpha in ("0.1", "1", "3"):
        assert f"| {FULL} | {alpha} |" in out and f"| {PARTIAL} | {alpha} |" in out
    assert f"Not shown: {PARTIAL}: needs keys, values." in out
    assert f"Not shown: {PARTIAL}: needs condition 'blank', condition 'hybrid'." in out
    assert f"Not shown: {PARTIAL}: needs condition 'blank' or 'none'." in out
    assert f"| {PARTIAL} | n/a" not in out
    # the cells are the Python API's numbers
    ds = open_model(store, FULL)
    ratio = norms.vision_text_ratio(ds).sel(condition="baseline")
    assert f"| {FULL} | {tables.cell(ratio, 2)} |" in out
    rank = logits.median_rank(ds).sel(condition="alpha=0.1")
    assert tables.cell(rank, 1) == "3.0 [3.0, 3.0]" and "3.0 [3.0, 3.0]" in out
    assert "[" in tables.cell(ratio) and "95% bootstrap CI" in out

    before = COMPUTED.copy()
    assert main(["analyze", str(store), "norm-ratio", "first-update", "--models", FULL, "--force"]) == 0
    assert COMPUTED - before == {"residual_geometry": 1}     # recomputed once, shared by both tables
    out = capsys.readouterr().out
    assert out.count("### ") == 2 and PARTIAL not in out


def test_tables_name_what_a_store_lacks(tmp_path):
    path = tmp_path / "hidden-only.zarr"
    write_synthetic_store(path, models=DEFAULT_MODELS[:1], n_samples=2, alphas=(0.5,), extra_conditions=(),
                          variables=("hidden",))
    out = tables.analyze(path)
    assert "### Vision/text norm ratio" in out and "### Relative first update" in out
    skipped = [line for line in out.splitlines() if "skipped" in line]
    made = [line for line in out.splitlines() if line.startswith("### ")]
    # every registered analysis either makes its table or names what the store lacks
    assert len(skipped) + len(made) == len(registry.analyses()) and len(skipped) >= 10
    assert f"{FULL}: needs logprobs (a `logits` capture), a patching scan's runs" in out
    assert f"{FULL}: needs keys, values" in out  # kv-heads as kv-cosine
    assert f"{FULL}: needs prefill_vision_mass or decode_attention (capture `attention`)" in out
    assert f"{FULL}: needs attn_out, mlp_out" in out and f"{FULL}: needs lens_ids, lens_logprobs" in out
    assert "### Vision-token trajectories" in out  # hidden at every layer and an α sweep: enough
    assert f"{FULL}: needs run_response (a `logits` capture" in out
    assert "Norm atlas" in out and f"{FULL}: needs vision, vision_hidden, embed_table_norms" in out
    assert f"correlation" in out.lower() and f"{FULL}: needs condition 'blank' or 'none'" in out
    # alpha: each column from its own variable: the norm ratio runs, the KLs say what they need
    assert "### Scaling the projector output by alpha" in out
    assert f"Not computed (n/a): {FULL}: logit kl needs logprobs." in out
    assert f"Not computed (n/a): {FULL}: attention kl needs decode_attention." in out
    assert "### Every condition against baseline" in out   # compare: the residual stream alone
    assert f"{FULL}: needs keys, values" in out
    assert f"{FULL}: needs logprobs, condition 'blank', condition 'hybrid'" in out
    data = tables.build_tables(path, ["norm-ratio"])[0].data
    assert data["norm_ratio"].dims == ("model", "stat") and data["norm_ratio"].sel(stat="value").values.item() == pytest.approx(15)


def test_analyze_names_a_missing_store(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nothing.zarr")]) == 2  # bad input
    assert "no workbench store at" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["analyze", "--help"], ["report", "--help"]])
def test_help_texts_render(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0 and "analyze" in capsys.readouterr().out


# -- report ------------------------------------------------------------------------------------


def test_report_writes_report_md_and_readable_pngs(analysed, tmp_path, capsys):
    store, _ = analysed
    from matplotlib.image import imread

    out = tmp_path / "report"
    before = COMPUTED.copy()
    assert main(["report", str(store), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    # the tables' analyses come from the cache `analyze` filled; only figure-only ones are new
    assert set(COMPUTED - before) <= {"prefill_attention", "decode_attention_mass"}
    report = (out / "report.md").read_text()
    # the shared store holds no patching scan, and no SAE is given: those sections, and the overlay
    # of a scan's effect per patch, are what it cannot fill (their figures are drawn from a store
    # with scans in test_figures.py, and in test_sae.py with SAEs)
    held = [a for a in registry.analyses() if a.name not in ("patching", "sae")]
    for name in [make.__name__ for analysis in held for make in analysis.figures if make.__name__ != "overlay_patching"]:
        png = out / f"{name}.png"
        assert png.stat().st_size > 10_000, name
        image = imread(png)
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 300
        assert image[..., :3].std() > 0.05                # not blank
        assert f"]({name}.png)" in report
    for analysis in held:  # the synthetic store holds every other section's inputs
        assert f"## {analysis.section}\n" in report
        assert (f"*The study reports that {analysis.claim}." in report) if analysis.claim else True
    missing = report.partition("## Not in this store")[2]
    assert "Norm-gap" not in report and all(a.section not in missing for a in held)
    assert "| model | α | cos(K′,K) | cos(V′,V) |" in report


# -- without torch -----------------------------------------------------------------------------

BLOCK_TORCH = """
import sys

class _NoTorch:
    # an analysis machine: torch, nnsight and transformers are not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "nnsight", "transformers"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")

sys.meta_path.insert(0, _NoTorch())
for name in list(sys.modules):
    if name.split(".")[0] in ("torch", "nnsight", "transformers"):
        del sys.modules[name]
try:
    import torch
except ImportError:
    pass
else:
    raise SystemExit("torch still imports")
"""


def run_without_torch(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "MPLBACKEND": "Agg"})


def test_analyses_run_where_torch_cannot_be_imported(analysed, tmp_path):
    store, _ = analysed
    out = tmp_path / "figures"
    out.mkdir()
    result = run_without_torch(f"""
        from pathlib import Path
        from analyses.commands import main
        # recomputed here (--force), for one model
        assert main(["analyze", {str(store)!r}, "alpha", "kv-substitution", "--force", "--models", {FULL!r}]) == 0
        from analyses import cache, kv, norms, tables
        from analyses.builtin.alpha import kl_vs_alpha
        models = tables.open_models({str(store)!r}, [{FULL!r}])
        assert kl_vs_alpha(models, tables.Options(), Path({str(out)!r})).path is not None
        ds = models[{FULL!r}]
        print("RATIO", float(norms.vision_text_ratio(ds).sel(condition="baseline", stat="value")))
        print("KV", float(kv.kv_cosine(ds, force=True)["cos_k"].sel(condition="alpha=3.0", stat="value")))
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "nnsight", "transformers"))
        print("HEAVY", heavy)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "### Scaling the projector output" in result.stdout and "### KV-cache substitution" in result.stdout
    assert "### Vision/text norm ratio" not in result.stdout
    assert "RATIO 15.0" in result.stdout and "HEAVY []" in result.stdout
    assert (out / "kl_vs_alpha.png").stat().st_size > 10_000


def test_workbench_cli_analyze_where_torch_cannot_be_imported(analysed):
    store, _ = analysed
    result = run_without_torch(f"""
        from workbench.cli import main
        raise SystemExit(main(["analyze", {str(store)!r}, "norm-ratio"]))
    """)
    assert result.returncode == 0, result.stderr[-2000:]
