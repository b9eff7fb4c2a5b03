"""Sites: every named place in the forward pass, one module per site (`embed.py`, `layer.py`,
`attn_out.py`, ...), each declared with `register_site` (see `base`, which also holds the
residual-stream convention and how a site resolves to the live model). Importing this package
declares them all; the lists the spec, the plan and the store use are derived from the registry
when read (a plugin's site included), in forward order (by stage)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from .base import (LAYER_OUTPUT_PHASE, PROJECTOR_PART, PROJECTOR_PART_PREFIX, SITES, BatchRow, Site, batch_rows,
                   branch_output, capture_sites, connector_modules, editable_sites, first_tensor, is_projector_site,
                   order, part_sites, position_index, read_order, register_site, residual_envoy, site, site_modules,
                   site_names, site_tensor, to_device, token_rows, variable_dims)

__all__ = ["LAYER_OUTPUT_PHASE", "PROJECTOR_PART", "PROJECTOR_PART_PREFIX", "SITES", "BatchRow", "Site", "batch_rows",
           "branch_output", "capture_sites", "connector_modules", "editable_sites", "first_tensor",
           "is_projector_site", "order", "part_sites", "position_index", "read_order", "register_site",
           "residual_envoy", "site", "site_modules", "site_names", "site_tensor", "to_device", "token_rows",
           "variable_dims", "SITE_NAMES", "CAPTURE_SITES", "EDITABLE_SITES", "VISION_SITES", "PER_LAYER_SITES",
           "PROJECTOR_SITES", "SITE_STAGE", "VARIABLE_DIMS"]

# every module here but `base` and `readers` is one site: importing it declares it
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in ("base", "readers"):
        importlib.import_module(f"{__name__}.{_module}")

# derived lists, computed from the registry when read (PEP 562), so they include the sites that
# plugins register later; code of the workbench calls the functions above
_DERIVED = {
    "SITE_NAMES": site_names,
    "CAPTURE_SITES": capture_sites,
    "EDITABLE_SITES": editable_sites,
    "VISION_SITES": lambda: tuple(n for n, s in SITES.items() if s.vision),
    "PER_LAYER_SITES": lambda: tuple(n for n, s in SITES.items() if s.index),
    "PROJECTOR_SITES": lambda: tuple(n for n, s in SITES.items() if s.access == "modules"),
    "SITE_STAGE": lambda: {n: s.stage for n, s in SITES.items()},
    "VARIABLE_DIMS": variable_dims,
}


def __getattr__(name: str) -> Any:
    if name in _DERIVED:
        return _DERIVED[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
