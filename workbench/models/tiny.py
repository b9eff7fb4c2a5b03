"""Tiny random-weight models built from the real transformers classes.

Each builder writes a complete checkpoint directory (config + safetensors weights, tokenizer, image
processor config, chat template) that loads back through the same code path as a real checkpoint:

    cfg = transformers.AutoConfig.from_pretrained(d)
    model = transformers.SmolVLMForConditionalGeneration.from_pretrained(d)   # or Qwen3VL / Llama
    processor = load_processor(d, "smolvlm")                                  # or "qwen3vl" / "llama"

Weights are a pure function of the seed (``torch.manual_seed`` before ``_from_config``).

The tokenizers are byte-level BPE with no merges (one token per UTF-8 byte, ids 0..255) followed
by the model family's special tokens, each a single id (ids from 256 on). The model vocab is padded
to 320 rows, as real checkpoints pad their embedding matrices past the tokenizer length.

Processors: the composite SmolVLM / Qwen3-VL processors insist on a video processor, and the video
processors need torchvision, which must not be installed beside this torch. ``load_processor``
therefore builds image-only subclasses from the tokenizer and the PIL image processor.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch

# Bump when a builder changes: the version is part of the cache directory name, so stale builds
# are never reused.
_VERSION = "v1"
_DEFAULT_SEED = 0
_MARKER = "tiny_model.json"  # written last; its presence marks a finished build
_BUILD_LOCK = threading.Lock()

# Model embedding rows. Tokenizers have 256 byte tokens + < 64 special tokens.
_VOCAB_SIZE = 320

# ---------------------------------------------------------------------------------------------
# Chat templates
# ---------------------------------------------------------------------------------------------

# SmolVLM2's template (as in transformers' SmolVLMProcessor.DEFAULT_CHAT_TEMPLATE, without the video
# branch): "<|im_start|>User:<image>question<end_of_utterance>\nAssistant:". No space after "User:"
# when the turn starts with an image, as in the real one.
SMOLVLM_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'] is string %}{{': ' + message['content']}}"
    "{% else %}{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}"
    "{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

# Qwen3-VL's template, reduced to what the workbench uses (no tools, no reasoning blocks). Like the
# real one it adds no default system prompt.
QWEN3VL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif content['type'] == 'text' %}{{- content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Llama-3-style template. Like the real Llama 3 it starts with bos_token AND the tokenizer adds BOS
# itself, so text rendered with tokenize=False must be tokenized with add_special_tokens=False.
LLAMA_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'text' %}{{- content['text'] | trim }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Special tokens, in id order (ids 256, 257, ...).
SMOLVLM_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)],
]
# Same order as the real Qwen vocab (151643...), so relative layout matches.
QWEN3VL_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
LLAMA_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def _byte_level_tokenizer(special_tokens: list[str], *, chat_template: str, add_bos: str | None = None, **roles):
    """Byte-level BPE with no merges (ids 0..255) + `special_tokens` (ids 256...), built offline."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # sorted: the set order is not stable
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # normalized=False: match the literal text; special=True: one id each, never split into bytes.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    if add_bos is not None:
        bos_id = tok.token_to_id(add_bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{add_bos} $A", pair=f"{add_bos} $A {add_bos} $B", special_tokens=[(add_bos, bos_id)]
        )
    assert tok.get_vocab_size() <= _VOCAB_SIZE
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=chat_template, model_max_length=8192, **roles)


def _save(model, tokenizer, out_dir: Path, image_processor=None, extra_json: dict | None = None) -> None:
    model.save_pretrained(out_dir, safe_serialization=True)
    # tokenizer.save_pretrained writes the chat template to chat_template.jinja, which both
    # AutoTokenizer and ProcessorMixin.get_processor_dict read back.
    tokenizer.save_pretrained(out_dir)
    if image_processor is not None:
        image_processor.save_pretrained(out_dir)  # preprocessor_config.json
    for name, payload in (extra_json or {}).items():
        (out_dir / name).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def _init_model(model_cls, config, seed: int):
    """Random-init `model_cls` from `config`; the weights depend only on `seed`.

    fork_rng: seeding must not disturb the caller's global RNG stream.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_cls._from_config(config, attn_implementation="eager")


def _ids(tokenizer, *tokens: str) -> list[int]:
    ids = tokenizer.convert_tokens_to_ids(list(tokens))
    assert all(isinstance(i, int) for i in ids), dict(zip(tokens, ids))
    return ids


# ---------------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------------

SMOLVLM_TILE = 32  # image_processor.max_image_size.longest_edge == vision image_size
SMOLVLM_PATCH = 8
SMOLVLM_SCALE = 2
# (32/8)^2 patches per tile, pixel-shuffled by 2x2 -> 4 <image> tokens per tile.
SMOLVLM_IMAGE_SEQ_LEN = (SMOLVLM_TILE // SMOLVLM_PATCH) ** 2 // SMOLVLM_SCALE**2


def build_tiny_smolvlm(out_dir: Path, seed: int) -> None:
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(
        SMOLVLM_SPECIAL_TOKENS,
        chat_template=SMOLVLM_CHAT_TEMPLATE,
        # Roles as in SmolVLM2's tokenizer_config.
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    bos, eos, pad, image = _ids(tokenizer, "<|im_start|>", "<end_of_utterance>", "<|im_end|>", "<image>")

    image_processor = SmolVLMImageProcessorPil(
        do_image_splitting=True,  # keep splitting on: tiles + global image with <row_i_col_j> tokens
        max_image_size={"longest_edge": SMOLVLM_TILE},
        # 3 tiles on the long side (the real one: 1536 = 4 x 384). A 96x64 image gives 2 rows x 3 cols.
        size={"longest_edge": 3 * SMOLVLM_TILE},
    )
    config = SmolVLMConfig(
        text_config=dict(
            model_type="llama",
            vocab_size=_VOCAB_SIZE,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 273768.0},
            bos_token_id=bos,
            eos_token_id=eos,
            pad_token_id=pad,
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=SMOLVLM_TILE,  # must equal max_image_size.longest_edge
            patch_size=SMOLVLM_PATCH,
        ),
        scale_factor=SMOLVLM_SCALE,
        image_token_id=image,
        pad_token_id=pad,  # otherwise a default of 128002, outside this vocab
        tie_word_embeddings=False,  # untied lm_head, like SmolVLM2
    )
    model = _init_model(SmolVLMForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = bos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    # processor_config.json carries image_seq_len for the processor, like the real checkpoint.
    _save(
        model,
        tokenizer,
        out_dir,
        image_processor,
        {"processor_config.json": {"image_seq_len": SMOLVLM_IMAGE_SEQ_LEN, "processor_class": "SmolVLMProcessor"}},
    )


QWEN_PATCH = 8
QWEN_MERGE = 2
_QWEN_FACTOR = QWEN_PATCH * QWEN_MERGE  # images are resized to multiples of 16 px; 1 merged token each


def build_tiny_qwen3vl(out_dir: Path, seed: int) -> None:
    from transformers import Qwen2VLImageProcessorPil, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(
        QWEN3VL_SPECIAL_TOKENS,
        chat_template=QWEN3VL_CHAT_TEMPLATE,
        # Roles as in Qwen3-VL's tokenizer_config: no BOS, eos <|im_end|>, pad <|endoftext|>.
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    eot, eos, v_start, v_end, image, video = _ids(
        tokenizer,
        "<|endoftext|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
        "<|video_pad|>",
    )

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=QWEN_PATCH,
        temporal_patch_size=2,
        merge_size=QWEN_MERGE,
        # Between 4 and 32 merged tokens per image (a 96x64 image gives 6x4 = 24).
        min_pixels=4 * _QWEN_FACTOR**2,
        max_pixels=32 * _QWEN_FACTOR**2,
        image_mean=[0.5, 0.5, 0.5],  # Qwen3-VL's normalisation
        image_std=[0.5, 0.5, 0.5],
    )
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=_VOCAB_SIZE,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=8192,
            rms_norm_eps=1e-6,
            # mrope_section sums to head_dim/2 = 8. The interleaved layout gives H and W every third
            # frequency from offsets 1 and 2 up to 3*section, so sections must satisfy
            # 3*max(h, w) <= 8: [4, 2, 2] (real: [24, 20, 20] of 64). transformers 5.x always
            # interleaves for Qwen3-VL; mrope_interleaved is recorded as in the real config.
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": [4, 2, 2],
                "mrope_interleaved": True,
            },
            bos_token_id=eot,
            eos_token_id=eos,
            pad_token_id=eot,
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=3,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            patch_size=QWEN_PATCH,  # must match the image processor
            spatial_merge_size=QWEN_MERGE,
            temporal_patch_size=2,
            out_hidden_size=64,  # must equal the text hidden size
            num_position_embeddings=64,  # a perfect square (8x8 grid, interpolated per image)
            # Vision blocks 0 and 1 feed DeepStack adds after decoder layers 0 and 1: fewer than the
            # 3 decoder layers, so the last decoder layer has no DeepStack add (as in the real model).
            deepstack_visual_indexes=[0, 1],
        ),
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=v_start,
        vision_end_token_id=v_end,
        tie_word_embeddings=True,  # tied lm_head, like Qwen3-VL-2B
    )
    model = _init_model(Qwen3VLForConditionalGeneration, config, seed)
    model.generation_config.bos_token_id = eot
    model.generation_config.eos_token_id = [eos, eot]
    model.generation_config.pad_token_id = eot
    processor_config = {"processor_class": "Qwen3VLProcessor"}
    _save(model, tokenizer, out_dir, image_processor, {"processor_config.json": processor_config})


def build_tiny_llama(out_dir: Path, seed: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tokenizer = _byte_level_tokenizer(
        LLAMA_SPECIAL_TOKENS,
        chat_template=LLAMA_CHAT_TEMPLATE,
        add_bos="<|begin_of_text|>",  # Llama 3's tokenizer prepends BOS itself
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
    )
    bos, eos, end_of_text = _ids(tokenizer, "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>")
    config = LlamaConfig(
        vocab_size=_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
        bos_token_id=bos,
        eos_token_id=[eos, end_of_text],
        pad_token_id=end_of_text,
        tie_word_embeddings=False,
    )
    model = _init_model(LlamaForCausalLM, config, seed)
    _save(model, tokenizer, out_dir)


TINY_MODELS: dict[str, Callable[[Path, int], None]] = {
    "tiny-smolvlm": build_tiny_smolvlm,
    "tiny-qwen3vl": build_tiny_qwen3vl,
    "tiny-llama": build_tiny_llama,
}
_FAMILY = {"tiny-smolvlm": "smolvlm", "tiny-qwen3vl": "qwen3vl", "tiny-llama": "llama"}


def _default_root() -> Path:
    base = os.environ.get("WORKBENCH_CACHE")
    base = Path(base).expanduser() if base else Path.home() / ".cache" / "workbench"
    return base / "models"


def tiny_model_dir(name: str, root: Path | None = None) -> Path:
    """Directory of tiny model `name`, building it on first use.

    The directory is ``<root>/<name>-v1``; root defaults to ``$WORKBENCH_CACHE/models`` or
    ``~/.cache/workbench/models``. The model is built into a temporary sibling directory and moved
    into place with ``os.replace``, so a directory that exists is complete; concurrent callers each
    build, one rename wins and the others discard their copy (builds are identical for the seed).
    """
    if name not in TINY_MODELS:
        raise KeyError(f"unknown tiny model {name!r}; known: {sorted(TINY_MODELS)}")
    root = Path(root).expanduser() if root is not None else _default_root()
    final = root / f"{name}-{_VERSION}"
    if (final / _MARKER).is_file():
        return final
    if final.exists():
        raise RuntimeError(f"{final} exists but has no {_MARKER}: not a finished tiny-model build; remove it")
    # The lock serialises builds within one process (threads would otherwise share the global
    # torch RNG while seeding); other processes are handled by the atomic rename below.
    with _BUILD_LOCK:
        if (final / _MARKER).is_file():
            return final
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
        try:
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
            TINY_MODELS[name](tmp, _DEFAULT_SEED)
            marker = {"name": name, "version": _VERSION, "seed": _DEFAULT_SEED, "family": _FAMILY[name]}
            (tmp / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            try:
                os.replace(tmp, final)
            except OSError:
                # Another process renamed its finished build into place first (renaming onto a
                # non-empty directory fails). Use theirs.
                if not (final / _MARKER).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------------------------
# Image-only processors
# ---------------------------------------------------------------------------------------------


def _image_only_classes():
    from transformers import Qwen3VLProcessor, SmolVLMProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageOnlySmolVLMProcessor(SmolVLMProcessor):
        """SmolVLMProcessor without the video processor (which needs torchvision)."""

        @classmethod
        def get_attributes(cls):
            return ["image_processor", "tokenizer"]

        def __init__(self, image_processor, tokenizer, image_seq_len: int = 169, chat_template=None, **kwargs):
            # ProcessorMixin.__init__ zips the positional sub-processors with get_attributes(), so the
            # trailing video_processor=None is dropped.
            super().__init__(
                image_processor, tokenizer, None, image_seq_len=image_seq_len, chat_template=chat_template, **kwargs
            )

        def apply_chat_template(self, conversation, chat_template=None, **kwargs):
            # SmolVLMProcessor.apply_chat_template reads self.video_processor.num_frames/fps even for
            # image-only conversations; the generic implementation does not.
            return ProcessorMixin.apply_chat_template(self, conversation, chat_template, **kwargs)

    class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
        """Qwen3VLProcessor without the video processor (which needs torchvision)."""

        @classmethod
        def get_attributes(cls):
            return ["image_processor", "tokenizer"]

        def __init__(self, image_processor, tokenizer, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return ImageOnlySmolVLMProcessor, ImageOnlyQwen3VLProcessor


_CLASSES = None


def _processor_classes():
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _image_only_classes()
    return _CLASSES


def _smolvlm_image_seq_len(model_dir: str, processor_dict: dict) -> int:
    """image_seq_len from processor_config.json, checked against the model config."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(model_dir)
        vision = cfg.vision_config
        expected = (vision.image_size // vision.patch_size) ** 2 // cfg.scale_factor**2
    except (OSError, AttributeError):
        expected = None
    saved = processor_dict.get("image_seq_len")
    if saved is not None and expected is not None and saved != expected:
        raise ValueError(f"{model_dir}: processor image_seq_len {saved} != {expected} from config.json")
    if saved is None and expected is None:
        raise ValueError(f"{model_dir}: no image_seq_len in processor_config.json and no vision config")
    return saved if saved is not None else expected


def load_processor(model_dir: Path | str, family: str):
    """Image-only processor for a saved checkpoint directory (real or tiny), or a hub id.

    family "smolvlm" / "qwen3vl": AutoTokenizer + SmolVLMImageProcessorPil / Qwen2VLImageProcessorPil
    loaded from `model_dir`, combined into a SmolVLMProcessor / Qwen3VLProcessor subclass whose only
    sub-processors are image_processor and tokenizer. The chat template comes from the same files
    a ProcessorMixin reads (chat_template.json, else chat_template.jinja and chat_templates/, else
    processor_config.json), falling back to the tokenizer's own template (tokenizer_config.json).
    family "llama": the tokenizer alone.
    """
    from transformers import (
        AutoTokenizer,
        PreTrainedTokenizerBase,
        Qwen2VLImageProcessorPil,
        Qwen3VLProcessor,
        SmolVLMImageProcessorPil,
        SmolVLMProcessor,
    )

    if family not in ("smolvlm", "qwen3vl", "llama"):
        raise ValueError(f"unknown family {family!r}; expected 'smolvlm', 'qwen3vl' or 'llama'")
    # A local directory or a hub id (resolved from the HF cache when offline); every loader below
    # accepts both.
    model_dir = str(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise TypeError(f"{model_dir}: expected a tokenizer, got {type(tokenizer).__name__}")
    if family == "llama":
        return tokenizer  # its chat template: chat_template.jinja or tokenizer_config.json

    smol_cls, qwen_cls = _processor_classes()
    if family == "smolvlm":
        base, image_cls, cls = SmolVLMProcessor, SmolVLMImageProcessorPil, smol_cls
    else:
        base, image_cls, cls = Qwen3VLProcessor, Qwen2VLImageProcessorPil, qwen_cls

    image_processor = image_cls.from_pretrained(model_dir)
    if type(image_processor) is not image_cls:
        raise TypeError(f"{model_dir}: expected {image_cls.__name__}, got {type(image_processor).__name__}")

    processor_dict, _ = base.get_processor_dict(model_dir)
    chat_template = processor_dict.get("chat_template") or tokenizer.chat_template
    if chat_template is None:
        raise ValueError(f"{model_dir}: no chat template (chat_template.json/.jinja, processor or tokenizer config)")

    kwargs = {"chat_template": chat_template}
    if family == "smolvlm":
        kwargs["image_seq_len"] = _smolvlm_image_seq_len(model_dir, processor_dict)
    processor = cls(image_processor, tokenizer, **kwargs)
    if not isinstance(processor, base) or processor.get_attributes() != ["image_processor", "tokenizer"]:
        raise TypeError(f"unexpected processor {type(processor).__name__}")
    return processor
