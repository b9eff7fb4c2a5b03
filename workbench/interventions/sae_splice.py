"""`sae_splice`: replace the site's value at the selected positions by a sparse autoencoder's
reconstruction of it, x -> decode(encode(x)), as SAELens's own evaluation splices an SAE into a
forward pass to measure the next-token KL (sae-lens 6.54 sae_lens/evals.py, `get_recons_loss`'s
`standard_replacement_hook`). The SAE is any directory in SAELens's format (`sae`: cfg.json and
sae_weights.safetensors, as `workbench sae train` writes), loaded by `sae_lens.SAE.load_from_disk`.

The `compare` analysis measures the splice's effect on the output (KL from the reference), and the
`sae` analysis reports it beside the SAE's reconstruction error. A spec entry:
`{kind: sae_splice, site: layer, layers: [2], positions: vision, sae: saes/layer2}`.

Needs the optional extra `sae` (SAELens), checked when the spec is validated; runs locally (the
SAE's code is not on NDIF's import whitelist).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import model_validator

from ..extend import InterventionSpec, register_intervention
from ..sae import INSTALL_HINT   # at module level: a function-level relative import cannot travel to NDIF
from ..spec.fields import _fail
from .base import Intervention

if TYPE_CHECKING:
    from sae_lens import SAE

    from ..models.model import ModelInfo

SAE_CONFIG = "cfg.json"     # sae_lens.constants.SAE_CFG_FILENAME (6.54)

# one loaded SAE per (directory, device, dtype) in this process: a run applies it at every forward
_LOADED: dict[tuple[str, str, str], SAE] = {}


def sae_config(path: str | Path) -> dict[str, object]:
    """The SAE's cfg.json (d_in, d_sae, architecture, metadata)."""
    return dict(json.loads((Path(path) / SAE_CONFIG).read_text()))


class SaeSpliceSpec(InterventionSpec):
    kind: Literal["sae_splice"]
    sae: str    # a directory in SAELens's format

    @model_validator(mode="after")
    def _readable(self) -> "SaeSpliceSpec":
        if not (Path(self.sae) / SAE_CONFIG).is_file():
            _fail(f"got {self.sae!r}; expected a directory holding an SAE in SAELens's format ({SAE_CONFIG} "
                  "and sae_weights.safetensors, e.g. from `workbench sae train`)", "sae")
        try:
            import sae_lens  # noqa: F401
        except ImportError:
            _fail(f"sae_splice needs SAELens, the optional extra 'sae': {INSTALL_HINT}", "kind")
        return self


def _width(raw: SaeSpliceSpec, info: ModelInfo) -> list[tuple[tuple[Any, ...], str]]:
    d_in = sae_config(raw.sae).get("d_in")
    if d_in != info.hidden_size:
        return [(("sae",), f"an SAE of width {d_in}; expected {info.hidden_size} (the model width)")]
    return []


def load_sae(path: str, device: torch.device, dtype: torch.dtype) -> SAE:
    """`sae_lens.SAE.load_from_disk(path)` on `device` in `dtype`, once per process."""
    key = (str(Path(path).resolve()), str(device), str(dtype))
    if key not in _LOADED:
        from sae_lens import SAE

        _LOADED[key] = SAE.load_from_disk(path, device=str(device)).to(dtype=dtype).eval()
    return _LOADED[key]


@register_intervention(SaeSpliceSpec, accesses=("sequence", "branch"), check=_width,
                       local_only="it loads the SAE with SAELens, which is not on NDIF's import whitelist")
class SaeSplice(Intervention):
    """Replace the selected rows by the SAE's reconstruction decode(encode(x))."""

    sae: str
    _fields = Intervention._fields + ("sae",)
    _defaults = {**Intervention._defaults, "sae": ""}

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        sae = load_sae(self.sae, x.device, x.dtype)
        with torch.no_grad():
            return sae.decode(sae.encode(x)).to(x.dtype)

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "SaeSplice":
        return cls(**common, sae=str(raw.sae))
