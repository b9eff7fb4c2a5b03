"""The readers several sites share, and the copies every reader makes: a module's output per
position (`ModuleOutputCapture`), a per-layer sequence site (`LayerOutputCapture`), a vision-tower
site (`PatchCapture`) and K/V read from the cache (`CachedKVCapture`). A site's own reader lives in
its module. Shipped to NDIF servers: torch, numpy, typing and `Record` only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..models.protocol import ModelLike
from ..records import Record
from .base import batch_rows, order, read_order, site, site_tensor, token_rows

if TYPE_CHECKING:
    from ..capture import CapturePlan

if TYPE_CHECKING:  # torch is imported where a reader runs: `analyses` reads the site registry
    import torch  # (dims, phases) where torch is not installed


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 copy on the host, for reads after a forward (the KV cache)."""
    import torch
    # copy=True: on CPU in float32 `.to` would return the same tensor, which later in-place
    # edits could still change.
    return tensor.detach().to("cpu", dtype=torch.float32, copy=True)


def saved_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 copy of a value read inside a forward, left on the value's device: the trace
    moves what it saved to the host once the forward is done (`backends.local.trace_rows`). A
    copy to the host waits for every kernel launched so far, so one per read (~30 in a 2B
    model's forward) made the host wait for the GPU layer after layer instead of queueing the
    next layer's kernels (the 2026-11-30 H200 run: a traced forward with its reads 63-71 ms
    against a plain forward's 39-51). The copy itself: later in-place edits in the forward must
    not reach it."""
    import torch
    return tensor.detach().to(dtype=torch.float32, copy=True)


class ModuleOutputCapture(Record):
    """A per-position module output: `embed` (token embeddings, before image features are
    scattered in) or `final_norm` (the normed residual the LM head reads). Stored (token, dim)."""

    site: str
    _fields = ("site",)
    rows = "tokens"

    def targets(self) -> list[tuple[tuple[int, int, float], None]]:
        return [(order(self.site, None, 1), None)]

    def read(self, model: ModelLike, layer: None, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        saved.setdefault((self.site, None), []).append(saved_copy(token_rows(site_tensor(model, self.site), row)[0]))

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        """{variable: rows} of one run (the prompt may span two traces: kv_swap)."""
        import torch
        return {self.site: torch.cat(merged[(self.site, None)], dim=0).numpy()}


class LayerOutputCapture(Record):
    """A per-layer sequence site other than the residual stream, at each listed index: a decoder
    layer's `keys_pre`, `attn_out` or `mlp_out` (`decoder_layer` 0..L-1), or Qwen3-VL's
    `layer.pre_deepstack` (`layer` 0..L). Stored (token, layer dim, width)."""

    site: str
    layers: tuple[int, ...]
    _fields = ("site", "layers")
    rows = "tokens"

    def targets(self) -> list[tuple[tuple[int, int, float], int]]:
        return [(read_order(self.site, l), l) for l in self.layers]

    def read(self, model: Any, layer: int, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        tensor = token_rows(site_tensor(model, self.site, layer), row)
        saved.setdefault((self.site, layer), []).append(saved_copy(tensor[0]))

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        """{variable: (token, layer, width)}; a prompt over two traces (kv_swap) is joined."""
        import torch
        per_layer = [torch.cat(merged[(self.site, l)], dim=0) for l in self.layers]
        return {cast(str, site(self.site).variable): torch.stack(per_layer, dim=1).numpy()}  # a captured site's


class PatchCapture(Record):
    """A vision-tower site, one row per patch: `vision` (the tower's output as the connector
    receives it) or `vision_layer` (each listed tower layer's output). Read in the prompt forward
    only (decode steps do not run the tower), and not at all without an image (`image: none`)."""

    site: str
    layers: tuple[int, ...] | None
    _fields = ("site", "layers")
    _defaults = {"layers": None}
    prompt_only = True
    rows = "patches"

    def targets(self) -> list[tuple[tuple[int, int, float], int | None]]:
        if self.site == "vision_layer":
            return [(order(self.site, l, 1), l) for l in self.layers or ()]
        return [(order(self.site, None, 1), None)]

    def read(self, model: ModelLike, layer: int | None, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        if "pixel_values" not in inputs.encoding:
            return
        tensor = batch_rows(site_tensor(model, self.site, layer), row)
        if self.site == "vision_layer" and model.arch.tower_prefix_rows:   # (images, rows, dim): CLS dropped
            tensor = tensor[:, model.arch.tower_prefix_rows:]
        saved[(self.site, layer)] = [saved_copy(tensor.reshape(-1, tensor.shape[-1]))]

    def collect(self, merged: dict[Any, list[torch.Tensor]]) -> dict[str, np.ndarray]:
        import torch
        variable = cast(str, site(self.site).variable)  # a captured site stores one
        if self.site == "vision_layer" and self.layers:
            if (self.site, self.layers[0]) not in merged:
                return {}
            return {variable: torch.stack([merged[(self.site, l)][0] for l in self.layers], dim=1).numpy()}
        return {variable: merged[(self.site, None)][0].numpy()} if (self.site, None) in merged else {}


class CachedKVCapture(Record):
    """K and/or V of each listed layer, read from the KV cache after the prompt forward."""

    layers: tuple[int, ...]
    keys: bool
    values: bool
    _fields = ("layers", "keys", "values")
    _defaults = {"keys": True, "values": True}

    def read_cache(self, cache: Any, n_tokens: int, row: int = 0) -> dict[str, np.ndarray]:
        """(token, layer, kv) arrays of batch row `row` of the cache."""
        import torch
        out = {}
        for name, wanted in (("keys", self.keys), ("values", self.values)):
            if not wanted:
                continue
            per_layer = []
            for l in self.layers:
                tensor = getattr(cache.layers[l], name)[row, :, :n_tokens]      # (kv_heads, seq, hd)
                per_layer.append(to_host(tensor).permute(1, 0, 2).reshape(n_tokens, -1))
            out[name] = torch.stack(per_layer, dim=1).numpy()               # (token, layer, kv)
        return out




def add_kv(plan: CapturePlan, part: str, layers: tuple[int, ...]) -> str | None:
    """Capture `part` ("keys" or "values") of `layers` from the cache: one `CachedKVCapture`
    reads both, so they must share their layers."""
    if plan.kv is None:
        plan.kv = CachedKVCapture(layers, keys=part == "keys", values=part == "values")
        return None
    if tuple(plan.kv.layers) != tuple(layers):
        return "keys and values are captured at different layers; expected the same layers"
    plan.kv = plan.kv.replace(**{part: True})
    return None
