"""Steering along a stored probe (`add` with `direction: {probe: STORE, label: FIELD, layer: L, class: C}`):
the vector the intervention adds is the probe's unit weight vector at that layer (checked against
`probe.probe_direction` and scikit-learn fitted by hand on the same arrays); the steered residual
stream equals the baseline's with factor × direction added at the steered positions and layer, as
plain PyTorch hooks compute it; the vector travels by value (a pickled plan needs no store); a
reference to nothing stored is refused naming its field (exit 2); and, end to end, a tiny model
probed and steered along the probe, with `compare` measuring the effect on the answer."""

from __future__ import annotations

import pickle
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import workbench
from analyses import compare, probe
from analyses.synthetic import write_probe_store
from analyses.tables import open_models
from support.traces import SAMPLE, hooked, modules, plan_for, run
from workbench.cli import main
from workbench.interventions.add import Add
from workbench.models.model import model_info
from workbench.plan import compile_plan
from workbench.spec import SpecError, parse_spec

MODEL = "tiny-smolvlm"
LAYER, FACTOR, CLASS = 2, 3.0, "red"


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """A planted-signal store written as the tiny model's (its width and depth), probed for `colour`
    (the probe is cached in the store, where a spec reads it)."""
    info = model_info(MODEL)
    store = write_probe_store(tmp_path_factory.mktemp("steer") / "probed.zarr", n_samples=12, n_layers=info.n_layers,
                              dim=info.hidden_size, model_id=MODEL).path
    results = probe.probe_results(open_models(store)[MODEL], "colour")
    return store, results


def vision_means(store) -> tuple[np.ndarray, np.ndarray]:
    """Per baseline sample (sorted): the mean of `hidden` over its vision tokens (samples, layers,
    dim), read whole and grouped with pandas, and the sample's colour."""
    ds = workbench.open_store(store, model=MODEL)
    text = lambda name: np.asarray(ds[name].values).astype(object).astype(str)
    hidden = np.asarray(ds["hidden"].values, dtype=np.float64)
    rows = pd.DataFrame({"condition": text("condition"), "sample": text("sample"), "modality": text("modality")})
    rows = rows[(rows.condition == "baseline") & (rows.modality == "vision")]
    samples = sorted(rows["sample"].unique())
    x = np.stack([hidden[rows.index[rows["sample"] == s]].mean(0) for s in samples])
    colour = dict(zip(text("run_sample"), text("run_colour")))
    return x, np.array([colour[s] for s in samples])


def steer_line(store, **direction) -> str:
    fields = {"probe": str(store), "label": "colour", "layer": LAYER, "class": CLASS, **direction}
    ref = ", ".join(f"{k}: {v}" for k, v in fields.items())
    return (f"  steer: {{interventions: [{{kind: add, site: layer, layers: [1], positions: vision, factor: {FACTOR}, "
            f"direction: {{{ref}}}}}]}}")


def test_the_direction_is_the_probes_unit_weight_vector(probed, load_tiny):
    store, results = probed
    plan = plan_for(load_tiny(MODEL), steer_line(store))
    (add,) = plan.condition("steer").interventions
    assert isinstance(add, Add) and add.direction is None and add.probe is not None
    used = np.asarray(add.vector)
    np.testing.assert_allclose(used, probe.probe_direction(results, LAYER, CLASS), rtol=0, atol=1e-12)
    # scikit-learn by hand on the same arrays: the pipeline's coefficient in raw units, class `red`
    # being the second of two (binary: its score is +coef)
    x, y = vision_means(store)
    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=0)).fit(x[:, LAYER], y)
    assert pipe.classes_.tolist() == ["blue", "red"]
    w = pipe[-1].coef_[0] / pipe[0].scale_
    np.testing.assert_allclose(used, w / np.linalg.norm(w), atol=1e-4)
    assert np.isclose(np.linalg.norm(used), 1.0)
    # another class is its own row (binary: the opposite direction)
    blue = plan_for(load_tiny(MODEL), steer_line(store, **{"class": "blue"})).condition("steer").interventions[0]
    np.testing.assert_allclose(np.asarray(blue.vector), -used, atol=1e-6)


def test_steered_stream_is_baseline_plus_factor_times_direction(probed, load_tiny):
    store, _ = probed
    model = load_tiny(MODEL)
    plan = plan_for(model, "  baseline: {}\n" + steer_line(store))
    steered, inputs = run(model, plan, "steer")
    clean, _ = run(model, plan, "baseline")
    v = torch.tensor(plan.condition("steer").interventions[0].vector, dtype=torch.float32)
    vision = np.flatnonzero(inputs["real"].modality == "vision")
    # at the steered layer, exactly the added vector on vision tokens, nothing elsewhere
    added = steered.tokens["hidden"][:, 1] - clean.tokens["hidden"][:, 1]
    np.testing.assert_allclose(added[vision], np.broadcast_to(FACTOR * v.numpy(), added[vision].shape), atol=1e-5)
    np.testing.assert_allclose(np.delete(added, vision, axis=0), 0.0, atol=1e-6)
    np.testing.assert_allclose(steered.tokens["hidden"][:, 0], clean.tokens["hidden"][:, 0], atol=1e-6)

    # the whole stream against plain PyTorch: a pre-hook on decoder layer 1 adds the same vector
    def add_vision(module, args, kwargs):
        if args:
            x = args[0].clone()
            x[:, vision] += FACTOR * v
            return (x, *args[1:]), kwargs
        x = kwargs["hidden_states"].clone()
        x[:, vision] += FACTOR * v
        return args, {**kwargs, "hidden_states": x}

    layer1 = list(modules(model.hf, model.arch.decoder_layers)[0])[1]
    handle = layer1.register_forward_pre_hook(add_vision, with_kwargs=True)
    try:
        reference, _ = hooked(model, inputs["real"].encoding)
    finally:
        handle.remove()
    np.testing.assert_allclose(steered.tokens["hidden"], reference, atol=1e-5, rtol=0)


def test_the_vector_travels_by_value(probed, load_tiny, tmp_path):
    store, results = probed
    plan = plan_for(load_tiny(MODEL), steer_line(store))
    payload = pickle.dumps(plan.condition("steer"))
    moved = tmp_path / "elsewhere.zarr"
    shutil.copytree(store, moved)
    shutil.rmtree(store)                    # the store is gone where the plan is unpickled
    try:
        (add,) = pickle.loads(payload).interventions
        np.testing.assert_allclose(add.vector, probe.probe_direction(results, LAYER, CLASS), atol=1e-12)
    finally:
        shutil.copytree(moved, store)


@pytest.mark.parametrize("change, field, phrase", [
    ({"label": "shape"}, "direction.label", "holds no probe of it (probed: 'colour')"),
    ({"layer": 9}, "direction.layer", "expected one of the layers probed (0, 1, 2, 3)"),
    ({"class": "green"}, "direction.class", "expected one of 'blue', 'red'"),
    ({"group": "pixels"}, "direction.group", "expected one of 'vision', 'text', 'boundary', 'last', 'pooled'"),
    ({"probe": "/nonexistent/store.zarr"}, "direction.probe", "no store there"),
])
def test_a_reference_to_nothing_stored_is_refused_naming_its_field(probed, tmp_path, capsys, change, field, phrase):
    store, _ = probed
    text = f"""\
name: t
models: [{MODEL}]
conditions:
{steer_line(store, **change)}
capture: [{{site: layer}}]
store: {{path: {tmp_path / 'out.zarr'}}}
"""
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    (problem,) = err.value.problems
    assert problem.field == f"conditions.steer.interventions[0].{field}" and phrase in problem.message, problem
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    assert main(["validate", str(spec)]) == 2
    assert f"interventions[0].{field}: " in capsys.readouterr().err


def test_a_probe_of_another_model_is_refused(probed):
    store, _ = probed
    text = f"name: t\nmodels: [tiny-qwen3vl]\nconditions:\n{steer_line(store)}\ncapture: [{{site: layer}}]\n" \
           "store: {path: unused.zarr}\n"
    with pytest.raises(SpecError, match=r"direction\.probe: tiny-qwen3vl: a probe of tiny-smolvlm's activations; expected one of "
                                        r"tiny-qwen3vl's"):
        compile_plan(parse_spec(text), model_info("tiny-qwen3vl"))


SPEC = """\
name: steer-e2e
models: [{model}]
data: {{source: builtin, n: 8}}
conditions:
  baseline: {{}}
{steer}
capture: [{{site: layer}}, {{site: logits}}]
store: {{path: {store}}}
"""


@pytest.mark.slow
def test_probe_then_steer_then_compare_end_to_end(tmp_path, capsys, load_tiny):
    """Probe a tiny model's own store for the sample's category, steer along the probe of `color` at
    layer 1 in a second run into the same store, and read the effect on the answer with `compare`."""
    store = tmp_path / "study.zarr"
    first = tmp_path / "baseline.yaml"
    first.write_text(SPEC.format(model=MODEL, steer="", store=store))
    assert main(["run", str(first), "--no-progress", "--no-table"]) == 0
    assert main(["analyze", str(store), "probe", "--label", "category"]) == 0
    assert "Linear probes of 'category'" in capsys.readouterr().out
    steer = ("  steer: {interventions: [{kind: add, site: layer, layers: [1], positions: vision, factor: 8, "
             f"direction: {{probe: {store}, label: category, layer: 1, class: color}}}}]}}")
    second = tmp_path / "steer.yaml"
    second.write_text(SPEC.format(model=MODEL, steer=steer, store=store))
    assert main(["run", str(second), "--no-progress", "--no-table"]) == 0
    ds = workbench.open_store(store, model=MODEL)
    results = probe.probe_results(open_models(store)[MODEL], "category")
    v = probe.probe_direction(results, 1, "color")
    # in the store: the steered layer-1 vision tokens moved by exactly 8 v from the baseline's
    conditions = np.asarray(ds["condition"].values).astype(object).astype(str)
    modality = np.asarray(ds["modality"].values).astype(object).astype(str)
    hidden = ds["hidden"].sel(layer=1).values
    at = lambda c: (conditions == c) & (modality == "vision")
    np.testing.assert_allclose(hidden[at("steer")] - hidden[at("baseline")], np.broadcast_to(8 * v, hidden[at("steer")].shape),
                               atol=1e-4)
    delta = compare.answer_logprob_delta(ds, "baseline", per_sample=True)
    assert np.isfinite(delta.sel(condition="steer").values).all() and (delta.sel(condition="steer") != 0).any()
    assert main(["analyze", str(store), "compare", "--resamples", "50"]) == 0
    printed = capsys.readouterr().out
    assert "steer" in printed and "answer" in printed
