"""End to end through the CLI: spec -> nnsight traces -> zarr store -> labeled reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import workbench
from workbench.cli import main
from workbench.store import is_store, store_info

ROOT = Path(__file__).resolve().parents[1]

SPEC = """\
name: runner-test
models: [tiny-smolvlm, tiny-qwen3vl]
data: {{source: builtin, n: {n}}}
conditions:
  baseline: {{}}
  alpha:
    sweep: {{alpha: [0.5, 1.0, 3.0]}}
    interventions:
      - {{kind: scale, site: projector, factor: $alpha, positions: vision}}
capture:
  - {{site: layer, layers: all}}
store: {{path: {store}}}
"""


def write_spec(tmp_path: Path, n: int = 2, name: str = "store.zarr", backend: str = "") -> tuple[Path, Path]:
    store = tmp_path / name
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(SPEC.format(n=n, store=store) + (f"backend: {backend}\n" if backend else ""))
    return spec, store


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workbench.cli", *args], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, **(env or {})}, timeout=300,
    )


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory, workbench_cache):
    spec, store = write_spec(tmp_path_factory.mktemp("run"), n=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORKBENCH_COMPACT_GRACE_S", "3600")  # the run's end keeps its per-commit history (counted below)
        assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    return store


@pytest.mark.parametrize("model", ["tiny-smolvlm", "tiny-qwen3vl"])
def test_alpha_one_is_baseline_and_alpha_scales_vision_rows(demo_store, model):
    ds = workbench.open_store(demo_store, model=model)
    base = ds.sel(condition="baseline")
    one = ds.sel(condition="alpha[alpha=1.0]")
    np.testing.assert_array_equal(one.hidden.values, base.hidden.values)
    for alpha in (0.5, 3.0):
        scaled = ds.sel(alpha=alpha, layer=0)
        b0 = base.sel(layer=0)
        vision = (b0.modality == "vision").values
        assert vision.any() and (~vision).any()
        np.testing.assert_allclose(scaled.hidden.values[vision], alpha * b0.hidden.values[vision], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(scaled.hidden.values[~vision], b0.hidden.values[~vision])


def test_labels_select_together(demo_store):
    ds = workbench.open_store(demo_store, model="tiny-qwen3vl")
    picked = ds.sel(condition="baseline", modality="vision", layer=0)
    assert picked.hidden.dims == ("token", "dim")
    assert set(np.unique(picked.sample.values)) == set(np.unique(ds.sample.values))
    expected = ds.hidden.values[(ds.condition.values == "baseline") & (ds.modality.values == "vision"), 0]
    np.testing.assert_array_equal(picked.hidden.values, expected)
    assert ds.layer.values.tolist() == list(range(ds.attrs["n_layers"] + 1))
    assert "runner-test" in ds.attrs["provenance"]


def test_tree_has_one_node_per_model_and_provenance(demo_store):
    tree = workbench.open_store(demo_store)
    assert sorted(tree.children) == ["tiny-qwen3vl", "tiny-smolvlm"]
    assert tree["tiny-smolvlm"].attrs["model_id"] == "tiny-smolvlm"
    assert "spec_hash" in tree.attrs["provenance"] and "nnsight" in tree.attrs["provenance"]


def test_rerun_resumes_without_rewriting(demo_store, capsys):
    spec = demo_store.parent / "store.zarr.yaml"
    before = store_info(demo_store)
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    out = capsys.readouterr()
    assert "skipping" in out.err and "wrote 0 and skipped 16" in out.out  # notes on stderr, results on stdout
    assert store_info(demo_store)["models"] == before["models"]


def test_info_and_validate(demo_store, capsys):
    assert main(["info", str(demo_store)]) == 0
    out = capsys.readouterr().out
    assert "tiny-smolvlm" in out and "alpha[alpha=3.0]" in out and "workbench verify" in out
    assert main(["validate", str(demo_store.parent / "store.zarr.yaml"), "--models-check"]) == 0


def _identical(a: Path, b: Path) -> None:
    for model in ("tiny-smolvlm", "tiny-qwen3vl"):
        da = workbench.open_store(a, model=model).load()
        db = workbench.open_store(b, model=model).load()
        da.attrs, db.attrs = {}, {}
        # compare the label arrays themselves: the MultiIndex's tuples hold NaN (no alpha on
        # baseline), and NaN != NaN inside tuples
        xr.testing.assert_identical(da.reset_index(["token", "run"]), db.reset_index(["token", "run"]))


@pytest.mark.slow  # minutes of CPU: `make test-slow` (CI runs it)
@pytest.mark.parametrize("kill_at", ["store.write:100", "store.commit:5", "trace:7"])
def test_killed_run_resumes_to_identical_store(tmp_path, demo_store, kill_at):
    """kill -9 in the middle of a sample's writes, right after a commit and mid-trace, through
    the real runner; the rerun resumes, and the result equals the uninterrupted run's store, row
    for row. (Every write point of a small run is drilled in test_store.py.) Mid-trace, the
    background writer gathers results into one commit every 2 s, so results captured but not
    yet committed are lost and captured again. The store kills count commits of one forward each
    (`commit_interval_s: 0`): a gathered first commit holds however many results arrived within
    its interval, so the 100th write could fall inside it and leave nothing stored."""
    backend = "{commit_interval_s: 0}" if kill_at.startswith("store") else ""
    spec, store = write_spec(tmp_path, n=2, backend=backend)
    killed = run_cli("run", str(spec), "--no-progress", "--no-table", env={"WORKBENCH_KILL_AT": kill_at})
    assert killed.returncode == -9, killed.stderr
    # a kill mid-trace may come before the first commit, which is what creates the store (the
    # tiny models load within the writer's first 2 s interval): then nothing is on disk
    partial = store_info(store) if is_store(store) else {"models": {}}
    stored = sum(c["samples"] for m in partial["models"].values() for c in m["conditions"].values())
    # results are committed by the background writer, which may still hold the latest ones
    assert 0 < stored < 16 if kill_at.startswith("store") else stored < 16
    resumed = run_cli("run", str(spec), "--no-progress", "--no-table")
    assert resumed.returncode == 0, resumed.stderr
    assert f"skipped {stored} of 16" in resumed.stdout
    _identical(store, demo_store)
    assert run_cli("verify", str(store), "--no-progress").returncode == 0


def test_a_run_gathers_its_results_into_few_commits(demo_store):
    """The background writer commits what arrives within `commit_interval_s` (2 s) together:
    16 results, far fewer commits, each naming its model(s), conditions and samples (the store
    itself equals the commit-per-forward one: the kill test above compares them)."""
    from workbench.store import RUN_END, store_history

    commits = [h["message"] for h in store_history(demo_store)
               if h["message"] != "Repository initialized" and not h["message"].endswith(RUN_END.format(""))]
    assert 1 <= len(commits) < 16 and all(" | " in m for m in commits), commits


def test_second_writer_is_refused(tmp_path):
    from workbench.store import StoreBusyError, StoreWriter

    spec, store = write_spec(tmp_path, n=1)
    with StoreWriter(store):
        result = run_cli("run", str(spec), "--no-progress", "--no-table")
    assert result.returncode == 1
    assert "being written by another workbench process" in result.stderr
    with pytest.raises(StoreBusyError):
        with StoreWriter(store):
            StoreWriter(store)


def test_local_checkpoint_directory_runs_through_from_pretrained(tmp_path, workbench_cache):
    """A model given as a local directory (a saved checkpoint, as a hub download would be) loads
    through the same from_pretrained path and is stored under its id exactly as written."""
    import shutil

    from workbench.models.tiny import tiny_model_dir

    checkpoint = tmp_path / "my-checkpoints" / "qwen"
    shutil.copytree(tiny_model_dir("tiny-qwen3vl"), checkpoint)
    store = tmp_path / "local.zarr"
    spec = tmp_path / "local.yaml"
    spec.write_text(f"name: local\nmodels: [{checkpoint}]\ndata: {{source: builtin, n: 1}}\n"
                    f"conditions: {{baseline: {{}}}}\ncapture: [{{site: layer, layers: [0]}}]\nstore: {{path: {store}}}\n")
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    ds = workbench.open_store(store, model=str(checkpoint))
    assert ds.attrs["family"] == "qwen3vl" and ds.attrs["model_id"] == str(checkpoint)
    assert ds.hidden.sizes["layer"] == 1
