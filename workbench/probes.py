"""Probe directions for steering: the unit weight vector of a linear probe that the `probe` analysis
stored with a store, for an `add` intervention's `direction: {probe: STORE, label: FIELD, layer: L,
class: C}` (`workbench.interventions.add`).

Where a probe lives: `workbench analyze STORE probe --label FIELD` caches its result in the store's
analysis folder (`analyses.cache`: `<store>/_analyses/<model key>/probe/<fingerprint>/`, one xarray
Dataset per store state and parameters), and that result holds the probe fitted on every sample:
`weight (condition, group, layer, class, dim)` in the units of `hidden` (`analyses.probe`). A
reference names the store and the label; of the entries of that label (and `where`) the newest is
read, so the store stays the one source of the numbers. The vector is read here, when the spec
is validated, and travels inside the intervention by value (a remote run never reads the store).

Every problem is a `ProbeError` naming the reference's field at fault; nothing here imports the
`analyses` package (it imports this one's) or torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from .store import ANALYSES_GROUP, model_key

PROBE_ANALYSIS = "probe"  # the analysis name its cache entries are filed under


class ProbeError(ValueError):
    """A probe reference that names nothing stored: `field` is the reference's field at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class StoredProbe:
    """One cached `probe` result: where it is and what it was computed with."""

    path: Path          # the entry's folder
    store: Path
    model: str
    label: str
    where: str
    computed: str


@dataclass(frozen=True)
class ProbeDirectionValue:
    """A resolved reference: the unit vector, the model whose activations trained it, and a short
    description (which store, entry, label, condition, group, layer and class)."""

    vector: tuple[float, ...]
    model: str
    source: str


def stored_probes(store: Path) -> list[StoredProbe]:
    """Every cached `probe` entry of a local store, newest first."""
    found = []
    for meta in (store / ANALYSES_GROUP).glob(f"*/{PROBE_ANALYSIS}/*/zarr.json"):
        if meta.parent.name.startswith("."):   # an entry being written or replaced
            continue
        try:
            attrs = json.loads(meta.read_text()).get("attributes", {})
            params = json.loads(attrs.get("params") or "{}")
        except (OSError, ValueError):
            continue
        found.append(StoredProbe(meta.parent, store, str(attrs.get("model", "")), str(params.get("label", "")),
                                 str(params.get("where") or ""), str(attrs.get("computed", ""))))
    return sorted(found, key=lambda p: (p.computed, p.path.stat().st_mtime), reverse=True)


def find_probe(store: str, label: str, where: str | None = None, model: str | None = None) -> StoredProbe:
    """The newest stored probe of `label` (and `where`, `model`) in `store`; ProbeError otherwise."""
    from .objectstore import is_url

    if is_url(store):
        raise ProbeError("probe", f"got {store!r}: probes are stored beside a local store (the analysis cache); "
                         "expected the path of a local store")
    path = Path(store)
    if not path.is_dir():
        raise ProbeError("probe", f"got {store!r}: no store there; expected the path of a store the probe "
                         f"analysis has run on (workbench analyze STORE probe --label {label})")
    probes = stored_probes(path)
    if not probes:
        raise ProbeError("probe", f"{store} holds no probe; expected a probed store: run "
                         f"workbench analyze {store} probe --label {label}")
    if model is not None:
        probes = [p for p in probes if p.model == model or p.path.parent.parent.name == model_key(model)]
        if not probes:
            raise ProbeError("model", f"got {model!r}: {store} holds no probe of that model; expected one of "
                             f"{', '.join(sorted({repr(p.model) for p in stored_probes(path)}))}")
    of_label = [p for p in probes if p.label == label]
    if not of_label:
        held = ", ".join(sorted({repr(p.label) for p in probes}))
        raise ProbeError("label", f"got {label!r}: {store} holds no probe of it (probed: {held}); expected one of "
                         f"them, or run workbench analyze {store} probe --label {label}")
    chosen = [p for p in of_label if p.where == (where or "")]
    if not chosen:
        held = ", ".join(sorted({repr(p.where or None) for p in of_label}))
        raise ProbeError("where", f"got {where!r}: the probes of {label!r} in {store} were fitted with where = "
                         f"{held}; expected one of them")
    models = sorted({p.model for p in chosen})
    if len(models) > 1:
        raise ProbeError("model", f"{store} holds probes of {label!r} for several models ({', '.join(models)}); "
                         "expected 'model' naming one")
    return chosen[0]


def _labels(values: xr.DataArray) -> list[str]:
    return np.asarray(values.values).astype(object).astype(str).tolist()


def probe_direction(store: str, label: str, layer: int, klass: str, *, group: str = "vision",
                    condition: str = "baseline", where: str | None = None,
                    model: str | None = None) -> ProbeDirectionValue:
    """The unit weight vector of class `klass` of the probe of `label` at `layer` (token `group`,
    trained on `condition`), read from the newest matching entry of `store` (module doc)."""
    entry = find_probe(store, label, where, model)
    group_path = entry.path.relative_to(entry.store).as_posix()
    with xr.open_zarr(entry.store, group=group_path, consolidated=False, zarr_format=3, chunks=None) as result:
        weight = result["weight"]
        for name, value, held in (("condition", condition, _labels(result["condition"])),
                                  ("group", group, _labels(result["group"])),
                                  ("class", klass, _labels(result["class"]))):
            if value not in held:
                raise ProbeError(name, f"got {value!r}: the probe of {label!r} has no {name} of that name; "
                                 f"expected one of {', '.join(repr(h) for h in held)}")
        layers = [int(v) for v in np.asarray(result["layer"].values)]
        if layer not in layers:
            raise ProbeError("layer", f"got {layer}: the probe of {label!r} was not fitted at that layer; expected one "
                             f"of the layers probed ({', '.join(map(str, layers))})")
        at = {"condition": _labels(result["condition"]).index(condition), "group": _labels(result["group"]).index(group),
              "layer": layers.index(layer), "class": _labels(result["class"]).index(klass)}
        w = np.asarray(weight.isel(at).values, dtype=np.float64)
    norm = float(np.linalg.norm(w))
    if not np.isfinite(norm) or norm == 0.0:
        raise ProbeError("layer", f"the probe of {label!r} has no direction for class {klass!r} at layer {layer} "
                         f"({condition}, {group} tokens: fewer than two classes among its samples); expected a "
                         "layer, group and condition that were fitted")
    source = (f"probe of {label!r}{f' ({where})' if where else ''} in {store} (entry {entry.path.name}), "
              f"{condition}, {group} tokens, layer {layer}, class {klass!r}")
    return ProbeDirectionValue(tuple(float(v) for v in w / norm), entry.model, source)
