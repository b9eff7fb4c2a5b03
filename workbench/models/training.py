"""Trained tiny VLMs: the tiny SmolVLM2 and Qwen3-VL models (the real transformers classes, random
weights from `tiny.py` redrawn at a fan-in scale, `fan_in_init`) trained on the built-in synthetic
task (colour, shape, count, position) by plain PyTorch, staged as a VLM's recipe usually is:

1. `tower`: the vision tower and the projector learn what each vision token covers in the scene
   (`scene_targets`: the object's colour and kind, its centroid, how many copies of it the image
   holds, where the token is and where its object stands against the others, within what the
   token's view of the image shows), as a real VLM starts from a tower pre-trained on images; the
   forward stops at the language model's input, which is all this stage trains;
2. `vocab`: the language model alone learns the answer vocabulary from the questions without images
   (it can reach the right kind of answer, not the right answer);
3. `align`: the projector alone maps the tower into the LLM;
4. `finetune`: every weight, on every category.

The scene targets stay in the loss of every stage with images (a linear head on the vision tokens
the language model receives, not part of the saved model), so the fine-tune keeps the tower's
objects apart while the answer is learned. Every stage's learning rate warms up over 20 steps and
falls along a cosine (`_schedule`); a batch holds images of one size (`_Batches._buckets`).

SmolVLM is trained with 64 px tiles (`retile`): at the tiny model's 32 px the shapes are cut
across tiles and its tower cannot tell them apart.

The tokenizer is the tiny model's byte-level one plus each answer word as one added token, so the
answer is one token then the end of the turn: greedy decoding of a single step is scored.
Training uses built-in samples of seeds `TRAIN_SEEDS` only; seed 0 (a spec's default `builtin`) is
held out. Checkpoints are saved along the stages under `checkpoints/step-NNNN/`, each a complete
checkpoint directory with `trained_model.json` (its step, stage and the stage boundaries); the
model directory itself is the last step's checkpoint.

Deterministic from the seed: the random init (`tiny.py`), the sample order and the dropout-free
forward are seeded, and training runs on the recipe's fixed number of CPU threads (float
reductions do not depend on anything else).
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..data import CATEGORIES, COLORS, RELATIONS, SHAPES, Sample, SceneObject, builtin_scene
from .scene_targets import (LanguageModelInputs, SceneHead, StopAtLanguageModel, token_targets, vision_boxes,
                            vision_views)
from .refs import TRAINED_MODEL_NAMES, parse_trained_ref

TRAINING_FILE = "trained_model.json"
# each answer word one added (non-special) token; the counts 1..4 are single bytes already
ANSWER_WORDS = (*sorted(COLORS), *SHAPES, *RELATIONS)
# the words of the built-in questions (data.py's formats), each one token with its leading space, so
# a question is ~25 tokens instead of ~120 bytes: ~4x less compute per training step
QUESTION_WORDS = ("Answer", "How", "Is", "What", "a", "are", "color", "circles", "image", "in", "is", "many",
                  "number", "object", "of", "one", "or", "shape", "squares", "the", "to", "triangles", "with",
                  "word", *ANSWER_WORDS)
VOCAB_SIZE = 384  # embedding rows: 256 bytes + the family's special tokens + the words above, padded
TRAIN_SEEDS = (1001, 1002, 1003, 1004)  # never 0: the built-in default is the held-out set


@dataclass(frozen=True)
class Stage:
    name: str  # tower | vocab | align | finetune
    steps: int
    lr: float
    images: bool  # the prompts carry their image
    categories: tuple[str, ...] = CATEGORIES  # the built-in categories it trains on


@dataclass(frozen=True)
class Recipe:
    base: str  # the tiny model it starts from
    stages: tuple[Stage, ...]
    n_train: int = 4096  # samples per training seed
    batch: int = 32
    checkpoint_every: int = 500
    # SmolVLM's tile side in px, where it differs from the tiny model's (`retile`)
    tile: int | None = None
    # CPU threads, fixed per recipe so the weights do not depend on the machine's cores. SmolVLM's
    # step takes 0.20 s on one thread and 0.12 s on two; Qwen3-VL's 0.14 s and 0.125 s (its tower
    # attends image by image, a loop of small ops: transformers 5.25 Qwen3VLVisionAttention splits
    # the batch per image outside flash attention), so it keeps one.
    threads: int = 1

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    def boundaries(self) -> list[dict[str, Any]]:
        """[{stage, start, end}] in steps (end exclusive)."""
        out, start = [], 0
        for stage in self.stages:
            out.append({"stage": stage.name, "start": start, "end": start + stage.steps})
            start += stage.steps
        return out


def _stages(tower: int, finetune: int) -> tuple[Stage, ...]:
    return (Stage("tower", tower, 3e-3, images=True), Stage("vocab", 50, 3e-3, images=False),
            Stage("align", 150, 3e-3, images=True), Stage("finetune", finetune, 3e-3, images=True))


# The steps fill about 13 minutes of each build on this 2-core machine (docs/families.md); the
# held-out accuracy still rises at the end of either fine-tune.
RECIPES: dict[str, Recipe] = {
    # its two-layer tower learns the scene slowly: a longer tower stage, whose steps run no LLM forward
    "tiny-smolvlm-trained": Recipe(base="tiny-smolvlm", stages=_stages(1000, 5000), tile=64, threads=2),
    "tiny-qwen3vl-trained": Recipe(base="tiny-qwen3vl", stages=_stages(400, 5000)),
}


Scene = tuple[Sample, list[SceneObject]]


class _Batches:
    """Fixed, pre-encoded batches (the processor runs once per sample), each with the positions whose
    next token is trained (the answer word, then the end of the turn) and, with images, every vision
    token's scene targets (`scene_targets.token_targets`, in the order of the image tokens)."""

    def __init__(self, model_dir: Path, scenes: list[Scene], batch: int, images: bool, rng: random.Random):
        from .model import InputEncoder, model_info

        info = model_info(str(model_dir))
        self.encoder = InputEncoder(info)
        tok = self.encoder.tokenizer
        self.eos = tok.convert_tokens_to_ids(tok.eos_token)
        self._geometry: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.rows = self._buckets(scenes, batch, images, rng)  # each batch's indices into `scenes`
        self.batches = [self._encode([scenes[i] for i in rows], images) for rows in self.rows]

    @staticmethod
    def _buckets(scenes: list[Scene], batch: int, images: bool, rng: random.Random) -> list[list[int]]:
        """Batches of sample indices, each drawn from the samples of one image size when the
        prompts carry images: a batch is padded to its longest prompt, and the number of vision
        tokens follows the size (16 to 64 for Qwen3-VL), so mixed sizes pad a third of every
        batch. The samples of a size are shuffled, and the remainder under a full batch dropped."""
        groups: dict[tuple[int, int] | None, list[int]] = {}
        for i, (sample, _) in enumerate(scenes):
            key = sample.image.size if images and sample.image is not None else None
            groups.setdefault(key, []).append(i)
        out = []
        for key in sorted(groups, key=str):
            rows = groups[key]
            rng.shuffle(rows)
            out += [rows[j:j + batch] for j in range(0, len(rows) - batch + 1, batch)]
        return out

    def _prompt(self, images: bool) -> tuple[str, str]:
        """The chat template around a question, rendered once (jinja per sample costs ~20 ms)."""
        marker = "\x00QUESTION\x00"
        content: list[dict[str, Any]] = [{"type": "image"}] if images else []
        content.append({"type": "text", "text": marker})
        text = self.encoder.processor.apply_chat_template([{"role": "user", "content": content}],
                                                          add_generation_prompt=True, tokenize=False)
        before, after = text.split(marker)
        return before, after

    def _encode(self, scenes: list[Scene], images: bool) -> dict[str, torch.Tensor]:
        enc = self.encoder
        samples = [sample for sample, _ in scenes]
        tok = enc.tokenizer
        before, after = self._prompt(images)
        texts = [before + s.question + after + (s.answer or "") + tok.eos_token for s in samples]
        pics = [[s.image] if enc.arch.nest_images else s.image for s in samples]
        tok.padding_side = "right"
        if images:
            out = enc.processor(text=texts, images=pics, return_tensors="pt", padding=True)
        else:
            out = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        batch = {k: v for k, v in out.items() if isinstance(v, torch.Tensor) and k not in enc.arch.drop_keys}
        lengths = batch["attention_mask"].sum(1)
        rows = torch.arange(len(samples))
        # logits at position p predict token p+1: the answer word at len-2, the end of turn at len-1
        batch["target_rows"] = torch.cat([rows, rows])
        batch["target_pos"] = torch.cat([lengths - 3, lengths - 2])
        batch["targets"] = torch.cat([batch["input_ids"][rows, lengths - 2], batch["input_ids"][rows, lengths - 1]])
        assert (batch["targets"][len(samples):] == self.eos).all(), "each answer must be one token"
        if "pixel_values" in batch:  # held at half the bytes (~5 GB for SmolVLM's 64 px tiles): `_loss` widens them
            batch["pixel_values"] = batch["pixel_values"].to(torch.bfloat16)
        if images:
            batch["scene"] = torch.from_numpy(np.concatenate([self._scene_targets(*scene) for scene in scenes]))
        return batch

    def _scene_targets(self, sample: Sample, objects: list[SceneObject]) -> np.ndarray:
        """The targets of the sample's vision tokens, placed by the workbench's patch geometry of
        the question's prompt (the same image tokens as the trained prompt, which adds the answer)."""
        assert sample.image is not None
        return token_targets(sample.image.size, objects, *self._places(sample.image, sample.question))

    def _places(self, image: Image.Image, question: str) -> tuple[np.ndarray, np.ndarray]:
        """The vision tokens' pixel boxes and views, once per image size: the two trained families'
        processors place the tokens by the image's size alone (the built-in set has nine), so the
        prompt is encoded a second time for 9 samples, not for all 16,384."""
        if image.size not in self._geometry:
            inputs = self.encoder.encode(image, question)
            assert inputs.geometry is not None, "a trained family keeps patch geometry"
            self._geometry[image.size] = (vision_boxes(inputs.geometry, inputs.modality),
                                          vision_views(inputs.geometry, inputs.modality))
        return self._geometry[image.size]


def word_tokenizer(model_dir: Path, model: Any) -> None:
    """Add the answer words (bare: an answer follows the prompt directly) and the question words
    (after a space; the first words bare too) to the saved tokenizer as single tokens, and grow the
    model's embedding rows to `VOCAB_SIZE`. Added tokens match longest first (tokenizers 0.22
    AddedVocabulary), so " red" wins over "red" after a space."""
    from tokenizers import AddedToken

    from .tinykit import load_tokenizer

    tok = load_tokenizer(model_dir)
    words = dict.fromkeys([*ANSWER_WORDS, "What", "How", "Is", *(f" {w}" for w in QUESTION_WORDS)])
    tok.add_tokens([AddedToken(w, normalized=False, special=False) for w in words])
    if len(tok) > VOCAB_SIZE:
        raise ValueError(f"{len(tok)} tokens do not fit the {VOCAB_SIZE} embedding rows")
    tok.save_pretrained(model_dir)
    model.resize_token_embeddings(VOCAB_SIZE, mean_resizing=False)
    model.save_pretrained(model_dir, safe_serialization=True)


def retile(model_dir: Path, tile: int) -> None:
    """Give a tiny SmolVLM in `model_dir` tiles of `tile` px (the tower's image size, the
    processor's tile and image_seq_len), its weights redrawn from the new config. At the tiny
    model's 32 px a built-in shape (12-24 px) is cut across tiles and is under a patch in the 32 px
    global view: the tower alone, on one shape per image, stays at chance (40% held out after 300
    steps), where 64 px tiles reach 86%."""
    import transformers

    config = json.loads((model_dir / "config.json").read_text())
    patch, scale = config["vision_config"]["patch_size"], config["scale_factor"]
    edits: dict[str, Callable[[dict[str, Any]], None]] = {
        "config.json": lambda c: c["vision_config"].update(image_size=tile),
        "preprocessor_config.json": lambda c: c["max_image_size"].update(longest_edge=tile),
        "processor_config.json": lambda c: c.update(image_seq_len=(tile // patch) ** 2 // scale**2),
    }
    for name, edit in edits.items():
        path = model_dir / name
        content = json.loads(path.read_text())
        edit(content)
        path.write_text(json.dumps(content, indent=2) + "\n")
    config_obj = transformers.AutoConfig.from_pretrained(model_dir)
    transformers.SmolVLMForConditionalGeneration(config_obj).save_pretrained(model_dir, safe_serialization=True)


def fan_in_init(model: torch.nn.Module) -> None:
    """Redraw every linear, convolution and embedding weight from N(0, 1/fan_in) (biases zero; the
    norms keep their ones). transformers draws them from N(0, initializer_range=0.02), a scale made
    for hidden sizes in the thousands: at the tiny models' 32-64 every layer starts ~6x too small,
    the attention is uniform, and the image moves the answer position by ~1% of its norm, so a
    fine-tune sits at the answer prior for hundreds of steps. From the caller's seeded generator."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv3d)):
                module.weight.normal_(0.0, module.weight[0].numel() ** -0.5)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, torch.nn.Embedding):
                module.weight.normal_(0.0, module.weight.shape[1] ** -0.5)


def _trainable(model: torch.nn.Module, stage: str, arch: Any) -> list[torch.nn.Parameter]:
    """The parameters a stage trains: the tower and projector, the LM (embeddings, decoder, head),
    the projector, or all."""
    for p in model.parameters():
        p.requires_grad_(False)
    if stage == "finetune":
        chosen = list(model.parameters())
    elif stage in ("tower", "align"):
        paths = (arch.vision, *arch.projector) if stage == "tower" else arch.projector
        chosen = list(dict.fromkeys(p for path in paths for m in _modules(model, path) for p in m.parameters()))
    else:
        vision = set(id(p) for m in _modules(model, arch.vision) for p in m.parameters())
        chosen = [p for p in model.parameters() if id(p) not in vision]
    for p in chosen:
        p.requires_grad_(True)
    return chosen


def _modules(model: torch.nn.Module, path: str) -> list[torch.nn.Module]:
    """The modules at a dotted path; `*` expands a ModuleList (as the workbench's sites do)."""
    found = [model]
    for part in path.split("."):
        found = [c for m in found for c in m.children()] if part == "*" else [getattr(m, part) for m in found]
    return found


def _loss(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = {k: v for k, v in batch.items() if k not in ("target_rows", "target_pos", "targets", "scene")}
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].float()
    # the head on the trained positions only (the model's forward would project every position)
    hidden = model.model(**inputs).last_hidden_state[batch["target_rows"], batch["target_pos"]]
    logits = model.lm_head(hidden)
    loss = torch.nn.functional.cross_entropy(logits.float(), batch["targets"])
    return loss, (logits.argmax(-1) == batch["targets"]).float().mean()


def _llm_inputs(model: Any, batch: dict[str, torch.Tensor], lm_inputs: LanguageModelInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward up to the language model's input (which `lm_inputs` keeps); NaN for the answer's
    loss and accuracy, which it does not reach."""
    lm_inputs.stop = True
    try:
        _loss(model, batch)
    except StopAtLanguageModel:
        pass
    finally:
        lm_inputs.stop = False
    nan = torch.tensor(float("nan"))
    return nan, nan


def _number(value: torch.Tensor) -> float | None:
    number = float(value.detach())
    return None if number != number else number  # NaN: JSON has none


def _save_checkpoint(model: Any, src: Path, out: Path, meta: dict[str, Any]) -> None:
    out.mkdir(parents=True)
    for f in src.iterdir():  # tokenizer, processor and chat template files
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in ("config.json", TRAINING_FILE):
            shutil.copy2(f, out / f.name)
    model.save_pretrained(out, safe_serialization=True)
    (out / TRAINING_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def _schedule(steps: int) -> Callable[[int], float]:
    """The learning-rate factor: a 20-step warm-up, then a cosine from 1 to 2% at the stage's end
    (Loshchilov & Hutter 2017, SGDR; without restarts). Held-out accuracy rises late in the
    fine-tune, as the rate falls: 0.79 after a 4,400-step cosine, 0.705 after the linear decay of the
    same length, one Qwen3-VL run each."""
    def factor(i: int) -> float:
        return min(1.0, (i + 1) / 20) * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * i / steps)))
    return factor


def _cycle(batches: list[dict[str, torch.Tensor]], rng: random.Random) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        order = list(range(len(batches)))
        rng.shuffle(order)
        yield from (batches[i] for i in order)


def train(name: str, out_dir: Path, seed: int, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Build trained tiny model `name` into `out_dir`: the base tiny model's random weights (seed),
    the answer-word tokenizer, then the recipe's stages; returns the training record."""
    import transformers

    from .architectures import family as _family
    from .tiny import TINY_MODELS, _FAMILY

    recipe = RECIPES[name]
    arch: Any = _family(_FAMILY[recipe.base])
    base = out_dir / "base"
    base.mkdir(parents=True)
    TINY_MODELS[recipe.base](base, seed)
    started, cpu_started = time.perf_counter(), time.process_time()
    transformers.utils.logging.disable_progress_bar()  # a checkpoint's "Writing model shards" bar
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if recipe.tile is not None:
                retile(base, recipe.tile)
            model = getattr(transformers, arch.model_class).from_pretrained(base, attn_implementation="eager")
            word_tokenizer(base, model)
            fan_in_init(model)
            model.train()
            rng = random.Random(f"workbench.trained/{name}/{seed}")
            scenes = [builtin_scene(i, sd) for sd in TRAIN_SEEDS for i in range(recipe.n_train)]
            head = SceneHead(model.config.get_text_config().hidden_size)
            lm_inputs = LanguageModelInputs(model)
            history: list[dict[str, Any]] = []
            meta = {"name": name, "base": recipe.base, "seed": seed, "stages": recipe.boundaries(),
                    "train_seeds": list(TRAIN_SEEDS), "answer_words": list(ANSWER_WORDS)}
            step = 0
            ckpt = out_dir / "checkpoints"

            def checkpoint(stage: str) -> None:
                _save_checkpoint(model, base, ckpt / f"step-{step}", {**meta, "step": step, "stage": stage})

            checkpoint(recipe.stages[0].name)
            encoded: dict[tuple[bool, tuple[str, ...]], _Batches] = {}  # each kind encoded once
            for stage in recipe.stages:
                key = (stage.images, stage.categories)
                if key not in encoded:
                    chosen = [s for s in scenes if s[0].category in stage.categories]
                    encoded[key] = _Batches(base, chosen, recipe.batch, stage.images, rng)
                data = encoded[key]
                params = _trainable(model, stage.name, arch) + list(head.parameters())
                opt = torch.optim.AdamW(params, lr=stage.lr, weight_decay=0.0)
                sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(stage.steps))
                batches = _cycle(data.batches, rng)
                end = step + stage.steps
                for _ in range(stage.steps):
                    batch = next(batches)
                    if stage.name == "tower":
                        loss, acc = _llm_inputs(model, batch, lm_inputs)
                    else:
                        loss, acc = _loss(model, batch)
                    scene = (head.loss(lm_inputs.vision(batch["input_ids"], model.config.image_token_id), batch["scene"])
                             if stage.images else torch.zeros(()))
                    opt.zero_grad()
                    (scene if stage.name == "tower" else loss + scene).backward()
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    opt.step()
                    sched.step()
                    step += 1
                    # the answer's loss and accuracy: null in the tower stage, which does not reach it
                    history.append({"step": step, "stage": stage.name, "loss": _number(loss), "accuracy": _number(acc),
                                    "scene_loss": _number(scene)})
                    if log is not None and step % 50 == 0:
                        log(f"{name} {stage.name} step {step}: loss {float(loss.detach()):.3f} acc {float(acc):.2f} "
                            f"scene loss {float(scene.detach()):.3f}")
                    if step % recipe.checkpoint_every == 0 or step == end:  # and at every stage's end
                        checkpoint(stage.name)
            lm_inputs.remove()
    finally:
        torch.set_num_threads(threads)
    record = {**meta, "step": step, "stage": recipe.stages[-1].name, "history": history,
              "build_seconds": round(time.perf_counter() - started, 1),
              "build_cpu_seconds": round(time.process_time() - cpu_started, 1)}
    return record


# --------------------------------------------------------------------------- names and the cache

_VERSION = "v4"  # bump when a recipe or the training code changes: stale builds are never reused
_DEFAULT_SEED = 0
assert tuple(RECIPES) == TRAINED_MODEL_NAMES  # refs.py names them without importing torch


def trained_model_dir(name: str, root: Path | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Directory of trained model `name` (``<root>/<name>-v1``, root as for the tiny models),
    trained on first use and cached like them (`tiny.cached_build`). It is the last step's
    checkpoint, with every checkpoint under ``checkpoints/step-N/`` and the training record
    (stages, loss per step, build time) in `trained_model.json`."""
    from .tiny import _default_root, cached_build

    if name not in RECIPES:
        raise KeyError(f"unknown trained model {name!r}; known: {sorted(RECIPES)}")
    root = Path(root).expanduser() if root is not None else _default_root()

    def build(tmp: Path) -> None:
        record = train(name, tmp, _DEFAULT_SEED, log)
        last = tmp / "checkpoints" / f"step-{record['step']}"
        for f in last.iterdir():
            shutil.copy2(f, tmp / f.name)
        (tmp / TRAINING_FILE).write_text(json.dumps(record, indent=1) + "\n")
        shutil.rmtree(tmp / "base")

    marker = {"name": name, "version": _VERSION, "seed": _DEFAULT_SEED, "family": RECIPES[name].base}
    return cached_build(root / f"{name}-{_VERSION}", build, marker)


def checkpoint_steps(name: str, root: Path | None = None) -> list[int]:
    """The steps of `name`'s saved checkpoints, ascending (building the model if need be)."""
    found = (trained_model_dir(name, root) / "checkpoints").glob("step-*")
    return sorted(int(p.name.removeprefix("step-")) for p in found)


def trained_checkpoint_dir(ref: str, root: Path | None = None) -> Path:
    """The directory a trained-model reference names: the model, or one checkpoint (`@step-N`).
    KeyError naming the saved steps for a step that was not saved."""
    parsed = parse_trained_ref(ref)
    if parsed is None:
        raise KeyError(f"{ref!r} names no trained model; known: {', '.join(RECIPES)} (optionally @step-N)")
    name, step = parsed
    model = trained_model_dir(name, root)
    if step is None:
        return model
    path = model / "checkpoints" / f"step-{step}"
    if not path.is_dir():
        steps = ", ".join(str(s) for s in checkpoint_steps(name, root))
        raise KeyError(f"{name} has no checkpoint at step {step}; saved steps: {steps}")
    return path


def main() -> None:
    """`python -m workbench.models.training`: build (or find cached) every trained model, printing
    where it is and how long its build took (wall and CPU seconds, from its record)."""
    for name in RECIPES:
        directory = trained_model_dir(name, log=print)
        record = json.loads((directory / TRAINING_FILE).read_text())
        print(f"{name}: {directory} (built in {record['build_seconds']} s, {record['build_cpu_seconds']} CPU s, "
              f"{record['step']} steps)")


if __name__ == "__main__":
    main()
