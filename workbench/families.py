"""`workbench families`: every registered family, what it is and what applies to it.

One entry per family (`family_entries`), derived, never written by hand:
- its model types and classes, tiny model and example hub id: the `Architecture` record (the model
  type is the transformers config class's own `model_type`);
- which sites apply, and why the others do not: each site is asked of the family through
  `compile_plan`, the check `workbench validate --models-check` runs (a capture of the site, or a
  `scale` edit of a site that is edited only), on a `ModelInfo` read from the family's config class
  at its defaults (no weights, nothing downloaded); a refusal's message is the reason;
- which interventions apply: each registered kind at the sites it may edit (`workbench.extend`)
  that the family has, and the conditions that are not edits (`kv_swap`, a blank image, no image),
  each asked through `compile_plan` the same way.

The docs' family table (docs/hooks/reference.py) is built from these entries, and
`workbench families --json` prints them.
"""

from __future__ import annotations

from typing import Any

from .records import Record

__all__ = ["FamilyEntry", "family_entries", "format_entries"]

# the conditions that are not intervention kinds, as a spec writes them
CONDITIONS: dict[str, dict[str, Any]] = {
    "kv_swap": {"kv_swap": {"donor": "baseline"}},
    "image: blank": {"image": "blank"},
    "image: none": {"image": "none"},
}


class FamilyEntry(Record):
    """One family as `workbench families` lists it. Fields:
    family; model_types (transformers `model_type`s); model_classes; tiny (its tiny model, or None);
    hub_id (an example checkpoint, or None); text_only
    sites: the sites that apply; sites_refused: {site: why not}
    interventions: {kind or condition: the sites it edits there (empty for a condition)};
    interventions_refused: {kind or condition: why not}"""

    _fields = ("family", "model_types", "model_classes", "tiny", "hub_id", "text_only", "sites", "sites_refused",
               "interventions", "interventions_refused")
    family: str
    model_types: list[str]
    model_classes: list[str]
    tiny: str | None
    hub_id: str | None
    text_only: bool
    sites: list[str]
    sites_refused: dict[str, str]
    interventions: dict[str, list[str]]
    interventions_refused: dict[str, str]

    def as_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields}


def _config_info(arch: Any) -> Any:
    """The family's `ModelInfo` at its config class's defaults (the real size; no weights)."""
    import transformers

    from .models.model import info_from_config

    config = getattr(transformers, arch.model_class).config_class()
    return info_from_config(arch.hub_id or arch.tiny or f"example/{arch.family}", "", config, arch)


def _refusals(info: Any, conditions: dict[str, dict[str, Any]], capture: list[dict[str, Any]]) -> list[Any]:
    """The problems (`Problem`, each located by its field path) for which `compile_plan` refuses a
    probe spec of these conditions and captures for this family (none: it compiles)."""
    from .plan import PlanError, compile_plan
    from .spec.loading import spec_from_data

    spec = spec_from_data({"name": "probe", "models": [info.model_id], "data": {"source": "builtin", "n": 1},
                           "conditions": {"baseline": {}, **conditions}, "capture": capture,
                           "store": {"path": "probe.zarr"}})
    try:
        compile_plan(spec, info)
    except PlanError as err:
        return list(err.problems)
    return []


def _reasons(problems: list[Any], prefix: tuple[Any, ...], model_id: str) -> str | None:
    """The messages of the problems located under `prefix` (a capture entry, a condition), joined."""
    found = [p.message.removeprefix(f"{model_id}: ") for p in problems if tuple(p.path[:len(prefix)]) == prefix]
    return "; ".join(dict.fromkeys(found)) or None


def _site_refusals(info: Any) -> dict[str, str | None]:
    """{site: why the family lacks it, or None} for every site and the family's connector parts: one
    probe captures every site that can be captured, another edits (`scale`) each one that is only
    edited, a condition each (compiling checks each capture entry and each condition on its own)."""
    from . import sites

    names = list(sites.SITES) + [sites.PROJECTOR_PART_PREFIX + p for p in info.arch.projector_parts]
    captured = [n for n in names if sites.site(n).variable]
    edited = [n for n in names if not sites.site(n).variable and sites.site(n).editable]
    problems = _refusals(info, {}, [{"site": n} for n in captured])
    out: dict[str, str | None] = {n: None for n in names}
    out.update({n: _reasons(problems, ("capture", i), info.model_id) for i, n in enumerate(captured)})
    edits = {f"edit{i}": {"interventions": [{"kind": "scale", "site": n, "factor": 2}]} for i, n in enumerate(edited)}
    problems = _refusals(info, edits, [{"site": "logits"}])
    out.update({n: _reasons(problems, ("conditions", f"edit{i}"), info.model_id) for i, n in enumerate(edited)})
    return out


def _condition_refusals(info: Any) -> dict[str, str | None]:
    """{condition that is not an edit: why the family refuses it, or None}."""
    probes = {f"probe{i}": condition for i, condition in enumerate(CONDITIONS.values())}
    problems = _refusals(info, probes, [{"site": "logits"}])
    return {name: _reasons(problems, ("conditions", f"probe{i}"), info.model_id) for i, name in enumerate(CONDITIONS)}


def _kind_sites(kind: Any, applies: list[str]) -> list[str]:
    """The family's sites that `kind` may edit (its `sites`, else every editable site of an
    access it acts at; connector parts are `modules`)."""
    from . import sites

    allowed = kind.sites or [n for n in applies if sites.site(n).editable and sites.site(n).access in kind.accesses]
    return [n for n in applies if n in allowed]


def family_entry(arch: Any) -> FamilyEntry:
    import transformers

    from . import sites
    from .extend import intervention_kinds

    info = _config_info(arch)
    refusals = _site_refusals(info)
    applies = [n for n, why in refusals.items() if why is None]
    interventions: dict[str, list[str]] = {}
    refused: dict[str, str] = {}
    for name, kind in intervention_kinds().items():
        at = _kind_sites(kind, applies)
        if at:
            interventions[name] = at
        else:
            wanted = kind.sites or [n for n, s in sites.SITES.items() if s.editable and s.access in kind.accesses]
            refused[name] = (f"edits only {', '.join(wanted)}, which {arch.family} lacks ("
                             + "; ".join(f"{n}: {refusals[n]}" for n in wanted if refusals.get(n)) + ")")
    for name, why in _condition_refusals(info).items():
        if why is None:
            interventions[name] = []
        else:
            refused[name] = why
    model_class = getattr(transformers, arch.model_class)
    return FamilyEntry(family=arch.family, model_types=[model_class.config_class.model_type],
                       model_classes=list(arch.config_architectures), tiny=arch.tiny, hub_id=arch.hub_id,
                       text_only=not arch.is_multimodal, sites=applies,
                       sites_refused={n: why for n, why in refusals.items() if why is not None},
                       interventions=interventions, interventions_refused=refused)


def family_entries() -> list[FamilyEntry]:
    """One entry per registered family, in registry order (a family's several descriptions merged)."""
    from .models.architectures import ARCHITECTURES

    entries: dict[str, FamilyEntry] = {}
    for arch in ARCHITECTURES:
        entry = family_entry(arch)
        first = entries.get(arch.family)
        if first is None:
            entries[arch.family] = entry
        else:  # another class of the same family: its types and classes join the first's
            entries[arch.family] = first.replace(
                model_types=list(dict.fromkeys(first.model_types + entry.model_types)),
                model_classes=list(dict.fromkeys(first.model_classes + entry.model_classes)))
    return list(entries.values())


def format_entries(entries: list[FamilyEntry]) -> str:
    """The listing as text, one block per family."""
    blocks = []
    for e in entries:
        lines = [f"{e.family}  (model type {', '.join(e.model_types)}; {', '.join(e.model_classes)})"
                 + ("  text only" if e.text_only else ""),
                 f"  tiny model: {e.tiny or 'none'}    example: {e.hub_id or 'none'}",
                 f"  sites: {', '.join(e.sites)}"]
        lines += [f"    not {site}: {why}" for site, why in e.sites_refused.items()]
        lines.append(f"  interventions: {', '.join(e.interventions)}")
        lines += [f"    not {name}: {why}" for name, why in e.interventions_refused.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
