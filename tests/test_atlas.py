"""The norm atlas end to end: specs/norm_atlas.yaml runs offline on every tiny VLM family (CLI
overrides only), the store keeps vision-tower rows on their own `vision_patch`
dim (labelled, resumable,
verifiable), and every number of the `atlas` table equals numpy computed from plain PyTorch hooks
on the same models and samples, and from the models' own embedding weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import workbench
from analyses.atlas import norm_atlas
from analyses.tables import build_tables
from support.traces import hooked, vision_hooks
from workbench.cli import main
from workbench.data import builtin_samples
from workbench.models.architectures import tiny_architectures
from workbench.spec import load_spec
from workbench.store import verify_store

SPEC = Path(__file__).resolve().parents[1] / "specs" / "norm_atlas.yaml"
# every family whose image enters the token sequence (a cross-attention family, Mllama, has no
# vision rows at the LLM input, and no vision-tower layers of patch rows: the atlas does not apply)
VLMS = [a.tiny for a in tiny_architectures() if a.is_multimodal and not a.cross_attention_layers]
REAL = ["HuggingFaceTB/SmolVLM2-2.2B-Instruct", "Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct",
        "llava-hf/llava-onevision-qwen2-0.5b-ov-hf", "google/gemma-3-4b-it", "google/paligemma2-3b-pt-224",
        "OpenGVLab/InternVL3-1B-hf", "HuggingFaceM4/idefics2-8b", "HuggingFaceM4/Idefics3-8B-Llama3",
        "CohereLabs/aya-vision-8b", "zai-org/GLM-4.1V-9B-Thinking", "llava-hf/llava-1.5-7b-hf",
        "llava-hf/llava-v1.6-mistral-7b-hf", "Qwen/Qwen2-VL-2B-Instruct", "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
        "Qwen/Qwen3-VL-30B-A3B-Instruct", "deepseek-community/deepseek-vl-1.3b-chat",
        "deepseek-community/Janus-Pro-1B", "LiquidAI/LFM2-VL-1.6B"]
N = 2


def _run(store: Path) -> int:
    return main(["run", str(SPEC), "--models", ",".join(VLMS), "--limit", str(N), "--store", str(store),
                 "--no-progress", "--no-table"])


@pytest.fixture(scope="module")
def atlas_store(tmp_path_factory, workbench_cache):
    store = tmp_path_factory.mktemp("atlas") / "atlas.zarr"
    assert _run(store) == 0
    return store


def test_the_spec_names_a_real_checkpoint_of_every_vlm_family():
    spec = load_spec(SPEC)
    assert spec.models == REAL and len(REAL) == len(VLMS)
    assert {c.site for c in spec.capture} == {"layer", "vision", "vision_layer", "embed_table"}


def test_vision_rows_have_their_own_dim_labels_and_resume(atlas_store, load_tiny, capsys):
    for name in VLMS:
        ds = workbench.open_store(atlas_store, model=name)
        info = load_tiny(name).info
        assert ds["vision"].dims == ("vision_patch", "vision_dim")
        assert ds["vision_hidden"].dims == ("vision_patch", "vision_layer", "vision_dim")
        # the tower's layer index is its own coordinate; the LLM's `layer` holds only what was captured
        np.testing.assert_array_equal(ds["vision_layer"].values, np.arange(info.n_vision_layers))
        np.testing.assert_array_equal(ds["layer"].values, [0])
        samples = list(ds["run_sample"].values)
        assert len(set(samples)) == N
        for run, sample in enumerate(samples):  # each sample's rows, counted in its run row
            one = ds.sel(patch_condition="baseline", patch_sample=sample)
            assert one["vision"].shape[0] == int(ds["run_patches"].values[run]) > 0
            np.testing.assert_array_equal(one["patch_position"].values, np.arange(one["vision"].shape[0]))
    assert verify_store(atlas_store) == []
    capsys.readouterr()
    assert _run(atlas_store) == 0  # a rerun resumes: everything is stored
    assert f"wrote 0 and skipped {N * len(VLMS)}" in capsys.readouterr().out
    # a resume that would capture other vision layers is refused, naming the difference
    changed = atlas_store.parent / "changed.yaml"
    changed.write_text(SPEC.read_text().replace("{site: vision_layer}", "{site: vision_layer, layers: [0]}"))
    assert main(["run", str(changed), "--models", VLMS[0], "--limit", str(N), "--store", str(atlas_store),
                 "--no-progress", "--no-table"]) == 2
    assert "PatchCapture(site='vision_layer', layers=(0,))" in capsys.readouterr().err


def _reference(model, samples) -> dict[str, np.ndarray | float]:
    """The atlas of one model from plain hooks and the embedding module itself (numpy)."""
    per = {k: [] for k in ("vision_layer_norm", "vision_norm", "connector_norm", "text_input_norm", "input_ratio")}
    boundary = set()
    for sample in samples:
        inputs = model.encode(sample.image, sample.question)
        layers, vision, _ = vision_hooks(model, inputs.encoding)
        residual, _ = hooked(model, inputs.encoding)
        layer0 = np.linalg.norm(residual[:, 0].astype(np.float64), axis=-1)
        per["vision_layer_norm"].append(np.linalg.norm(layers.astype(np.float64), axis=-1).mean(0))
        per["vision_norm"].append(np.linalg.norm(vision.astype(np.float64), axis=-1).mean())
        per["connector_norm"].append(layer0[inputs.modality == "vision"].mean())
        per["text_input_norm"].append(layer0[inputs.modality == "text"].mean())
        per["input_ratio"].append(per["connector_norm"][-1] / per["text_input_norm"][-1])
        boundary |= set(inputs.input_ids[inputs.modality == "boundary"].tolist())
    embed = model.hf.get_input_embeddings()
    with torch.inference_mode():
        table = embed(torch.arange(embed.weight.shape[0])).double().norm(dim=-1).numpy()
    ids = np.array(sorted(boundary), dtype=np.int64)
    return {**{k: np.mean(v, axis=0) for k, v in per.items()}, "table": table, "boundary_ids": ids,
            "boundary_rank": np.array([1 + int((table > table[i]).sum()) for i in ids])}


@pytest.mark.slow  # seconds of CPU each: `make test-slow` (CI runs it)
def test_atlas_table_equals_plain_hooks_and_the_weights(atlas_store, load_tiny, tmp_path):
    table = build_tables(atlas_store, ["atlas"])[0]
    assert table.skipped is None
    assert [row[0] for row in table.rows] == sorted(VLMS)
    samples = builtin_samples(N)
    for name in VLMS:
        model = load_tiny(name)
        ref = _reference(model, samples)
        got = table.data.sel(model=name)
        for key in ("vision_layer_norm", "vision_norm", "connector_norm", "text_input_norm", "input_ratio"):
            value = got[key].sel(stat="value").values
            value = value[np.isfinite(value)] if value.ndim else value  # models differ in tower depth: NaN-padded
            np.testing.assert_allclose(value, ref[key], rtol=1e-4, err_msg=f"{name} {key}")
        np.testing.assert_allclose(float(got["table_mean"]), ref["table"].mean(), rtol=1e-5)
        np.testing.assert_allclose(float(got["table_p95"]), np.quantile(ref["table"], 0.95), rtol=1e-5)
        np.testing.assert_allclose(float(got["table_max"]), ref["table"].max(), rtol=1e-5)
        full = norm_atlas(
            workbench.open_store(atlas_store, model=name), n_resamples=50)
        np.testing.assert_array_equal(full["boundary_id"].values, ref["boundary_ids"])
        np.testing.assert_array_equal(full["boundary_rank"].values, ref["boundary_rank"])
        np.testing.assert_allclose(full["boundary_norm"].values, ref["table"][ref["boundary_ids"]], rtol=1e-5)
        # families with framing tokens have them in the table
        assert (len(ref["boundary_ids"]) > 0) == bool(model.arch.boundary_tokens or model.arch.boundary_patterns)
    report = tmp_path / "report"
    assert main(["report", str(atlas_store), "--out", str(report)]) == 0
    text = (report / "report.md").read_text()
    assert "norm atlas" in text and "norm_ladder.png" in text and (report / "norm_ladder.png").stat().st_size > 0


def test_atlas_is_skipped_with_what_is_missing(tmp_path, workbench_cache):
    store = tmp_path / "plain.zarr"
    assert main(["run", str(SPEC.parents[0] / "demo.yaml"), "--models", "tiny-qwen3vl", "--limit", "1",
                 "--store", str(store), "--no-progress", "--no-table"]) == 0
    table = build_tables(store, ["atlas"])[0]
    assert table.skipped and "vision" in table.skipped and "embed_table_norms" in table.skipped


def test_atlas_on_the_synthetic_store_matches_its_closed_forms(tmp_path):
    """The atlas of a store built from closed forms (analyses.synthetic): no model involved."""
    from analyses.synthetic import DEFAULT_MODELS, TOWER_NORM, sample_factor, vision_layer_norm, write_synthetic_store

    model = DEFAULT_MODELS[0]
    store = write_synthetic_store(tmp_path / "syn.zarr", models=(model,), n_samples=3, alphas=(), extra_conditions=())
    data = norm_atlas(workbench.open_store(store.path, model=model.model_id), n_resamples=100)
    c = np.mean([sample_factor(i) for i in range(3)])
    np.testing.assert_allclose(data["vision_layer_norm"].sel(stat="value"), c * vision_layer_norm(np.arange(2)), rtol=1e-5)
    np.testing.assert_allclose(float(data["vision_norm"].sel(stat="value")), c * TOWER_NORM, rtol=1e-5)
    np.testing.assert_allclose(float(data["input_ratio"].sel(stat="value")), model.ratio, rtol=1e-5)
    np.testing.assert_allclose(float(data["table_mean"]), model.table().mean(), rtol=1e-6)
    low, high = float(data["vision_norm"].sel(stat="ci_low")), float(data["vision_norm"].sel(stat="ci_high"))
    assert low < c * TOWER_NORM < high  # the samples differ (c_i), so the CI has width
