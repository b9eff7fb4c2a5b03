"""The checks a remote run makes before its first job, and before its store is touched: the
API key, the server's Python and nnsight versions (GET /env), each model served (GET /status,
matched by repo id and revision); and the server's deployed models as `workbench ndif status`
lists them."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import nnsight

from .remote_config import RemoteConfig
from .remote_faults import ModelNotServedError, RemoteSetupError, with_retries

if TYPE_CHECKING:
    from ..models.model import ModelInfo

_DEPLOYED_LEVELS = ("HOT", "WARM")


def load_remote_model(info: ModelInfo, config: RemoteConfig, attn: str = "sdpa",
                      log: Callable[[str], None] = print) -> Any:
    """A `RemoteModel` for `info`, after `preflight` (the key, the versions, the served model);
    jobs are submitted under the key the server deploys it by."""
    from ..models.remote import RemoteModel

    model = RemoteModel(info, attn=attn, target=config.label)
    if not config.simulated:
        preflight(config, log)
        if config.check_served:
            model.served_key = served_key(model, config, log)
    return model


def prepare_remote(plans: list[Any], config: RemoteConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every check a remote run makes before its store is touched: the API key, the versions,
    each model served. Returns model id -> its `RemoteModel`."""
    refuse_unshippable(plans)
    if config.simulated:
        return {}
    require_key(config)
    return {plan.info.model_id: load_remote_model(plan.info, config, log=log) for plan in plans}


def refuse_unshippable(plans: list[Any]) -> None:
    """Plugin code that cannot travel is refused before any job, naming its import: an
    intervention kind a plan uses, or any site a plugin declared (the site registry travels
    whole), whose module imports what NDIF's whitelist does not allow (`workbench.backends.shipping`)."""
    from ..extend import kind_of, plugin_site_modules
    from .shipping import ndif_problem

    hint = "run this spec locally (without --remote), or import only what NDIF allows in the plugin"
    for plan in plans:
        for condition in plan.conditions:
            for item in condition.interventions:
                kind = kind_of(item)
                problem = kind.remote_problem() if kind is not None else None
                if kind is not None and problem is not None:
                    where = "runs locally only" if kind.builtin else f"comes from plugin module {kind.module!r}"
                    raise RemoteSetupError(f"condition {condition.name!r}: intervention kind {kind.name!r} {where}: "
                                           f"{problem}", hint=hint)
    for name, module in plugin_site_modules().items():
        problem = ndif_problem(module)
        if problem is not None:
            raise RemoteSetupError(f"site {name!r} comes from plugin module {module!r}: {problem}", hint=hint)


def plugin_modules(plan: Any) -> tuple[str, ...]:
    """The plugin modules a job of `plan` ships by value: its kinds' and every plugin site's."""
    from ..extend import kind_of, plugin_site_modules

    kinds = [kind_of(item) for condition in plan.conditions for item in condition.interventions]
    modules = [k.module for k in kinds if k is not None and not k.builtin] + list(plugin_site_modules().values())
    return tuple(dict.fromkeys(modules))


def require_key(config: RemoteConfig) -> str:
    """The API key, or RemoteSetupError before any connection is made."""
    key = config.key()
    if not key and not config.simulated:
        raise RemoteSetupError(f"no NDIF API key for {config.label}",
                               hint="set NDIF_API_KEY (create one at https://login.ndif.us)")
    return key


_CHECKED: dict[str, dict] = {}


def preflight(config: RemoteConfig, log: Callable[[str], None] = print) -> dict:
    """Before the first job (and before the store is touched): the API key is set, the server
    answers, and its Python minor version is this client's. Returns the server's environment
    (GET /env). Once per host and process."""
    require_key(config)
    if config.host in _CHECKED:
        return _CHECKED[config.host]
    env = with_retries(lambda: _get_env(config), config, f"environment of {config.label}", log)
    if env:
        check_versions(env, config.label, log=log)
    else:
        log(f"{config.label} does not report its Python and nnsight versions; the server checks them "
            "when the first job is submitted")
    _CHECKED[config.host] = env
    return env


def check_versions(env: dict, label: str, local_python: str | None = None, local_nnsight: str | None = None,
                   log: Callable[[str], None] = print) -> None:
    """RemoteSetupError, naming both versions, when NDIF would refuse this client: its Python
    minor version must equal the server's (NDIF answers HTTP 400 otherwise; nnsight 0.8.1 also
    ships code as bytecode). A different nnsight is only reported: NDIF checks it against a
    minimum that `/env` does not tell, and its own refusal is reported when it comes."""
    from packaging.version import InvalidVersion, Version

    local_python = local_python or sys.version.split()[0]
    local_nnsight = local_nnsight or nnsight.__version__
    remote_python = (str(env.get("python_version") or "").split() or [""])[0]
    if remote_python and remote_python.split(".")[:2] != local_python.split(".")[:2]:
        minor = ".".join(remote_python.split(".")[:2])
        raise RemoteSetupError(
            f"{label} runs Python {remote_python}, this client Python {local_python}: NDIF refuses a client "
            f"whose Python minor version differs", hint=f"run the workbench under Python {minor} for remote runs")
    remote_nnsight = str((env.get("packages") or {}).get("nnsight") or "")
    try:
        differs = bool(remote_nnsight) and Version(local_nnsight) != Version(remote_nnsight)
    except InvalidVersion:
        differs = False
    if differs:
        log(f"note: {label} runs nnsight {remote_nnsight}, this client nnsight {local_nnsight}")


def _get_env(config: RemoteConfig) -> dict:
    """GET /env (what `nnsight.compare()` reads); {} from a server that has no such endpoint."""
    import httpx

    try:
        return dict(_get_json(config, "/env") or {})
    except httpx.HTTPStatusError as error:
        if error.response.status_code in (404, 405):
            return {}
        raise


def _get_json(config: RemoteConfig, path: str) -> Any:
    import httpx

    response = httpx.get(f"{config.host}{path}", timeout=httpx.Timeout(10.0, read=config.status_timeout_s))
    response.raise_for_status()
    return response.json()


def served_models(config: RemoteConfig) -> dict[str, dict[str, Any]]:
    """The server's deployments (GET /status, what `nnsight.status()` reads): deployment -> entry."""
    return dict((_get_json(config, "/status") or {}).get("deployments", {}) or {})


def _key_fields(key: str) -> dict[str, Any]:
    import json

    try:
        return json.loads(key.split(":", 1)[1]) if ":" in key else {}
    except ValueError:
        return {}


def _revision(value: Any) -> str:
    return str(value) if value else "main"


def find_deployment(model_key: str, deployments: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The deployed (HOT or WARM) entry serving `model_key`'s checkpoint: the same repo id and
    revision (no revision = main), whatever class path or extra fields its key has (NDIF deploys
    as `...LanguageModel:{"repo_id", "revision"}`; nnsight 0.8.1 builds `TransformersModel:{...,
    "task"}`). An exact key match wins; among several deployments of the checkpoint, the one
    with the same task."""
    ours = _key_fields(model_key)
    candidates = []
    for name, entry in deployments.items():
        if entry.get("deployment_level", "HOT") not in _DEPLOYED_LEVELS:
            continue
        key = entry.get("model_key") or name
        fields = _key_fields(key)
        repo = entry.get("repo_id") or fields.get("repo_id")
        revision = entry.get("revision") if "revision" in entry else fields.get("revision")
        if key == model_key:
            return {**entry, "model_key": key}
        if repo == ours.get("repo_id") and _revision(revision) == _revision(ours.get("revision")):
            candidates.append({**entry, "model_key": key})
    # several deployments of one checkpoint (e.g. two tasks): the one with our task first
    candidates.sort(key=lambda e: (e.get("task") or _key_fields(e["model_key"]).get("task")) != ours.get("task"))
    return candidates[0] if candidates else None


def served_key(model: Any, config: RemoteConfig, log: Callable[[str], None] = print) -> str:
    """The key the server deploys `model` under; ModelNotServedError, listing what is served, if none."""
    deployments = with_retries(lambda: served_models(config), config, f"status of {config.label}", log)
    entry = find_deployment(model.model_key, deployments)
    if entry is not None:
        state = entry.get("application_state")
        if state and state != "RUNNING":
            log(f"{model.model_id}: deployed on {config.label} but {state}; jobs will queue until it runs")
        return entry["model_key"]
    served = sorted(status_rows(deployments), key=lambda d: d.repo)
    listing = "\n  ".join(f"{d.repo} (revision {d.revision}, task {d.task}, {d.state})" for d in served)
    fields = _key_fields(model.model_key)
    raise ModelNotServedError(
        f"{model.model_id}: {config.label} does not serve this model (repo {fields.get('repo_id')}, revision "
        f"{_revision(fields.get('revision'))}). Served models:\n  {listing or '(none)'}",
        hint="pick a served model (`workbench ndif status` lists them) or run locally (backend: {kind: local})")


class Deployment(NamedTuple):
    """A deployed model as `workbench ndif status` lists it (a row of its table, in this order)."""

    repo: str
    revision: str
    task: str
    level: str  # HOT or WARM
    state: str  # the application's state, e.g. RUNNING
    model_class: str


def status_rows(deployments: dict[str, dict[str, Any]]) -> list[Deployment]:
    """Each deployed (HOT or WARM) model of the server's /status `deployments`."""
    rows = []
    for name, entry in deployments.items():
        level = entry.get("deployment_level") or "?"
        if level not in _DEPLOYED_LEVELS:
            continue
        key = entry.get("model_key") or name
        fields = _key_fields(key)
        model_class = key.split(":", 1)[0].split(".")[-1] if ":" in key else "-"
        rows.append(Deployment(str(entry.get("repo_id") or fields.get("repo_id") or name),
                               _revision(entry.get("revision") or fields.get("revision")),
                               str(entry.get("task") or fields.get("task") or "-"), level,
                               str(entry.get("application_state") or "?"), model_class))
    return sorted(rows)


def status_table(config: RemoteConfig) -> str:
    """What `workbench ndif status` prints: the server's deployed models as a table."""
    deployments = with_retries(lambda: served_models(config), config, f"status of {config.label}", lambda _: None)
    rows = status_rows(deployments)
    header = ("model", "revision", "task", "level", "state", "class")
    if not rows:
        return f"{config.label}: no model is deployed"
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    lines = [f"{config.label}: {len(rows)} deployed model(s)"]
    lines += ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    return "\n".join(lines)
