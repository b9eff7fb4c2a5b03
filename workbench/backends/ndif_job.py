"""What runs on the NDIF server: the one module whose functions a remote job calls there.

A job is an nnsight session whose body calls `server_run(model, inputs, names, plan)`. Its code
travels by value (cloudpickle, `workbench` registered for pickling by value while the job is
serialized): this module, `workbench.backends.local` (the same `run_condition` as a local run,
so both give bitwise the same captures), the plan, interventions and captures, and `Record`.
NDIF unpickles and runs it inside a module whitelist (ndif-team/ndif at 028db44, src/services/ray/src/ray/nn/security/protected_environment.py), so
everything reachable from here imports only torch, numpy, nnsight, typing and workbench modules
that do the same; `tests/test_ndif_sandbox.py` checks that statically, and the loopback server
(tests/ndif_server.py) enforces the whitelist while it runs every job.

Not here, on purpose: dataclasses (`Record` replaces them), transformers (`DynamicCache`: the
cache is the one the model builds), regexes (boundary tokens are labelled on the client), file
access and the fault drills (`fault_point` is passed by the local runner only), relative
imports inside functions and `functools.wraps` decorators (see `workbench.backends.remote`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch

from ..models.model import WorkbenchModel
from ..models.protocol import ModelLike
# undecorated (inspect.getsource follows __wrapped__: a torch.inference_mode() wrapper would be
# rebuilt on the server with torch's globals, a NameError); it enters inference mode itself
from .local import RunResult, run_condition, run_conditions  # noqa: F401  (run_condition: the contract tests)

if TYPE_CHECKING:
    from ..models.model import ModelInfo
    from ..plan import ModelPlan
    from transformers import PreTrainedModel


class ServerModel:
    """The model as the backend code sees it on the server. Pickled into each remote job: `lm`
    travels as a persistent id resolved to the server's live model; the methods are the
    `WorkbenchModel` ones and read the server's real module through `hf`."""

    def __init__(self, lm: Any, info: ModelInfo):
        self.lm, self.info, self.arch = lm, info, info.arch

    @property
    def hf(self) -> PreTrainedModel:
        return self.lm._module

    @property
    def device(self) -> torch.device:
        """Where inputs go: the input embedding's device (the first device of a dispatched model)."""
        return cast(torch.Tensor, self.hf.get_input_embeddings().weight).device  # torch types it Tensor | Module

    @property
    def dtype(self) -> torch.dtype:
        return cast(torch.Tensor, self.hf.get_input_embeddings().weight).dtype

    model_id = WorkbenchModel.model_id
    n_layers = WorkbenchModel.n_layers
    module = WorkbenchModel.module
    decoder_layers = WorkbenchModel.decoder_layers
    text_embedding_norm = WorkbenchModel.text_embedding_norm
    prepare = WorkbenchModel.prepare


def on_device(inputs: Any, device: Any, dtype: Any) -> Any:
    encoding = {k: (v.to(device, dtype) if k == "pixel_values" else v.to(device)) for k, v in inputs.encoding.items()}
    return inputs.replace(encoding=encoding)


def server_run_samples(model: ModelLike, jobs: list, plan: ModelPlan) -> list:
    """ON THE SERVER, inside one job's session: `server_run` of each (inputs, names) in turn,
    several samples in one job (`workbench.backends.remote.run_samples`)."""
    return [server_run(model, inputs, names, plan) for inputs, names in jobs]


def server_run(model: ModelLike, inputs_by_image: dict, names: list, plan: ModelPlan) -> dict:
    """ON THE SERVER, inside the job's session: every listed condition of one sample, through the
    local backend's `run_conditions` (batched by `plan.batch_size`, as locally); returns
    {condition: {"tokens": {...}, "run": {...}}} of CPU float32 (int64 for token ids) tensors."""
    inputs = {mode: on_device(x, model.device, model.dtype) for mode, x in inputs_by_image.items()}
    with torch.inference_mode():
        results = run_conditions(model, inputs, [plan.condition(name) for name in names], plan, plan.batch_size)
    return {
        name: {part: {k: torch.from_numpy(v) for k, v in getattr(r, part).items()} for part in RunResult._fields}
        for name, r in results.items()
    }
