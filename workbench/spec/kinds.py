"""The spec side of intervention kinds: the pydantic bases a kind's fields are declared on
(:class:`KindSpec`, :class:`InterventionSpec`), which of its fields take a '$variable'
(:func:`swept_fields`) and the validator of one `interventions` entry, which finds the entry's
model in the registry (`workbench.extend`) when the spec is validated: so a kind declared by a
plugin loaded from the spec's own `plugins` list is known to the conditions after it."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError

from .fields import LayersOrVar, PositionsOrVar, Site, Swept, _fail, _fail_many
from .problems import SpecPath, _did_you_mean, _got, _quoted


class SpecModel(BaseModel):
    # strict: "3" is not an int and true is not a number; forbid: typos are errors.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class KindSpec(SpecModel):
    """An intervention entry: its `kind` (each kind narrows it to `Literal["name"]`) and the site
    it edits."""

    kind: str  # declared here so it is listed first
    site: Site


class InterventionSpec(KindSpec):
    """An entry that selects positions and, at per-layer sites, layers (either may be swept)."""

    positions: PositionsOrVar = "all"
    layers: LayersOrVar = "all"  # only meaningful for per-layer sites


def swept_fields(model: type[BaseModel]) -> dict[str, Swept]:
    """{field: its `Swept` marker} of the fields whose type declares that they take a '$variable'."""
    return {name: marker for name, info in model.model_fields.items()
            for marker in info.metadata if isinstance(marker, Swept)}


def _kinds() -> dict[str, Any]:
    from ..extend import intervention_kinds  # the registry imports this module's bases

    return intervention_kinds()


def kind_names() -> tuple[str, ...]:
    return tuple(_kinds())


def _entry(value: Any) -> KindSpec:
    """One `interventions` entry, validated by its kind's model; every problem located in it."""
    kinds = _kinds()
    if not isinstance(value, dict):
        _fail(f"{_got(value)}; expected a mapping with a 'kind' ({_quoted(kinds)})")
    if "kind" not in value:
        _fail(f"missing required field 'kind'; expected one of {_quoted(kinds)}", "kind")
    kind = value["kind"]
    if not isinstance(kind, str) or kind not in kinds:
        _fail(f"{_got(kind)}{_did_you_mean(kind, kinds)}; expected one of {_quoted(kinds)}", "kind")
    model = kinds[kind].spec
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        from .translate import nested_problems  # translate reads the schema, which uses this module

        problems: list[tuple[SpecPath, str]] = nested_problems(exc, model)
        _fail_many(problems)


InterventionEntry = Annotated[Any, PlainValidator(_entry)]
