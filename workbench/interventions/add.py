"""`add`: add `factor` x a vector at the selected positions. The vector is given (`vector`, of the
model's width), taken from another condition (`direction_from`): the mean, over the selected
positions, of (source's value - this condition's value without this edit), a stored linear
probe's unit weight vector (`direction: {probe: STORE, label: FIELD, layer: L, class: C}`, read
from the store's `probe` analysis when the spec is validated: `workbench.probes`), or, as a control
for both, random (`direction: random`): n_t · u with u = `random_direction(seed, width)` (one
direction for every position and layer) and n_t = `norm`, or with norm "matched" the token's own
‖x_t‖ at the site, so the edit has the size of the value it edits.

A probe's direction is resolved to numbers before anything runs and travels in the intervention's
`vector`, by value, as a given vector does (a remote run never reads the store)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import numpy as np
import torch
from pydantic import Field, PlainSerializer, PlainValidator, PrivateAttr, ValidationError, model_validator

from ..extend import InterventionSpec, register_intervention
from ..sites import to_device
from ..spec.fields import (ADD_DIRECTIONS, RANDOM_NORMS, ConditionName, Number, NumberOrVar, PathString, Swept,
                           _as_float, _fail, _fail_many, is_var)
from ..spec.kinds import SpecModel
from ..spec.problems import SpecPath, _did_you_mean, _got, _quoted
from .base import Intervention

if TYPE_CHECKING:
    from ..models.model import ModelInfo


def _seed_or_var(value: Any) -> int | str:
    if is_var(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    _fail(f"{_got(value)}; expected a seed (an integer >= 0) or a '$variable'")


def _random_norm(value: Any) -> float | str:
    if isinstance(value, str) and (value in RANDOM_NORMS or is_var(value)):
        return value
    number = _as_float(value, f"a number > 0, {_quoted(RANDOM_NORMS)} or a '$variable'")
    if number <= 0:
        _fail(f"{_got(value)}; expected a number > 0, {_quoted(RANDOM_NORMS)} or a '$variable'")
    return number


class ProbeDirection(SpecModel):
    """`direction: {probe: STORE, label: FIELD, layer: L, class: C}`: the unit weight vector of class C
    of the probe of FIELD at layer L, as `workbench analyze STORE probe --label FIELD` stored it
    (`workbench.probes`); `group` (token group), `condition` (the condition it was trained on),
    `where` (its `--where`) and `model` (where the store holds probes of several) pick among them."""

    probe: PathString
    label: str
    layer: Annotated[int, Field(ge=0)]
    klass: str = Field(alias="class")
    group: str = "vision"
    condition: str = "baseline"
    where: str | None = None
    model: str | None = None
    _value: tuple[tuple[float, ...], str, str] | None = PrivateAttr(None)  # (unit vector, model, description)

    @model_validator(mode="after")
    def _read(self) -> "ProbeDirection":
        from workbench.probes import ProbeError, probe_direction  # absolute: this module travels by source

        try:
            value = probe_direction(self.probe, self.label, self.layer, self.klass, group=self.group,
                                    condition=self.condition, where=self.where, model=self.model)
        except ProbeError as err:
            _fail(str(err), err.field)
        self._value = (value.vector, value.model, value.source)
        return self

    @property
    def vector(self) -> tuple[float, ...]:
        assert self._value is not None
        return self._value[0]

    @property
    def trained_on(self) -> str:
        """The model whose activations the probe was fitted on."""
        assert self._value is not None
        return self._value[1]

    @property
    def source(self) -> str:
        assert self._value is not None
        return self._value[2]


def _direction(value: Any) -> str | ProbeDirection | None:
    """`direction`: `random`, or a mapping naming a stored probe (`ProbeDirection`); null (a dumped
    spec's default) for none."""
    if value is None or isinstance(value, ProbeDirection) or (isinstance(value, str) and value in ADD_DIRECTIONS):
        return value
    if isinstance(value, dict):
        try:
            return ProbeDirection.model_validate(value)
        except ValidationError as exc:
            from workbench.spec.translate import nested_problems  # (translate imports the spec schema)

            problems: list[tuple[SpecPath, str]] = nested_problems(exc, ProbeDirection)
            _fail_many(problems)
    _fail(f"{_got(value)}{_did_you_mean(value, ADD_DIRECTIONS)}; expected one of {_quoted(ADD_DIRECTIONS)} or a "
          "probe, {probe: STORE, label: FIELD, layer: L, class: C}")


def _dumped_direction(value: str | ProbeDirection | None) -> Any:
    return value.model_dump(by_alias=True) if isinstance(value, ProbeDirection) else value


class AddSpec(InterventionSpec):
    kind: Literal["add"]
    vector: list[Number] | None = None
    direction_from: ConditionName | None = None
    # a stored probe's unit weight vector, {probe: STORE, label: FIELD, layer: L, class: C} (optional:
    # group, condition, where, model), or `random`, the control for both: a seeded random unit
    # direction u, scaled to `norm` per token
    direction: Annotated[Union[Literal["random"], ProbeDirection, None], PlainValidator(_direction),
                         PlainSerializer(_dumped_direction)] = None
    seed: Annotated[Union[int, str], PlainValidator(_seed_or_var), Swept("seed")] = 0
    norm: Annotated[Union[float, str], PlainValidator(_random_norm), Swept("positive")] = "matched"
    factor: NumberOrVar = 1.0

    @model_validator(mode="after")
    def _one_direction(self) -> "AddSpec":
        given = [name for name in ("vector", "direction_from", "direction") if getattr(self, name) is not None]
        if len(given) != 1:
            what = "none" if not given else " and ".join(repr(g) for g in given)
            _fail(f"{what} of 'vector', 'direction_from', 'direction' given; expected exactly one of them "
                  "(a vector, a condition's mean difference, a probe's direction or direction: random)")
        if self.vector is not None and not self.vector:
            _fail("got an empty list; expected a non-empty vector", "vector")
        if self.direction != "random":  # (a dumped spec carries the defaults: only other values are refused)
            for name in ("seed", "norm"):
                if getattr(self, name) != type(self).model_fields[name].default:
                    _fail(f"'{name}' is only used with 'direction: random'; expected no '{name}' here", name)
        return self


def _vector_width(raw: AddSpec, info: ModelInfo) -> list[tuple[tuple[Any, ...], str]]:
    if raw.vector is not None and len(raw.vector) != info.hidden_size:
        return [(("vector",), f"a vector of {len(raw.vector)} numbers; expected {info.hidden_size} (the model width)")]
    if isinstance(raw.direction, ProbeDirection):
        probe = raw.direction
        if probe.trained_on != info.model_id:
            return [(("direction", "probe"), f"a probe of {probe.trained_on}'s activations; expected one of "
                     f"{info.model_id}'s, the model this condition runs (direction.model picks among a store's)")]
        if len(probe.vector) != info.hidden_size:
            return [(("direction", "probe"), f"a probe of width {len(probe.vector)}; expected {info.hidden_size} "
                     "(the model width)")]
    return []


def random_direction(seed: int, width: int) -> np.ndarray:
    """The unit direction of `direction: random`: g / ‖g‖ with g ~ N(0, I_width) drawn by numpy's
    PCG64 generator from `seed`, in float64: the same vector on any device or dtype."""
    g = np.random.default_rng(int(seed)).standard_normal(int(width))
    return g / np.linalg.norm(g)


@register_intervention(AddSpec, accesses=("sequence", "modules"), source="direction_from", check=_vector_width)
class Add(Intervention):
    """Add `factor` x a given, bound (source - own, averaged over positions) or random vector."""

    factor: float
    vector: tuple[float, ...] | None
    source: str | None
    direction: str | None
    seed: int
    norm: str | float
    probe: str | None  # where `vector` was read from (a stored probe), for the condition's identity
    bound: dict[int | None, torch.Tensor]
    _fields = Intervention._fields + ("factor", "vector", "source", "direction", "seed", "norm", "probe", "bound")
    _defaults = {**Intervention._defaults, "factor": 1.0, "vector": None, "source": None, "direction": None,
                 "seed": 0, "norm": "matched", "probe": None}
    _factories = {"bound": dict}
    _hidden = ("bound", "probe")  # the probe's numbers are in `vector`; the spec names where they came from

    def bind(self, values: dict[Any, torch.Tensor], own: dict[Any, torch.Tensor]) -> "Add":
        directions = {k: (values[k] - own[k]).mean(dim=0) for k in values}
        return self.replace(bound=directions)

    def random_step(self, x: torch.Tensor) -> torch.Tensor:
        """n_t · u for every row of x (before `factor`)."""
        u = to_device(torch.as_tensor(random_direction(self.seed, x.shape[-1])), x, x.dtype)
        size = x.norm(dim=-1, keepdim=True) if self.norm == "matched" else float(self.norm)
        return size * u

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        if self.direction == "random":
            return x + self.factor * self.random_step(x)
        if self.source is None:
            direction = to_device(torch.tensor(self.vector, dtype=x.dtype), x)
        else:
            direction = to_device(self.bound[layer], x, x.dtype)
        return x + self.factor * direction

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "Add":
        vector = tuple(float(v) for v in raw.vector) if raw.vector is not None else None
        norm = raw.norm if raw.norm == "matched" else float(raw.norm)
        # a probe (`ProbeDirection`) named by duck type: this class travels to NDIF by value, and a
        # reference to a pydantic model from its code would take pydantic's internals with it
        probe = raw.direction if raw.direction is not None and not isinstance(raw.direction, str) else None
        if probe is not None:
            vector = tuple(float(v) for v in probe.vector)
        return cls(**common, factor=float(raw.factor), vector=vector, source=raw.direction_from,
                   direction=None if probe is not None else raw.direction, seed=int(raw.seed), norm=norm,
                   probe=str(probe.source) if probe is not None else None)
