"""`WorkbenchModel`: one loaded model, whatever its architecture, behind nnsight.

It loads a checkpoint (HF repo id or local directory, through the same `from_pretrained`), wraps it
in nnsight's `TransformersModel`, turns (image, question) into model inputs through the model's own
processor and chat template, labels every position with its modality, and resolves the named
sites (`embed`, `vision`, `projector`, `layer`, ...) to nnsight envoys.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import transformers
from PIL import Image

from ..errors import DeviceError, ModelError
from ..records import Record
from .architectures import Architecture, architecture_for, is_boundary_token

ImageMode = Literal["real", "blank", "none"]
_LOG = logging.getLogger("workbench")


class ModelInputs(Record):
    """Inputs for one forward pass, with the label of every position: `encoding` (keyword
    arguments of the model's forward, tensors), `input_ids` ((seq,) int64), `modality` ((seq,)
    str: vision | boundary | text), `geometry` (each token's place in the image:
    {label: (seq,) array}, `workbench.models.geometry`; None where the family keeps no positions).
    A `Record`: it travels to NDIF servers."""

    encoding: dict[str, torch.Tensor]
    input_ids: np.ndarray
    modality: np.ndarray
    _fields = ("encoding", "input_ids", "modality", "geometry")
    _defaults = {"geometry": None}
    geometry: dict[str, np.ndarray] | None
    _mutable = True

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[0])


class ModelInfo(Record):
    """What can be known of a model from its config alone (no weights): enough to validate a plan.
    model_id, path, arch (an Architecture), n_layers, hidden_size, vocab_size, n_vision_layers
    (the vision tower's depth; 0 for a text model), kv_heads and head_dim (the stored `keys`,
    `values` and `keys_pre` flatten (kv_heads, head_dim), heads first: `analyses.kv.per_head`),
    logit_scale and logit_softcap (what the model's forward does to the head's output, read from
    the config where the family declares them: `Architecture.logit_scale`, `logit_softcap`),
    attention_layers (the decoder layers that self-attend; None: every one) and
    cross_attention_layers (those that cross-attend to the image instead: Mllama's), read from the
    config where the family names them (`Architecture.layer_types`, `.cross_attention_layers`)."""

    model_id: str
    path: str
    arch: Architecture
    n_layers: int
    hidden_size: int
    vocab_size: int
    n_vision_layers: int
    kv_heads: int | None
    head_dim: int | None
    _fields = ("model_id", "path", "arch", "n_layers", "hidden_size", "vocab_size", "n_vision_layers", "kv_heads",
               "head_dim", "logit_scale", "logit_softcap", "attention_layers", "cross_attention_layers")
    _defaults = {"n_vision_layers": 0, "kv_heads": None, "head_dim": None, "logit_scale": 1.0, "logit_softcap": None,
                 "attention_layers": None, "cross_attention_layers": ()}
    logit_scale: float
    logit_softcap: float | None
    attention_layers: tuple[int, ...] | None
    cross_attention_layers: tuple[int, ...]

    def head_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's logits from `lm_head`'s output, as its forward makes them (Cohere's scale,
        Gemma-2's soft cap): what the `logits` and `logit_lens` sites read."""
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        if self.logit_softcap is not None:
            logits = (logits / self.logit_softcap).tanh() * self.logit_softcap
        return logits

    def describe(self) -> dict[str, Any]:
        return {
            "family": self.arch.family,
            "architecture": self.arch.model_class,
            "n_layers": self.n_layers,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "path": self.path,
        }


def resolve_model_path(model_id: str) -> str:
    """A tiny model's name -> its built directory; a trained tiny model or one of its checkpoints
    (`NAME@step-N`) -> its directory, trained on first use; a local directory -> itself; else a hub id."""
    from .refs import parse_trained_ref
    from .tiny import TINY_MODELS, tiny_model_dir

    if model_id in TINY_MODELS:
        return str(tiny_model_dir(model_id))
    if parse_trained_ref(model_id) is not None:
        from .training import trained_checkpoint_dir

        try:
            return str(trained_checkpoint_dir(model_id))
        except KeyError as exc:
            raise ModelError(f"model {model_id!r}: {exc.args[0]}") from None
    if os.path.isdir(model_id):
        return model_id
    return model_id


WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")
TINY_HINT = ("offline, the tiny models run any spec: --models tiny-smolvlm,tiny-qwen3vl "
             "(and --data builtin for the built-in samples)")


class UnregisteredModelError(ModelError):
    """A readable config whose model class no family registers (`workbench check` infers its
    layout from it: `workbench.models.infer`)."""

    def __init__(self, message: str, path: str, config: Any):
        super().__init__(message, hint="add a family file under workbench/models/architectures/, or use a "
                         "supported model (`workbench families` lists them)")
        self.path, self.config = path, config


def model_info(model_id: str) -> ModelInfo:
    """The model's config, read without weights. Raises ModelError (exit 2) naming the model and
    why: a directory without a model, a hub id that cannot be reached or found, an architecture
    the workbench has no description of."""
    path = resolve_model_path(model_id)
    if os.path.isdir(path):
        _check_model_dir(model_id, Path(path))
    else:
        _check_hub_reachable(model_id)
    try:
        config = transformers.AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:  # not found, gated, offline, an unknown model_type
        raise ModelError(f"model {model_id!r}: cannot read its config ({_first_line(exc)})", hint=TINY_HINT) from exc
    try:
        arch = architecture_for(getattr(config, "architectures", None))
    except ValueError as exc:
        raise UnregisteredModelError(f"model {model_id!r} (model_type {getattr(config, 'model_type', '?')!r}): {exc}",
                                     path, config) from None
    return info_from_config(model_id, path, config, arch)


def info_from_config(model_id: str, path: str, config: Any, arch: Architecture) -> ModelInfo:
    """The `ModelInfo` of a config read as family `arch` describes it."""
    text = getattr(config, arch.text_config) if arch.text_config else config
    return ModelInfo(
        model_id=model_id,
        path=path,
        arch=arch,
        n_layers=int(text.num_hidden_layers),
        hidden_size=int(text.hidden_size),
        vocab_size=int(text.vocab_size),
        n_vision_layers=vision_depth(config, arch),
        **kv_shape(text),
        **head_transform(text, arch),
        **layer_kinds(text, arch),
    )


def layer_kinds(text: Any, arch: Architecture) -> dict[str, Any]:
    """{attention_layers, cross_attention_layers} of a text config, where the family's layers are
    not all self-attention layers (see `ModelInfo`)."""
    n = int(text.num_hidden_layers)
    if arch.cross_attention_layers:
        cross = tuple(sorted(int(l) for l in getattr(text, arch.cross_attention_layers)))
        return {"attention_layers": tuple(l for l in range(n) if l not in cross), "cross_attention_layers": cross}
    if arch.layer_types:
        kinds = list(getattr(text, arch.layer_types))
        return {"attention_layers": tuple(l for l, kind in enumerate(kinds) if kind in arch.attention_types)}
    return {}


def kv_shape(text: transformers.PretrainedConfig) -> dict[str, int]:
    """{kv_heads, head_dim} of a text config (head_dim defaults to hidden_size / attention heads)."""
    heads = int(text.num_attention_heads)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or int(text.hidden_size) // heads
    return {"kv_heads": int(kv_heads), "head_dim": int(head_dim)}


def head_transform(text: Any, arch: Architecture) -> dict[str, Any]:
    """{logit_scale, logit_softcap} of a text config, where the family declares them."""
    scale = getattr(text, arch.logit_scale, None) if arch.logit_scale else None
    cap = getattr(text, arch.logit_softcap, None) if arch.logit_softcap else None
    return {"logit_scale": float(scale) if scale is not None else 1.0,
            "logit_softcap": float(cap) if cap is not None else None}


def vision_depth(config: transformers.PretrainedConfig, arch: Architecture) -> int:
    """The number of layers in the vision tower (Qwen's vision configs call it `depth`)."""
    if not arch.is_multimodal:
        return 0
    vision = getattr(config, arch.vision_config)
    depth = getattr(vision, "num_hidden_layers", None)
    return int(depth if depth is not None else vision.depth)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else 'no message'}"


def _check_model_dir(model_id: str, path: Path) -> None:
    """A local checkpoint directory needs a config and weights; say which is missing now, not
    after minutes of loading."""
    if not (path / "config.json").is_file():
        raise ModelError(f"model {model_id!r}: the directory {path} holds no model (no config.json); expected a "
                         "checkpoint saved with save_pretrained (config.json plus *.safetensors)")
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise ModelError(f"model {model_id!r}: the directory {path} holds a config.json but no weights; expected "
                         "*.safetensors or pytorch_model*.bin beside it (a save_pretrained checkpoint)")


def _check_hub_reachable(model_id: str) -> None:
    """A hub id that is not in the local cache needs the hub: say so at once if it cannot be had."""
    from huggingface_hub import try_to_load_from_cache

    from ..hub import hub_endpoint, hub_offline, hub_reachable

    if isinstance(try_to_load_from_cache(model_id, "config.json"), str):
        return  # cached: transformers reads it without the network
    if hub_offline():
        raise ModelError(f"model {model_id!r} is not in the local Hugging Face cache and the hub is off "
                         "(HF_HUB_OFFLINE=1)", hint=TINY_HINT)
    if not hub_reachable():
        raise ModelError(f"model {model_id!r}: the Hugging Face hub ({hub_endpoint()}) is unreachable and the model is "
                         "not in the local cache", hint=TINY_HINT)


def pick_device(device: str = "auto") -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(f"device {device!r} asked for, but torch sees no CUDA GPU here "
                          f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})",
                          hint="use --device cpu (or auto), or run on a machine with a GPU")
    return device


def pick_dtype(dtype: str, device: str) -> torch.dtype:
    # bf16 matmuls on CPUs without AVX512-BF16/AMX are ~6x slower than fp32: fp32 on CPU.
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


class InputEncoder:
    """(image, question) -> model inputs through the model's own processor and chat template, with
    the modality of every position. Needs the processor only, not the weights."""

    def __init__(self, info: ModelInfo, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from .tiny import load_processor

        self.arch, self.device, self.dtype = info.arch, device, dtype
        # the Architecture itself, not its family's name: an inferred layout (`workbench.models.infer`)
        # names an unregistered type but reads its processor as the family whose layout it follows
        self.path, self._config = info.path, None
        self.processor = load_processor(Path(info.path) if os.path.isdir(info.path) else info.path, self.arch)
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self._boundary_ids = self._find_boundary_ids()
        self.image_token_id = (
            self.tokenizer.convert_tokens_to_ids(self.arch.image_token) if self.arch.image_token else None
        )

    def encode(self, image: Image.Image | None, question: str, image_mode: ImageMode = "real") -> ModelInputs:
        """Model inputs for (image, question) through the chat template.

        image_mode: `real` keeps the image; `blank` replaces it with a white image of the same
        size (same token sequence); `none` removes it (a text-only prompt, shorter sequence)."""
        if image is not None and image_mode == "blank":
            image = Image.new("RGB", image.size, "white")
        if image_mode == "none" or not self.arch.is_multimodal:
            image = None
        content: list[dict[str, Any]] = [{"type": "image"}] if image is not None else []
        content.append({"type": "text", "text": question})
        messages = [{"role": "user", "content": content}]
        if not self.arch.is_multimodal and getattr(self.tokenizer, "chat_template", None) is None:
            # a base LLM (e.g. meta-llama/Llama-3.1-8B) has no chat template: BOS + the question
            enc = self.tokenizer(question, return_tensors="pt", add_special_tokens=True)
        elif image is None:
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            enc = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        else:
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            images = [[image.convert("RGB")]] if self.arch.nest_images else [image.convert("RGB")]
            enc = self.processor(text=[text], images=images, return_tensors="pt")
        # the family says which processor outputs the model must not see (e.g. training-only
        # token_type_ids); everything else is kept (Gemma-3 keeps token_type_ids)
        encoding = {k: v.to(self.device) for k, v in enc.items()
                    if isinstance(v, torch.Tensor) and k not in self.arch.drop_keys}
        if "pixel_values" in encoding:
            encoding["pixel_values"] = encoding["pixel_values"].to(self.dtype)
        ids = enc["input_ids"][0].cpu().numpy().astype(np.int64)
        modality = self.token_modality(ids)
        return ModelInputs(encoding=encoding, input_ids=ids, modality=modality,
                           geometry=self.geometry(image, enc, ids, modality))

    def geometry(self, image: Image.Image | None, enc: Any, ids: np.ndarray,
                 modality: np.ndarray) -> dict[str, np.ndarray] | None:
        """Each token's place in the image (`workbench.models.geometry`): None for a family that
        keeps no positions or a text model; all "none" (-1) where this prompt's layout is unknown."""
        from .geometry import GeometryContext, GeometryUnavailable, token_geometry

        if self.arch.geometry is None or self.arch.geometry.layout is None:
            return None
        if self._config is None:
            self._config = transformers.AutoConfig.from_pretrained(self.path)
        size = image.size if image is not None else (0, 0)
        encoding = {k: v.cpu().numpy() for k, v in enc.items() if isinstance(v, torch.Tensor)}
        ctx = GeometryContext(size, encoding, self.tokenizer.convert_ids_to_tokens(ids.tolist()), modality,
                              self.processor, self._config)
        try:
            return token_geometry(self.arch, ctx)
        except GeometryUnavailable as exc:
            _LOG.warning(f"{self.arch.family}: no patch geometry for this prompt ({exc}); stored as none (-1)")
            ctx = GeometryContext(size, encoding, ctx.tokens, np.full(modality.shape, "text"), self.processor, self._config)
            return token_geometry(self.arch, ctx)

    def token_modality(self, input_ids: np.ndarray) -> np.ndarray:
        """The modality of every position: this is where a token's modality is decided.

        `vision`: image placeholders (they carry the image features); `boundary`: the tokens that
        frame an image (`<fake_token_around_image>`, `<row_i_col_j>`, `<|vision_start|>`, ...), and a
        cross-attention family's image marker (Mllama's `<|image|>`: its features never enter the
        sequence); `text`: everything else, chat-template tokens included."""
        ids = np.asarray(input_ids)
        modality = np.full(ids.shape, "text", dtype="<U8")
        if self._boundary_ids:
            modality[np.isin(ids, list(self._boundary_ids))] = "boundary"
        if self.image_token_id is not None:
            # a cross-attention family's image token is a marker: the image is never in the sequence
            modality[ids == self.image_token_id] = "boundary" if self.arch.cross_attention_layers else "vision"
        return modality

    def _find_boundary_ids(self) -> set[int]:
        if not self.arch.is_multimodal:
            return set()
        vocab = self.tokenizer.get_vocab()
        # literal tokens by name (some are bare words, Aya Vision's `TILE_GLOBAL`, or bracketed,
        # Pixtral's `[IMG_BREAK]`); only numbered ones (`<row_1_col_2>`, `TILE_3`) need a scan
        found = {vocab[tok] for tok in self.arch.boundary_tokens if tok in vocab}
        if self.arch.boundary_patterns:
            found |= {i for tok, i in vocab.items() if is_boundary_token(self.arch, tok)}
        return found


class WorkbenchModel:
    """A loaded model: `lm` is the nnsight wrapper, `hf` the transformers module inside it."""

    def __init__(self, info: ModelInfo, device: str = "auto", dtype: str = "auto", attn: str = "sdpa",
                 device_map: str | None = None):
        """attn: the attention implementation ("sdpa" by default; attention captures compute their
        probabilities from q and k under any, see `capture.attention_probabilities`).
        device_map: "auto" (or "balanced", "sequential") spreads a model too large for one GPU
        over every device accelerate sees; inputs then go where the input embedding is, and
        every capture is gathered to the host as always."""
        from nnsight.modeling.transformers import TransformersModel

        self.info = info
        self.arch = info.arch
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        self.device_map = device_map
        model_class = getattr(transformers, self.arch.model_class)
        # use_kernels=False: transformers 5.25 kernelizes every model by default where the `kernels`
        # package is installed (modeling_utils.py `from_pretrained`, `_kernels_enabled`), swapping
        # layers' forwards for hub kernels: the modules the sites name must run their own code
        load = dict(dtype=self.dtype, attn_implementation=attn, use_kernels=False)
        if device_map:
            hf = model_class.from_pretrained(info.path, device_map=device_map, **load)
            self.device = str(hf.get_input_embeddings().weight.device)
        else:
            hf = model_class.from_pretrained(info.path, **load).to(self.device)
        self.hf = hf.eval()
        self.encoder = InputEncoder(info, self.device, self.dtype)
        self.processor, self.tokenizer = self.encoder.processor, self.encoder.tokenizer
        self.image_token_id = self.encoder.image_token_id
        task = "image-text-to-text" if self.arch.is_multimodal else "text-generation"
        extra = {"processor": self.processor} if self.arch.is_multimodal else {}
        self.lm = TransformersModel(self.hf, tokenizer=self.tokenizer, task=task, **extra)

    # -- identity -------------------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return self.info.model_id

    @property
    def n_layers(self) -> int:
        return self.info.n_layers

    def describe(self) -> dict[str, Any]:
        return {
            **self.info.describe(),
            "revision": getattr(self.hf.config, "_commit_hash", None),
            "dtype": str(self.dtype).removeprefix("torch."),
            **training_attrs(self.info.path),  # a trained tiny checkpoint: its step and stages
            "device": self.device,
            # the devices the weights were spread over
            **({"device_map": sorted({str(p.device) for p in self.hf.parameters()})} if self.device_map else {}),
        }

    # -- inputs (see InputEncoder) -------------------------------------------------------------------
    def encode(self, image: Image.Image | None, question: str, image_mode: ImageMode = "real") -> ModelInputs:
        return self.encoder.encode(image, question, image_mode)

    def token_modality(self, input_ids: np.ndarray) -> np.ndarray:
        return self.encoder.token_modality(input_ids)

    # -- sites --------------------------------------------------------------------------------------
    def module(self, path: str) -> list[Any]:
        """nnsight envoys for a dotted module path; a `*` component expands a ModuleList."""
        found = [self.lm]
        for part in path.split("."):
            if part == "*":
                found = [child for env in found for child in env]
            elif part.isdigit():
                found = [env[int(part)] for env in found]
            else:
                found = [getattr(env, part) for env in found]
        return found

    def decoder_layers(self) -> Any:
        return self.module(self.arch.decoder_layers)[0]

    def text_embedding_norm(self) -> float:
        """Mean L2 norm of the rows of the input embedding matrix (the text-token embeddings)."""
        if not hasattr(self, "_text_norm"):
            weight = self.hf.get_input_embeddings().weight.detach().float()
            self._text_norm = float(weight.norm(dim=-1).mean())
        return self._text_norm

    def prepare(self) -> None:
        """Per-run state the family keeps between forwards (Qwen3-VL caches M-RoPE deltas)."""
        if self.arch.mrope:
            self.hf.model.rope_deltas = None


def training_attrs(path: str) -> dict[str, Any]:
    """{"training": {name, step, stage, stages}} of a trained tiny checkpoint directory, else {}."""
    from .training import TRAINING_FILE

    file = Path(path) / TRAINING_FILE
    if not file.is_file():
        return {}
    record = json.loads(file.read_text())
    return {"training": {k: record[k] for k in ("name", "step", "stage", "stages")}}


def load_model(model_id: str, device: str = "auto", dtype: str = "auto", attn: str = "sdpa",
               device_map: str | None = None) -> WorkbenchModel:
    return WorkbenchModel(model_info(model_id), device=device, dtype=dtype, attn=attn, device_map=device_map)
