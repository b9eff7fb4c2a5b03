"""Shared parts of the tiny offline models and of the image-only processors (client side only:
transformers, tokenizers; never shipped to a server). Each family's `tiny_<family>.py` under
`workbench/models/architectures/` builds its tiny model with these.

The tokenizers are byte-level BPE with no merges (one token per UTF-8 byte, ids 0..255) followed
by the model family's special tokens, each a single id (ids from 256 on). The model vocab is padded
to 320 rows, as real checkpoints pad their embedding matrices past the tokenizer length.
Weights are a pure function of the seed (``torch.manual_seed`` before ``_from_config``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import ProcessorMixin

# Model embedding rows. Tokenizers have 256 byte tokens + < 64 special tokens.
_VOCAB_SIZE = 320
VOCAB_SIZE = _VOCAB_SIZE


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


def load_tokenizer(model_dir):
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise TypeError(f"{model_dir}: expected a tokenizer, got {type(tokenizer).__name__}")
    return tokenizer


def image_only_class(base: type[ProcessorMixin]) -> type[ProcessorMixin]:
    """`base` (a composite processor that insists on a video processor, which needs torchvision)
    with only an image processor and a tokenizer."""
    from transformers import ProcessorMixin

    class ImageOnly(ProcessorMixin):  # before `base` in the class made below, so its methods win
        @classmethod
        def get_attributes(cls):
            return ["image_processor", "tokenizer"]

        def __init__(self, image_processor, tokenizer, chat_template=None, **kwargs):
            # ProcessorMixin.__init__ zips the positional sub-processors with get_attributes(), so
            # the trailing video_processor=None is dropped; super(): `base`'s __init__
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    # made with `type`: a class statement cannot name a base known only at run time to a type checker
    name = f"ImageOnly{base.__name__}"
    return type(name, (ImageOnly, base), {
        "__qualname__": name, "__doc__": f"{base.__name__} without the video processor (which needs torchvision)."})


def image_processor_and_template(model_dir, base, image_cls):
    """(tokenizer, image processor, chat template, processor dict) of a saved checkpoint (real or
    tiny) or a hub id. The chat template comes from the same files a ProcessorMixin reads
    (chat_template.json, else chat_template.jinja and chat_templates/, else processor_config.json),
    falling back to the tokenizer's own template (tokenizer_config.json)."""
    model_dir = str(model_dir)
    tokenizer = load_tokenizer(model_dir)
    image_processor = image_cls.from_pretrained(model_dir)
    if type(image_processor) is not image_cls:
        raise TypeError(f"{model_dir}: expected {image_cls.__name__}, got {type(image_processor).__name__}")
    processor_dict, _ = base.get_processor_dict(model_dir)
    chat_template = processor_dict.get("chat_template") or tokenizer.chat_template
    if chat_template is None:
        raise ValueError(f"{model_dir}: no chat template (chat_template.json/.jinja, processor or tokenizer config)")
    return tokenizer, image_processor, chat_template, processor_dict


def saved_processor(model_dir, base, image_cls, keys=(), processor_cls=None):
    """The processor `base` of a saved checkpoint (real or tiny) or a hub id, built from its
    tokenizer, its `image_cls` image processor and its chat template
    (`image_processor_and_template`), with the settings `keys` that processor_config.json holds;
    processor_cls: the class to build (e.g. an `image_only_class` of base), base by default."""
    tokenizer, image_processor, template, processor_dict = image_processor_and_template(model_dir, base, image_cls)
    kwargs = {k: processor_dict[k] for k in keys if k in processor_dict}
    processor = (processor_cls or base)(image_processor, tokenizer, chat_template=template, **kwargs)
    return check_processor(processor, base)


def check_processor(processor, base, attributes=("image_processor", "tokenizer")):
    if not isinstance(processor, base) or list(processor.get_attributes()) != list(attributes):
        raise TypeError(f"unexpected processor {type(processor).__name__}")
    return processor
