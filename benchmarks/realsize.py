"""Real-size random-weight models built offline, and a `WorkbenchModel` over an in-memory module.

The configs are the tiny builders' configs (read back from the tiny checkpoints) scaled up to the
real checkpoints' dimensions (the config.json of HuggingFaceTB/SmolVLM2-2.2B-Instruct and Qwen/Qwen3-VL-2B-Instruct on the hub). Tokenizers stay the tiny
byte-level ones (token ids < 320); the embedding matrices have the real vocabulary size, so every
matmul has its real shape. Weights are random (`_from_config`, seeded).

`scaled_checkpoint_dir` writes a weightless checkpoint directory (config, tokenizer, processor
files) so `model_info` and `load_processor` work unchanged; `wrap_in_memory` builds a real
`WorkbenchModel` over it, handing the already-built module to the `from_pretrained` call instead
of reading weights from disk (saving and reloading 9 GB would double the peak memory).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

# Real dims, from the checkpoints' config.json (hub: HuggingFaceTB/SmolVLM2-2.2B-Instruct, Qwen/Qwen3-VL-2B-Instruct).
SMOLVLM2_2B = {
    "text": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32, head_dim=64, vocab_size=49280, rope_theta=273768.0),
    "vision": dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                   image_size=384, patch_size=14),
    "scale_factor": 3,
}
QWEN3VL_2B = {
    "text": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=5_000_000.0,
                 mrope_section=[24, 20, 20]),
    "vision": dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, patch_size=16,
                   spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=2048,
                   num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17]),
}
REAL_SIZE = {"smolvlm2-2.2b-random": ("tiny-smolvlm", SMOLVLM2_2B), "qwen3vl-2b-random": ("tiny-qwen3vl", QWEN3VL_2B)}


def scaled_config(tiny_name: str, dims: dict[str, Any], n_layers: int | None = None) -> Any:
    """The tiny builder's config with the real dims (`n_layers` overrides the decoder depth)."""
    import transformers

    from workbench.models.tiny import tiny_model_dir

    cfg = transformers.AutoConfig.from_pretrained(tiny_model_dir(tiny_name))
    text, vision = cfg.text_config, cfg.vision_config
    t = dict(dims["text"])
    rope_theta = t.pop("rope_theta")
    mrope = t.pop("mrope_section", None)
    for key, value in t.items():
        setattr(text, key, value)
    if n_layers is not None:
        text.num_hidden_layers = n_layers
    rope = dict(text.rope_parameters or {})
    rope["rope_theta"] = rope_theta
    if mrope is not None:
        rope["mrope_section"] = mrope
    text.rope_parameters = rope
    for key, value in dims["vision"].items():
        setattr(vision, key, value)
    if "scale_factor" in dims:
        cfg.scale_factor = dims["scale_factor"]
    if tiny_name == "tiny-qwen3vl" and n_layers is not None:
        # DeepStack adds after decoder layers 0..k: keep k below the depth
        vision.deepstack_visual_indexes = [i for i in vision.deepstack_visual_indexes][: max(1, n_layers - 1)]
    return cfg


def n_parameters_meta(cfg: Any) -> int:
    """Parameter count of the model for `cfg`, built on the meta device (no memory)."""
    import torch
    import transformers

    cls = getattr(transformers, cfg.architectures[0])
    with torch.device("meta"):
        model = cls._from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def scaled_checkpoint_dir(tiny_name: str, cfg: Any, out_dir: Path) -> Path:
    """A checkpoint directory without weights: the tiny one's tokenizer and processor files, the
    scaled config, and processor settings matching the scaled vision tower."""
    from workbench.models.tiny import tiny_model_dir

    src = tiny_model_dir(tiny_name)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy2(f, out_dir / f.name)
    cfg.save_pretrained(out_dir)
    # an empty weight index: model_info's check wants weights beside the config, and these are
    # built in memory and handed over by `wrap_in_memory` (nothing is read from this directory)
    (out_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"built_in_memory": True}, "weight_map": {}}))
    pre = json.loads((out_dir / "preprocessor_config.json").read_text())
    proc = json.loads((out_dir / "processor_config.json").read_text())
    vision = cfg.vision_config
    if tiny_name == "tiny-smolvlm":
        # one 384 px tile (no splitting for images up to 384 px): 81 image tokens, as the real
        # model gives per tile; the real processor would upscale to 1536 px (17 tiles)
        pre["max_image_size"] = {"longest_edge": vision.image_size}
        pre["size"] = {"longest_edge": vision.image_size}
        proc["image_seq_len"] = (vision.image_size // vision.patch_size) ** 2 // cfg.scale_factor ** 2
    else:
        # the real Qwen3-VL processor: patch 16, merge 2, at least 65536 px (64 merged tokens)
        pre["patch_size"] = vision.patch_size
        pre["merge_size"] = vision.spatial_merge_size
        pre["size"] = {"shortest_edge": 65536, "longest_edge": 16777216}
    (out_dir / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    (out_dir / "processor_config.json").write_text(json.dumps(proc, indent=2) + "\n")
    (out_dir / "tiny_model.json").unlink(missing_ok=True)
    return out_dir


def build_module(cfg: Any, seed: int = 0, attn: str = "eager", dtype: Any = None) -> Any:
    """Random-init the model for `cfg` on the current default device (fp32 unless `dtype`;
    on a 2-core CPU ~1 min and ~9 GB at 2B)."""
    import torch
    import transformers

    cls = getattr(transformers, cfg.architectures[0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        kwargs = {"dtype": dtype} if dtype is not None else {}
        model = cls._from_config(cfg, attn_implementation=attn, **kwargs)
    return model.eval()


@contextmanager
def _from_pretrained_returns(cls: Any, module: Any) -> Iterator[None]:
    original = cls.__dict__.get("from_pretrained")

    def fake(*args: Any, dtype: Any = None, attn_implementation: str | None = None, **kwargs: Any) -> Any:
        if dtype is not None and next(module.parameters()).dtype != dtype:
            module.to(dtype)
        if attn_implementation:
            module.set_attn_implementation(attn_implementation)
        return module

    cls.from_pretrained = fake
    try:
        yield
    finally:
        if original is None:
            del cls.from_pretrained
        else:
            cls.from_pretrained = original


def wrap_in_memory(module: Any, checkpoint_dir: Path, model_id: str, *, device: str = "cpu", dtype: str = "float32",
                   attn: str = "eager") -> Any:
    """A `WorkbenchModel` (the workbench's own class and init) over an already-built module."""
    import transformers

    from workbench.models.model import WorkbenchModel, model_info

    info = model_info(str(checkpoint_dir))
    info = type(info)(**{**info.__dict__, "model_id": model_id})
    cls = getattr(transformers, info.arch.model_class)
    with _from_pretrained_returns(cls, module):
        return WorkbenchModel(info, device=device, dtype=dtype, attn=attn)


@contextmanager
def real_size_model(name: str, *, device: str = "cpu", dtype: str = "float32", attn: str = "eager",
                    n_layers: int | None = None, seed: int = 0) -> Iterator[Any]:
    """Build, wrap and yield a real-size random-weight `WorkbenchModel`; free it afterwards."""
    import gc

    tiny_name, dims = REAL_SIZE[name]
    cfg = scaled_config(tiny_name, dims, n_layers)
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        ckpt = scaled_checkpoint_dir(tiny_name, cfg, Path(tmp))
        module = build_module(cfg, seed, attn)
        model = wrap_in_memory(module, ckpt, name, device=device, dtype=dtype, attn=attn)
        try:
            yield model
        finally:
            del model, module
            gc.collect()
