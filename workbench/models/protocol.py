"""The model surface the backends see: `ModelLike`, what a local model (`WorkbenchModel`), the
client half of a remote one (`RemoteModel`) and the model of a job on the NDIF server
(`workbench.backends.ndif_job.ServerModel`) all offer; and `ClientModel`, what the runner also
needs on this side (the processor, to encode prompts and label tokens).

Typing only: the backend code that takes a `ModelLike` travels to NDIF, so this module imports
nothing but `typing` at run time (the names it annotates with are imported for type checkers only).
Every data member is a read-only property here, so a plain attribute (`ServerModel.lm`) and a
property (`WorkbenchModel.n_layers`) both satisfy it; `tests/test_protocol.py` checks the three
classes against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import torch

    from .architectures import Architecture
    from .model import ImageMode, ModelInfo, ModelInputs


@runtime_checkable
class ModelLike(Protocol):
    """What trace, capture, intervention and site code reads from a model, wherever it runs."""

    @property
    def lm(self) -> Any:
        """The nnsight model (a `TransformersModel`; on the server, the deployment's own)."""

    @property
    def info(self) -> ModelInfo:
        """What the model is: id, path, family, layer count."""

    @property
    def arch(self) -> Architecture:
        """The family's module paths and quirks (`Architecture`)."""

    @property
    def device(self) -> str | torch.device:
        """Where inputs go (the input embedding's device)."""

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights (pixel values are cast to it)."""

    @property
    def model_id(self) -> str: ...

    @property
    def n_layers(self) -> int:
        """Decoder layers L (the residual stream has layers 0..L)."""

    def module(self, path: str) -> list[Any]:
        """nnsight envoys for a dotted module path; a `*` component expands a ModuleList."""

    def decoder_layers(self) -> Any:
        """The envoy of the decoder's layer list."""

    def text_embedding_norm(self) -> float:
        """Mean L2 norm of the rows of the input embedding matrix (`normalize`'s default target)."""

    def prepare(self) -> None:
        """Reset per-run state before a forward (Qwen3-VL's cached M-RoPE deltas)."""


@runtime_checkable
class ClientModel(ModelLike, Protocol):
    """A `ModelLike` on this side, with its processor: what the runner loads (local or remote)."""

    @property
    def tokenizer(self) -> Any:
        """The processor's tokenizer (token texts for the store's labels)."""

    def describe(self) -> dict[str, Any]:
        """Identity for the store's attrs (id, revision, dtype, device, ...)."""

    def encode(self, image: Any, question: str, image_mode: ImageMode = "real") -> ModelInputs:
        """A prompt as the model's processor encodes it, each token labelled by modality."""

    def token_modality(self, input_ids: np.ndarray) -> np.ndarray:
        """vision | boundary | text for each token id."""
