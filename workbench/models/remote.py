"""A model that runs on an NDIF server, client half: `RemoteModel`.

It holds no weights: `lm` is an nnsight `TransformersModel` built for the checkpoint on the meta
device (config only, no download of the weights), so its remote key names the checkpoint; the
processor/tokenizer encodes prompts here exactly as `WorkbenchModel` does (same `InputEncoder`).
The half that travels to the server is `workbench.backends.ndif_job.ServerModel`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from .model import ImageMode, InputEncoder, ModelInfo, ModelInputs, WorkbenchModel


def _seed_local_key(path: str) -> None:
    """A local checkpoint directory is its own repo id: skip the hub lookup nnsight does to
    canonicalize the id when it builds the remote key (offline, and there is no hub entry)."""
    if os.path.isdir(path):
        from nnsight.modeling import huggingface

        huggingface._ID_CACHE.setdefault(path, path)


class RemoteModel:
    """A model executed remotely: encodes here, runs there. `target` labels where (for the store)."""

    def __init__(self, info: ModelInfo, attn: str = "sdpa", target: str = "NDIF"):
        """attn: the attention implementation of the meta model; nnsight sends it as a
        per-request env, which NDIF does not apply (a deployment runs its own, sdpa)."""
        from nnsight.modeling.transformers import TransformersModel

        self.info = info
        self.arch = info.arch
        self.target = target
        self.served_key: str | None = None
        # inputs are built on this CPU in float32; the server moves them to its device and dtype
        self.device, self.dtype = "cpu", torch.float32
        self.encoder = InputEncoder(info, self.device, self.dtype)
        self.processor, self.tokenizer = self.encoder.processor, self.encoder.tokenizer
        self.image_token_id = self.encoder.image_token_id
        _seed_local_key(info.path)
        task = "image-text-to-text" if self.arch.is_multimodal else "text-generation"
        extra = {"processor": self.processor} if self.arch.is_multimodal else {}
        # not dispatched: the module tree is built on the meta device from the config alone
        self.lm = TransformersModel(info.path, tokenizer=self.tokenizer, task=task, attn_implementation=attn, **extra)

    # -- identity -------------------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return self.info.model_id

    @property
    def n_layers(self) -> int:
        return self.info.n_layers

    @property
    def model_key(self) -> str:
        """The key jobs are submitted under: the served deployment's own key once the backend
        found it (`served_key`, matched by repo id and revision), else the key nnsight 0.8.1's
        `LanguageModel` / `TransformersModel` forms for NDIF (class path, repo id, revision, task)."""
        return self.served_key or self.lm.to_model_key()

    def describe(self) -> dict[str, Any]:
        config = getattr(self.lm._module, "config", None)
        return {
            **self.info.describe(),
            "revision": getattr(config, "_commit_hash", None),
            "dtype": "server",          # the deployment's own dtype (NDIF: bfloat16 on GPU)
            "device": "remote",
            "backend": "remote",
            "remote_target": self.target,
        }

    # -- inputs ---------------------------------------------------------------------------------
    def encode(self, image: Any, question: str, image_mode: ImageMode = "real") -> ModelInputs:
        """As `WorkbenchModel.encode` (the same `InputEncoder`)."""
        return self.encoder.encode(image, question, image_mode)

    def token_modality(self, input_ids: np.ndarray) -> np.ndarray:
        return self.encoder.token_modality(input_ids)

    # -- the half that travels --------------------------------------------------------------------
    def server_view(self) -> Any:
        """The half that travels (`workbench.backends.ndif_job.ServerModel`)."""
        from ..backends.ndif_job import ServerModel

        return ServerModel(self.lm, self.info)

    # sites resolve on the client too (nnsight envoys of the meta model), for tests and checks
    module = WorkbenchModel.module
    decoder_layers = WorkbenchModel.decoder_layers

    def prepare(self) -> None:
        """Nothing to reset here: per-run state lives on the server's model (see ServerModel)."""

    def text_embedding_norm(self) -> float:
        raise RuntimeError("the embedding weights are on the server; ServerModel.text_embedding_norm reads them there")
