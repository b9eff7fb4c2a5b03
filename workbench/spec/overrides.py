"""Command-line overrides (``--models``, ``--data``, ``--limit``, ``--store``, ``--device``,
``--dtype``) applied to a validated :class:`Spec`: the copy is re-validated, and each problem names
the option responsible instead of a line of the file."""

from __future__ import annotations

from typing import Any, Sequence

from pydantic import ValidationError

from .problems import Problem, SpecError, SpecPath, _got
from .schema import Spec
from .translate import _translate


def _split_models(models: str | Sequence[str]) -> Any:
    if isinstance(models, str):
        return [m.strip() for m in models.split(",") if m.strip()]
    return list(models)


def _switch_source(data: dict, source: str) -> None:
    """Switch data source, dropping options the new source does not take."""
    if data.get("source") != source:
        if source == "builtin":
            data.pop("path", None)
        if source != "datbench":
            data.pop("exclude", None)
            data.pop("order", None)
    data["source"] = source


# Which CLI option is responsible for which part of the spec.
_CLI_OPTIONS: tuple[tuple[SpecPath, str], ...] = (
    (("models",), "--models"),
    (("data", "n"), "--limit"),
    (("data",), "--data"),
    (("store",), "--store"),
    (("backend", "device"), "--device"),
    (("backend", "dtype"), "--dtype"),
)


def _as_cli_problem(problem: Problem, applied: dict[str, Any] | None = None) -> Problem:
    if problem.path[:2] == ("data", "n") and "limit" not in (applied or {}):  # --data made the count (datbench: per config)
        return Problem(("--data",), None, problem.message)
    for prefix, option in _CLI_OPTIONS:
        if problem.path[: len(prefix)] == prefix:
            rest = problem.path[len(prefix) :] if option == "--models" else ()  # keep the list index
            return Problem((option, *rest), None, problem.message)
    return problem


def apply_overrides(
    base: Spec,
    models: str | Sequence[str] | None = None,
    data_source: str | None = None,
    limit: int | None = None,
    store_path: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
) -> Spec:
    """`Spec.with_overrides`: a copy of `base` with the overrides applied, re-validated, each
    problem naming its CLI option (``source`` "command line")."""
    data = base.model_dump(by_alias=True, exclude_none=True)
    applied: dict[str, Any] = {}
    problems: list[Problem] = []
    if models is not None:
        data["models"] = _split_models(models)
        applied["models"] = data["models"]
    if data_source is not None:
        _switch_source(data["data"], data_source)
        applied["data_source"] = data_source
    if limit is not None:
        if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
            data["data"]["n"] = min(data["data"]["n"], limit)
            applied["limit"] = limit
        else:
            problems.append(Problem(("--limit",), None, f"{_got(limit)}; expected an integer >= 1"))
    for value, section, key, name in (
        (store_path, "store", "path", "store_path"),
        (device, "backend", "device", "device"),
        (dtype, "backend", "dtype", "dtype"),
    ):
        if value is not None:
            data.setdefault(section, {})[key] = value
            applied[name] = value
    if problems:
        raise SpecError(problems, "command line")
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        found = [_as_cli_problem(p, applied) for p in _translate(exc, data, {})]
        raise SpecError(found, "command line") from None
    spec._carry_provenance(base, {**base._overrides, **applied})
    return spec
