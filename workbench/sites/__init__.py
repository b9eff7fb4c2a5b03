"""Sites: every named place in the forward pass, one module per site (`embed.py`, `layer.py`,
`attn_out.py`, ...), each declared with `register_site` (see `base`, which also holds the
residual-stream convention and how a site resolves to the live model). Importing this package
declares them all, and derives the lists the spec, the plan and the store use; those lists are in
forward order (by stage)."""

from __future__ import annotations

import importlib
import pkgutil

from .base import (LAYER_OUTPUT_PHASE, PROJECTOR_PART, PROJECTOR_PART_PREFIX, SITES, BatchRow, Site, batch_rows,
                   branch_output, connector_modules, first_tensor, is_projector_site, order, part_sites,
                   position_index, read_order, register_site, residual_envoy, site, site_modules, site_tensor,
                   to_device, token_rows)

__all__ = ["LAYER_OUTPUT_PHASE", "PROJECTOR_PART", "PROJECTOR_PART_PREFIX", "SITES", "BatchRow", "Site", "batch_rows",
           "branch_output", "connector_modules", "first_tensor", "is_projector_site", "order", "part_sites",
           "position_index", "read_order", "register_site", "residual_envoy", "site", "site_modules", "site_tensor",
           "to_device", "token_rows", "SITE_NAMES", "CAPTURE_SITES", "EDITABLE_SITES", "VISION_SITES",
           "PER_LAYER_SITES", "PROJECTOR_SITES", "SITE_STAGE", "VARIABLE_DIMS"]

# every module here but `base` and `readers` is one site: importing it declares it
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in ("base", "readers"):
        importlib.import_module(f"{__name__}.{_module}")
_ordered = sorted(SITES.values(), key=lambda s: (s.stage, s.phase))  # stable: else the modules' order
SITES.clear()
SITES.update((s.name, s) for s in _ordered)

# derived lists (the spec, plan and interventions use these; a site is added by its module only)
SITE_NAMES = tuple(SITES)
CAPTURE_SITES = tuple(n for n, s in SITES.items() if s.variable)
EDITABLE_SITES = tuple(n for n, s in SITES.items() if s.editable)
VISION_SITES = tuple(n for n, s in SITES.items() if s.vision)
PER_LAYER_SITES = tuple(n for n, s in SITES.items() if s.index)
PROJECTOR_SITES = tuple(n for n, s in SITES.items() if s.access == "modules")
SITE_STAGE = {n: s.stage for n, s in SITES.items()}
# dims of every stored capture variable, e.g. VARIABLE_DIMS["hidden"] == ("token", "layer", "dim")
VARIABLE_DIMS = {v: dims for s in SITES.values() for v, dims in s.stores.items()}
