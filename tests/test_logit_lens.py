"""The logit-lens capture (site `logit_lens`) equals the lens computed with plain PyTorch: the
residual stream read with forward pre-hooks, then the model's own final norm and LM head called
outside any trace; at the last layer it is the model's own next-token distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from workbench.backends.local import run_condition
from workbench.capture import LENS_TOP_K, CapturePlan, LogitLensCapture
from workbench.models.architectures import tiny_architectures
from workbench.plan import ConditionPlan, ModelPlan

BASELINE = ConditionPlan("baseline", {}, "real", ())


def _inputs(model):
    img = Image.new("RGB", (96, 64), "navy")
    img.paste((250, 200, 0), (10, 10, 50, 40))
    return model.encode(img if model.arch.is_multimodal else None, "What colour is the square?")


def hooked_lens(model, encoding, k):
    """(ids, logprobs) of shape (token, layer 0..L, k) from pre-hooks on every decoder layer and
    the final norm, and the norm and head applied afterwards by plain torch."""
    seen = []
    layers = list(model.hf.get_submodule(model.arch.decoder_layers))
    norm, head = model.hf.get_submodule(model.arch.final_norm), model.hf.get_submodule(model.arch.lm_head)
    hooks = [m.register_forward_pre_hook(lambda m, args: seen.append(args[0][0].detach().clone()))
             for m in layers + [norm]]
    try:
        model.prepare()
        with torch.inference_mode():
            final = model.hf(**encoding).logits[0, -1]
    finally:
        for hook in hooks:
            hook.remove()
    text = model.hf.config.get_text_config()
    scale = getattr(text, "logit_scale", None) or 1.0  # Cohere's, as its forward applies it
    cap = getattr(text, "final_logit_softcapping", None) if model.arch.family == "paligemma" else None

    def logits(h):
        out = head(norm(h)) * scale
        return cap * torch.tanh(out / cap) if cap else out

    with torch.inference_mode():
        top = [torch.topk(torch.log_softmax(logits(h).float(), -1), k, dim=-1) for h in seen]
    ids = torch.stack([t.indices for t in top], dim=1).numpy()
    logprobs = torch.stack([t.values for t in top], dim=1).numpy()
    return ids, logprobs, torch.log_softmax(final.float(), -1).numpy()


@pytest.mark.parametrize("name", [a.tiny for a in tiny_architectures()])
def test_logit_lens_matches_plain_torch(load_tiny, name):
    model = load_tiny(name)
    inputs = _inputs(model)
    layers = tuple(range(model.n_layers + 1))
    plan = ModelPlan(model.info, [], CapturePlan(outputs=(LogitLensCapture(layers),)))
    stored = run_condition(model, {"real": inputs}, BASELINE, plan).tokens
    ids, logprobs, final = hooked_lens(model, inputs.encoding, LENS_TOP_K)
    assert stored["lens_ids"].shape == (inputs.n_tokens, len(layers), LENS_TOP_K)
    np.testing.assert_allclose(stored["lens_logprobs"], logprobs, atol=1e-5, rtol=0)
    # ids: equal wherever the k-th and (k+1)-th are not tied within float noise
    agree = (stored["lens_ids"] == ids).mean()
    assert agree > 0.99, agree
    # at the last layer the lens is the model's own next-token distribution (its logits)
    order = np.argsort(-final, kind="stable")[:LENS_TOP_K]
    np.testing.assert_allclose(stored["lens_logprobs"][-1, -1], final[order], atol=1e-5)
    assert stored["lens_ids"][-1, -1, 0] == order[0]
    # the lens changes with depth: layer 0 is not already the final prediction everywhere
    assert (stored["lens_ids"][:, 0, 0] != stored["lens_ids"][:, -1, 0]).any()


# -- the analysis (analyses.lens, table logit-lens, figure lens_curves) on a stored run ----------

LENS_MODELS = ("tiny-smolvlm", "tiny-qwen3vl")


@pytest.fixture(scope="module")
def lens_store(tmp_path_factory, workbench_cache):
    from workbench.runner import run_spec
    from workbench.spec import parse_spec

    store = tmp_path_factory.mktemp("lens") / "lens.zarr"
    run_spec(parse_spec(f"""\
name: lens
models: [{", ".join(LENS_MODELS)}]
data: {{source: builtin, n: 3}}
conditions: {{baseline: {{}}}}
capture: [{{site: logit_lens}}, {{site: logits}}]
backend: {{dtype: float32, device: cpu}}
store: {{path: {store}}}
"""), progress=False, log=lambda _: None)
    return store


def _labels(ds, name):
    return np.asarray(ds[name].values).astype(object).astype(str)


@pytest.mark.parametrize("name", LENS_MODELS)
def test_lens_analysis_equals_numpy(lens_store, name):
    import workbench
    from analyses.bootstrap import bootstrap_array
    from analyses.lens import logit_lens

    ds = workbench.open_store(lens_store, model=name)
    ids, logprobs = np.asarray(ds["lens_ids"].values), np.asarray(ds["lens_logprobs"].values, np.float64)
    modality, samples = _labels(ds, "modality"), _labels(ds, "sample")
    # the stored lens at the last layer, last prompt position, is the stored step-0 prediction
    first = np.flatnonzero(samples == sorted(set(samples))[0])
    assert ids[first[-1], -1, 0] == ds["generated"].values[0, 0]
    per_sample = logit_lens(ds, per_sample=True)
    summary = logit_lens(ds, n_resamples=100, seed=1)
    for group in ("vision", "text"):
        agree, prob = [], []
        for sample in sorted(set(samples)):
            rows = (modality == group) & (samples == sample)
            agree.append((ids[rows, :, 0] == ids[rows, -1:, 0]).mean(0))
            prob.append(np.exp(logprobs[rows, :, 0]).mean(0))
        for measure, expected in (("agreement", np.stack(agree, -1)), ("top1_prob", np.stack(prob, -1))):
            got = per_sample[measure].sel(condition="baseline", modality=group).values
            np.testing.assert_allclose(got, expected, rtol=1e-10)
            np.testing.assert_allclose(summary[measure].sel(condition="baseline", modality=group).values,
                                       bootstrap_array(expected, n_resamples=100, seed=1), rtol=1e-10)
    assert (per_sample["agreement"].sel(layer=int(ds["layer"].values[-1])) == 1).all()


def test_lens_table_figure_and_cli(lens_store, tmp_path, capsys):
    import workbench
    from analyses.builtin.logit_lens import lens_curves
    from analyses.tables import Options, build_tables, open_models
    from workbench.cli import main

    table = build_tables(lens_store, ["logit-lens"], Options(n_resamples=50))[0]
    assert not table.skipped
    for model in LENS_MODELS:
        layers = workbench.open_store(lens_store, model=model).sizes["layer"]
        assert [r[1] for r in table.rows if r[0] == model] == [str(l) for l in range(layers)]
    figure = lens_curves(open_models(lens_store), Options(n_resamples=50), tmp_path)
    assert figure.skipped is None and figure.path.stat().st_size > 0
    capsys.readouterr()
    assert main(["analyze", str(lens_store), "logit-lens"]) == 0
    assert "top-1 = final" in capsys.readouterr().out
    skipped = build_tables(lens_store, ["update-decomposition"])[0]
    assert "attn_out" in skipped.skipped
