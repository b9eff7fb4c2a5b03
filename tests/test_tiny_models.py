"""Tiny random-weight models: build, save, reload offline, process (image, question), forward."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here must work without the hub

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from safetensors.torch import load_file

from workbench.models.tiny import (
    LLAMA_SPECIAL_TOKENS,
    QWEN3VL_SPECIAL_TOKENS,
    SMOLVLM_CHAT_TEMPLATE,
    SMOLVLM_SPECIAL_TOKENS,
    TINY_MODELS,
    load_processor,
    tiny_model_dir,
)

FAMILY = {"tiny-smolvlm": "smolvlm", "tiny-qwen3vl": "qwen3vl", "tiny-llama": "llama"}
ARCH = {
    "tiny-smolvlm": "SmolVLMForConditionalGeneration",
    "tiny-qwen3vl": "Qwen3VLForConditionalGeneration",
    "tiny-llama": "LlamaForCausalLM",
}
SPECIALS = {
    "tiny-smolvlm": SMOLVLM_SPECIAL_TOKENS,
    "tiny-qwen3vl": QWEN3VL_SPECIAL_TOKENS,
    "tiny-llama": LLAMA_SPECIAL_TOKENS,
}
VLMS = ["tiny-smolvlm", "tiny-qwen3vl"]
QUESTION = "What is in the image?"


def _image(width=96, height=64, seed=0):
    """A non-square, non-uniform RGB image (never all-zero: zero SmolVLM tiles count as padding)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))


def _image_messages():
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]


def _text_messages():
    return [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-models")
    return {name: tiny_model_dir(name, root) for name in FAMILY}


@pytest.fixture(scope="module")
def loaded(dirs):
    """name -> (model, processor), reloaded from disk the way a real checkpoint is."""
    out = {}
    for name, d in dirs.items():
        config = transformers.AutoConfig.from_pretrained(d)
        model_cls = getattr(transformers, config.architectures[0])
        model = model_cls.from_pretrained(d, attn_implementation="eager").eval()
        out[name] = (model, load_processor(d, FAMILY[name]))
    return out


def _encode(name, processor, image=None, images_nested=True):
    if FAMILY[name] == "llama":
        text = processor.apply_chat_template(_text_messages(), add_generation_prompt=True, tokenize=False)
        # The template already starts with BOS; the tokenizer would add a second one.
        return processor(text, add_special_tokens=False, return_tensors="pt")
    if image is None:
        text = processor.apply_chat_template(_text_messages(), add_generation_prompt=True, tokenize=False)
        return processor(text=text, return_tensors="pt")
    text = processor.apply_chat_template(_image_messages(), add_generation_prompt=True, tokenize=False)
    images = [[image]] if images_nested else [image]
    return processor(text=text, images=images, return_tensors="pt")


def _vocab_size(model):
    return model.config.get_text_config().vocab_size


# --------------------------------------------------------------------------------------------
# Build and reload
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(FAMILY))
def test_checkpoint_layout_and_config(dirs, name):
    d = dirs[name]
    files = {p.name for p in d.iterdir()}
    expected = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert expected <= files
    if name in VLMS:
        assert "preprocessor_config.json" in files
    config = transformers.AutoConfig.from_pretrained(d)
    assert config.architectures == [ARCH[name]]
    text = config.get_text_config()
    assert text.hidden_size == 64 and text.num_attention_heads == 4 and text.num_key_value_heads == 2
    assert text.vocab_size >= len(load_processor(d, "llama"))  # "llama" = tokenizer only


@pytest.mark.parametrize("name", list(FAMILY))
def test_special_tokens_are_single_ids_and_match_config(dirs, name):
    tok = load_processor(dirs[name], "llama")
    for t in SPECIALS[name]:
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1, t
    config = transformers.AutoConfig.from_pretrained(dirs[name])
    if name == "tiny-smolvlm":
        assert config.image_token_id == tok.convert_tokens_to_ids("<image>")
        assert config.vision_config.image_size == 32 and config.scale_factor == 2
    elif name == "tiny-qwen3vl":
        for attr, t in [
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        ]:
            assert getattr(config, attr) == tok.convert_tokens_to_ids(t), attr
        assert len(config.vision_config.deepstack_visual_indexes) < config.text_config.num_hidden_layers
    text = config.get_text_config()
    assert tok.convert_ids_to_tokens(text.pad_token_id) == tok.pad_token


def test_tied_and_untied_heads(loaded):
    smol, _ = loaded["tiny-smolvlm"]
    assert smol.lm_head.weight.data_ptr() != smol.model.text_model.embed_tokens.weight.data_ptr()
    qwen, _ = loaded["tiny-qwen3vl"]
    assert qwen.lm_head.weight.data_ptr() == qwen.model.language_model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("name", list(FAMILY))
def test_reload_reproduces_saved_weights(dirs, loaded, name):
    saved = load_file(dirs[name] / "model.safetensors")
    state = loaded[name][0].state_dict()
    for key, value in saved.items():
        assert torch.equal(state[key], value), key


@pytest.mark.parametrize("name", list(FAMILY))
def test_build_is_deterministic(tmp_path_factory, name):
    a, b, c = (tmp_path_factory.mktemp(f"{name}-{tag}") for tag in "abc")
    rng_before = torch.random.get_rng_state()
    TINY_MODELS[name](a, 0)
    TINY_MODELS[name](b, 0)
    TINY_MODELS[name](c, 1)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the caller's RNG is untouched
    sa, sb, sc = (load_file(d / "model.safetensors") for d in (a, b, c))
    assert sa.keys() == sb.keys() == sc.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


# --------------------------------------------------------------------------------------------
# Processors and forward passes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(FAMILY))
def test_text_only_forward(loaded, name):
    model, processor = loaded[name]
    enc = _encode(name, processor)
    with torch.inference_mode():
        logits = model(**enc).logits
    assert logits.shape == (1, enc["input_ids"].shape[1], _vocab_size(model))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", VLMS)
def test_image_forward(loaded, name):
    model, processor = loaded[name]
    enc = _encode(name, processor, _image())
    with torch.inference_mode():
        out = model(**enc, output_attentions=True)
    n = enc["input_ids"].shape[1]
    assert out.logits.shape == (1, n, _vocab_size(model))
    assert torch.isfinite(out.logits).all()
    # eager attention: probabilities per layer, (B, heads, q, k)
    text = model.config.get_text_config()
    assert len(out.attentions) == text.num_hidden_layers
    assert out.attentions[0].shape == (1, text.num_attention_heads, n, n)


def test_smolvlm_image_splitting(loaded):
    model, processor = loaded["tiny-smolvlm"]
    assert type(processor).__mro__[1] is transformers.SmolVLMProcessor
    assert processor.get_attributes() == ["image_processor", "tokenizer"]
    text = processor.apply_chat_template(_image_messages(), add_generation_prompt=True, tokenize=False)
    assert text == f"<|im_start|>User:<image>{QUESTION}<end_of_utterance>\nAssistant:"

    enc = _encode("tiny-smolvlm", processor, _image(96, 64))
    ids = enc["input_ids"][0].tolist()
    tokens = processor.tokenizer.convert_ids_to_tokens(ids)
    row_col = [t for t in tokens if t.startswith("<row_")]
    # 96x64 -> longest edge 96 -> 3 columns x 2 rows of 32x32 tiles, then the global image
    assert row_col == [f"<row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2, 3)]
    assert tokens.count("<global-img>") == 1
    tiles = len(row_col) + 1
    assert enc["pixel_values"].shape == (1, tiles, 3, 32, 32)
    assert processor.image_seq_len == 4
    assert ids.count(model.config.image_token_id) == tiles * processor.image_seq_len
    # a flat image list gives the same encoding
    flat = _encode("tiny-smolvlm", processor, _image(96, 64), images_nested=False)
    assert torch.equal(flat["input_ids"], enc["input_ids"])
    assert torch.equal(flat["pixel_values"], enc["pixel_values"])


def test_qwen3vl_image_tokens_and_mm_token_type_ids(loaded):
    model, processor = loaded["tiny-qwen3vl"]
    assert isinstance(processor, transformers.Qwen3VLProcessor)
    assert processor.get_attributes() == ["image_processor", "tokenizer"]
    text = processor.apply_chat_template(_image_messages(), add_generation_prompt=True, tokenize=False)
    assert text == (
        f"<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    enc = _encode("tiny-qwen3vl", processor, _image(96, 64))
    ids = enc["input_ids"][0]
    merge = processor.image_processor.merge_size
    n_image = int(enc["image_grid_thw"].prod()) // merge**2
    assert enc["image_grid_thw"].tolist() == [[1, 8, 12]]  # 64x96 px / 8 px patches
    assert 4 <= n_image <= 40
    assert int((ids == model.config.image_token_id).sum()) == n_image
    # the model needs mm_token_type_ids whenever image_grid_thw is passed; the processor emits it,
    # 1 at exactly the image tokens
    assert "mm_token_type_ids" in enc
    assert torch.equal(enc["mm_token_type_ids"][0] == 1, ids == model.config.image_token_id)
    without = {k: v for k, v in enc.items() if k != "mm_token_type_ids"}
    with torch.inference_mode(), pytest.raises(ValueError, match="mm_token_type_ids"):
        model(**without)


@pytest.mark.parametrize("name", list(FAMILY))
def test_generate(loaded, name):
    model, processor = loaded[name]
    enc = _encode(name, processor, _image() if name in VLMS else None)
    if hasattr(model.model, "rope_deltas"):
        model.model.rope_deltas = None  # Qwen3-VL keeps M-RoPE deltas between calls
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, enc["input_ids"].shape[1] + 3)


def test_llama_tokenizer_and_template(loaded):
    _, tok = loaded["tiny-llama"]
    assert isinstance(tok, transformers.PreTrainedTokenizerBase)
    text = tok.apply_chat_template(_text_messages(), add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n")
    assert text.endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    bos = tok.bos_token_id
    assert tok(text, add_special_tokens=False)["input_ids"].count(bos) == 1
    assert tok("hi")["input_ids"][0] == bos  # like Llama 3, the tokenizer prepends BOS itself
    ids = tok.apply_chat_template(_text_messages(), add_generation_prompt=True, tokenize=True, return_dict=True)
    assert ids["input_ids"].count(bos) == 1


# --------------------------------------------------------------------------------------------
# load_processor on other checkpoint layouts (as real checkpoints ship them)
# --------------------------------------------------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_load_processor_legacy_chat_template_json(dirs, tmp_path):
    # SmolVLM2 / Qwen3-VL style: processor template in chat_template.json, extra keys in the image
    # processor config, a video processor config that must be ignored.
    d = _copy(dirs["tiny-smolvlm"], tmp_path / "smol")
    (d / "chat_template.jinja").unlink()
    (d / "chat_template.json").write_text(json.dumps({"chat_template": SMOLVLM_CHAT_TEMPLATE}))
    pp = json.loads((d / "preprocessor_config.json").read_text())
    pp.update(processor_class="SmolVLMProcessor", video_sampling={"fps": 1, "max_frames": 64})
    (d / "preprocessor_config.json").write_text(json.dumps(pp))
    (d / "video_preprocessor_config.json").write_text(json.dumps({"video_processor_type": "SmolVLMVideoProcessor"}))
    processor = load_processor(d, "smolvlm")
    assert processor.chat_template == SMOLVLM_CHAT_TEMPLATE
    assert processor.tokenizer.chat_template is None  # the tokenizer does not read chat_template.json
    text = processor.apply_chat_template(_image_messages(), add_generation_prompt=True)
    assert text.startswith("<|im_start|>User:<image>")


def test_load_processor_template_in_tokenizer_config(dirs, tmp_path):
    d = _copy(dirs["tiny-qwen3vl"], tmp_path / "qwen")
    template = (d / "chat_template.jinja").read_text()
    (d / "chat_template.jinja").unlink()
    (d / "processor_config.json").unlink()
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    processor = load_processor(d, "qwen3vl")
    assert processor.chat_template == template
    enc = _encode("tiny-qwen3vl", processor, _image())
    assert "mm_token_type_ids" in enc


def test_load_processor_smolvlm_image_seq_len(dirs, tmp_path):
    d = _copy(dirs["tiny-smolvlm"], tmp_path / "smol")
    (d / "processor_config.json").unlink()
    assert load_processor(d, "smolvlm").image_seq_len == 4  # from config.json when not saved
    (d / "processor_config.json").write_text(json.dumps({"image_seq_len": 169}))
    with pytest.raises(ValueError, match="image_seq_len"):
        load_processor(d, "smolvlm")


def test_load_processor_errors(dirs):
    with pytest.raises(ValueError, match="family"):
        load_processor(dirs["tiny-smolvlm"], "idefics")
    with pytest.raises(OSError):  # no preprocessor_config.json in a text-only checkpoint
        load_processor(dirs["tiny-llama"], "qwen3vl")


# --------------------------------------------------------------------------------------------
# Cache directory
# --------------------------------------------------------------------------------------------


def test_tiny_model_dir_cached(dirs):
    d = dirs["tiny-llama"]
    assert d.name == "tiny-llama-v2"
    before = (d / "model.safetensors").stat().st_mtime_ns
    assert tiny_model_dir("tiny-llama", d.parent) == d
    assert (d / "model.safetensors").stat().st_mtime_ns == before
    assert not [p for p in d.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left
    with pytest.raises(KeyError):
        tiny_model_dir("tiny-nope", d.parent)


def test_tiny_model_dir_default_root(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    assert tiny_model_dir("tiny-llama") == tmp_path / "models" / "tiny-llama-v2"


@pytest.mark.slow  # minutes of CPU: `make test-slow` (CI runs it)
def test_tiny_model_dir_concurrent_processes(tmp_path):
    code = (
        "import sys; from workbench.models.tiny import tiny_model_dir; "
        "print(tiny_model_dir('tiny-llama', sys.argv[1]))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    assert {out.strip() for out, _ in results} == {str(tmp_path / "tiny-llama-v2")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-llama-v2"]
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "tiny-llama-v2")
    assert model.config.architectures == ["LlamaForCausalLM"]


_HUB_ID_SCRIPT = """
import json, sys
from pathlib import Path
import transformers
from workbench.models.tiny import TINY_MODELS, load_processor

cache, commit = Path(sys.argv[1]), "0" * 40
for name, family in [("tiny-smolvlm", "smolvlm"), ("tiny-qwen3vl", "qwen3vl")]:
    repo = cache / f"models--tiny--{name}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    TINY_MODELS[name](snapshot, 0)
    # the layout of the real checkpoints: the processor's template in a legacy chat_template.json
    template = (snapshot / "chat_template.jinja").read_text()
    (snapshot / "chat_template.jinja").unlink()
    (snapshot / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    processor = load_processor(f"tiny/{name}", family)
    assert processor.chat_template == template, name
    config = transformers.AutoConfig.from_pretrained(f"tiny/{name}")
    getattr(transformers, config.architectures[0]).from_pretrained(f"tiny/{name}")
    print(name, type(processor).__name__)
"""


def test_load_by_hub_id_from_offline_cache(tmp_path):
    """How a real checkpoint loads on a machine with a populated HF cache: by hub id, offline."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(tmp_path),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _HUB_ID_SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [
        "tiny-smolvlm",
        "ImageOnlySmolVLMProcessor",
        "tiny-qwen3vl",
        "ImageOnlyQwen3VLProcessor",
    ]
