"""Experiment specs: YAML in, a validated :class:`Spec` out, every error located by line.

A spec is read with PyYAML's *safe* composer so that each value keeps the line it came
from, turned into plain Python data, and validated with pydantic.  Every pydantic error is
translated into a :class:`Problem` that names the field by its dotted path, the line it is
on and what was expected, so a researcher can fix a spec without reading a traceback::

    specs/demo.yaml:9: conditions.alpha.interventions[0].site: got 'projektor' (str) \
(did you mean 'projector'?); expected one of 'embed', 'vision', ...

The package, one concern a module (the flow of :func:`parse_spec`):

- ``yaml_lines``: YAML with line numbers (safe composer, plain data, each path's line);
- ``sizes``: the conditions and samples a spec asks for, counted before anything expands, and their limits;
- ``fields``: the vocabulary (sites, models, data sources, ...) and one validator per kind of field;
- ``kinds``: the bases of an intervention kind's fields, and the validator that finds an entry's kind
  in the registry (`workbench.extend`);
- ``schema``: the pydantic models and the checks across fields;
- ``sweeps``: a condition's sweep (a product, `zip` groups), its runs, their names and their validation;
- ``translate``: pydantic errors into located problems with "did you mean";
- ``problems``: :class:`Problem`, :class:`SpecError` and the phrases of every message;
- ``overrides``: the command line's overrides (``--models``, ``--data``, ``--limit``, ...);
- ``loading``: :func:`parse_spec` and :func:`load_spec`.

Everything public is re-exported here: import it from ``workbench.spec``.
"""

from typing import Any

from .fields import (  # noqa: F401  (re-exported)
    ADD_DIRECTIONS,
    DATA_SOURCES,
    DATBENCH_CONFIGS,
    IMAGE_MODES,
    KV_PART_SETS,
    KV_PARTS,
    NORMALIZE_TARGETS,
    PART_SITES,
    POSITION_GROUPS,
    RANDOM_NORMS,
    TINY_MODEL_NAMES,
    ConditionName,
    Layers,
    ModelRef,
    NonNegativeInt,
    Number,
    NumberOrVar,
    PathString,
    Positions,
    PositiveInt,
    Site,
    SpecName,
    capture_sites,
    editable_sites,
    known_sites,
    SweepValues,
    VarName,
)
from .loading import load_spec, parse_spec
from .problems import Problem, SpecError, SpecPath  # noqa: F401
from .sizes import Limits  # noqa: F401
from .kinds import InterventionSpec, KindSpec, kind_names  # noqa: F401
from .schema import (  # noqa: F401
    AnalysisSpec,
    BackendSpec,
    CaptureSpec,
    Condition,
    ConditionInstance,
    DataSpec,
    GenerateSpec,
    KVSwap,
    Spec,
    StoreSpec,
)

__all__ = [
    "KNOWN_SITES",
    "TINY_MODEL_NAMES",
    "DATBENCH_CONFIGS",
    "Problem",
    "SpecError",
    "Spec",
    "DataSpec",
    "Condition",
    "ConditionInstance",
    "KindSpec",
    "InterventionSpec",
    "KVSwap",
    "CaptureSpec",
    "GenerateSpec",
    "StoreSpec",
    "BackendSpec",
    "AnalysisSpec",
    "Limits",
    "load_spec",
    "parse_spec",
]


def __getattr__(name: str) -> Any:
    """KNOWN_SITES, CAPTURE_SITES, EDITABLE_SITES: the registry's sites when read (`fields`)."""
    from . import fields

    if name in ("KNOWN_SITES", "CAPTURE_SITES", "EDITABLE_SITES"):
        return getattr(fields, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
