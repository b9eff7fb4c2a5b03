"""The remote backend, client side: the same plan, executed on an NDIF server through nnsight
remote execution. What runs THERE is `workbench.backends.ndif_job` (and what it reaches).

What runs where:
- here (the client): the spec, the plan, the prompts encoded with the model's own processor
  (`RemoteModel`, no weights), the checks before the first job (`prepare_remote`: API key,
  Python and nnsight versions against the server's `/env`, the served deployment matched by
  repo id and revision in `/status`), retries, and the store;
- there (the server): ONE job per sample, an nnsight session whose body calls
  `ndif_job.server_run`: the sample's conditions not yet stored, through the local backend's
  `run_conditions` as is (batched by `backend.batch_size` as locally; source conditions for `patch` / `add direction_from`, greedy
  decode steps, `kv_swap`, whose KV caches never leave the server), against the server's model.
  Captures are cast to float32 inside the traces and moved to CPU after each (as locally); only they come
  back, per condition.

How the code gets there: nnsight serializes the session body with cloudpickle, functions by
their source. `workbench` is not installed on NDIF, so while a job is serialized the package is
registered for pickling by value (`cloudpickle.register_pickle_by_value`): every workbench
function and class the body reaches travels in the payload. NDIF unpickles and runs it inside a
module and builtin whitelist (ndif-team/ndif at 028db44, src/services/ray/src/ray/nn/security/protected_environment.py), which is why that code uses
`Record`s, not dataclasses, and imports only torch, numpy, nnsight and typing (see
`ndif_job`). Two more patterns do not survive the trip: a function wrapped by a decorator using
`functools.wraps` (nnsight reads the wrapped function's source but keeps the wrapper's globals),
so `run_condition` travels undecorated and `server_run` enters inference mode itself; and a
function-level relative import (no package on the server). Contract tests check all of it
(tests/test_remote.py, tests/test_ndif_sandbox.py).

Faults: transient ones (connection refused or dropped, HTTP 5xx/429, a websocket cut, a job lost
while polling, timeouts) are retried with exponential backoff up to `max_tries` submissions of the
sample; permanent ones (a refused API key, a 403, a host name that does not resolve, a model the
server does not serve, a refused version, an error inside the trace) stop the run at once with a
`RemoteRunError`. Either way every sample already written stays in the store and a rerun resumes
after it. The API key never enters the payload, the store, provenance, logs or error messages
(messages are scrubbed).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import nnsight
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..errors import BadInputError, RemoteError
from .local import RunResult
from .ndif_job import run_condition as _run_condition, server_run as _server_run  # noqa: F401

_SHIPPED_PACKAGES = ("workbench",)
_DEPLOYED_LEVELS = ("HOT", "WARM")
_TRANSIENT_JOB_ERRORS = ("temporarily unavailable", "try again", "reconnecting", "connection reset",
                         "timed out", "timeout")
_NOT_SERVED = ("not a scheduled model", "is not served", "hotswapping is not supported")


# --------------------------------------------------------------------------- configuration


class RemoteEnv(BaseSettings):
    """WORKBENCH_REMOTE_TRIES (submissions per sample, >= 1), WORKBENCH_REMOTE_BACKOFF_S (first
    wait between tries), WORKBENCH_REMOTE_POLL (1 = poll for results instead of a websocket),
    WORKBENCH_REMOTE_CHECK_SERVED (0 = skip the served-model check); unset or empty = default."""

    model_config = SettingsConfigDict(env_prefix="WORKBENCH_REMOTE_", env_ignore_empty=True, extra="ignore")

    tries: Optional[int] = Field(default=None, ge=1)
    backoff_s: Optional[float] = Field(default=None, ge=0)
    poll: Optional[bool] = None
    check_served: Optional[bool] = None

    @classmethod
    def read(cls) -> "RemoteEnv":
        import pydantic

        try:
            return cls()
        except pydantic.ValidationError as error:
            problems = "; ".join(f"WORKBENCH_REMOTE_{str(e['loc'][0]).upper()}={e.get('input')!r}: {e['msg']}"
                                 for e in error.errors())
            raise BadInputError(f"bad remote setting: {problems}") from None


@dataclass
class RemoteConfig:
    """Where and how remote jobs run.

    target: True = NDIF (`NDIF_HOST`, else nnsight's `CONFIG.API.HOST`); "local" = nnsight's
    in-process simulation of the remote path (serialize, deserialize with user modules hidden,
    run here); a URL ("http://127.0.0.1:8000") = that server.
    api_key: None = `NDIF_API_KEY`, else `CONFIG.API.APIKEY`.
    Retries: a sample is submitted at most `max_tries` times; waits `backoff_s`, doubling up to
    `max_backoff_s`, between tries. blocking: wait on nnsight's websocket (True) or poll
    (False: then `poll_interval_s`, `lost_after_s` without any status = job lost, retried, and
    `job_timeout_s` in all, None = no limit).
    """

    target: bool | str = True
    api_key: str | None = field(default=None, repr=False)
    max_tries: int = 5
    backoff_s: float = 2.0
    max_backoff_s: float = 60.0
    blocking: bool = True
    poll_interval_s: float = 1.0
    lost_after_s: float = 120.0
    job_timeout_s: float | None = None
    check_served: bool = True
    status_timeout_s: float = 30.0

    @classmethod
    def from_env(cls, target: bool | str = True, **overrides: Any) -> "RemoteConfig":
        """Defaults overridden by the WORKBENCH_REMOTE_* environment (`RemoteEnv`), then by
        `overrides`. A malformed value is bad input (one message naming the variable)."""
        values: dict[str, Any] = {}
        env = RemoteEnv.read()
        if env.tries is not None:
            values["max_tries"] = env.tries
        if env.backoff_s is not None:
            values["backoff_s"] = env.backoff_s
        if env.poll is not None:
            values["blocking"] = not env.poll
        if env.check_served is not None:
            values["check_served"] = env.check_served
        return cls(target=target, **{**values, **overrides})

    @classmethod
    def resolve(cls, remote: Any, backend_kind: str = "local") -> "RemoteConfig | None":
        """The config for `run_spec(remote=...)`: None/False defer to / override the spec's
        `backend.kind`; True, "local", a URL or a RemoteConfig select remote execution."""
        if isinstance(remote, RemoteConfig):
            return remote
        if remote is None:
            return cls.from_env(True) if backend_kind == "remote" else None
        if remote is False:
            return None
        if remote is True or isinstance(remote, str):
            return cls.from_env(remote)
        raise TypeError(f"remote: expected True, 'local', a URL or a RemoteConfig, got {type(remote).__name__}")

    @property
    def simulated(self) -> bool:
        return self.target == "local"

    @property
    def host(self) -> str:
        """The server URL (without a trailing slash)."""
        if isinstance(self.target, str) and self.target != "local":
            host = self.target
        else:
            from nnsight import CONFIG

            host = os.environ.get("NDIF_HOST") or CONFIG.API.HOST
        return str(host).rstrip("/")

    def key(self) -> str:
        if self.api_key:
            return self.api_key
        from nnsight import CONFIG

        return os.environ.get("NDIF_API_KEY") or CONFIG.API.APIKEY or ""

    @property
    def label(self) -> str:
        """Where jobs run, safe to store and print (no credentials)."""
        return "nnsight local simulation" if self.simulated else _strip_userinfo(self.host)

    def describe(self) -> dict[str, Any]:
        return {"kind": "remote", "target": self.label, "blocking": self.blocking, "max_tries": self.max_tries}


# --------------------------------------------------------------------------- errors


class RemoteRunError(RemoteError, RuntimeError):
    """A remote run stopped. Everything already written to the store is kept; rerun to resume."""


class RemoteAuthError(RemoteRunError):
    """The server refused the API key."""


class ModelNotServedError(RemoteRunError):
    """The server does not serve this model."""


class RemoteJobError(RemoteRunError):
    """The job failed on the server: an error inside the trace (not retried)."""


class RemoteUnavailableError(RemoteRunError):
    """Transient faults outlasted every try."""


@dataclass
class _Fault:
    transient: bool
    kind: type[RemoteRunError]
    message: str


class _JobLost(Exception):
    """A polled job that no status came back for (the server forgot it)."""


def _strip_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def scrub(text: str, *secrets: str | None) -> str:
    """`text` with every secret (API keys; credentials in URLs) replaced by ***."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def _status_code(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    code = getattr(response, "status_code", None)
    if code is None:
        code = getattr(error, "status_code", None)  # websocket.WebSocketBadStatusException
    return int(code) if isinstance(code, int) else None


_KEY_REFUSED = ("api key", "apikey", "api-key", "unauthorized", "not authenticated")


def _http_fault(code: int, detail: str) -> _Fault:
    lowered = detail.lower()
    if code == 401 or (code == 403 and any(marker in lowered for marker in _KEY_REFUSED)):
        return _Fault(False, RemoteAuthError, f"the server refused the API key (HTTP {code}): {detail}")
    if code == 400 and "version" in lowered and ("python" in lowered or "nnsight" in lowered):
        # NDIF's version rule (its api dependencies.py), when no /env told us before submitting
        return _Fault(False, RemoteSetupError, f"the server refused this client's versions (Python "
                      f"{sys.version.split()[0]}, nnsight {nnsight.__version__}): {detail}")
    if code == 403 and any(marker in lowered for marker in _NOT_SERVED):
        return _Fault(False, ModelNotServedError, f"the server does not serve this model (HTTP 403): {detail}")
    if code == 403:
        # a 403 whose body says nothing of the key (a proxy, a quota, a ban): say what it said
        return _Fault(False, RemoteRunError, f"the server refused the request (HTTP 403): {detail or 'no reason given'}")
    if code >= 500 or code in (408, 425, 429):
        return _Fault(True, RemoteUnavailableError, f"server unavailable (HTTP {code}): {detail}")
    return _Fault(False, RemoteRunError, f"the server rejected the request (HTTP {code}): {detail}")


def classify(error: BaseException) -> _Fault:
    """Transient or permanent, and what to tell the user, for an exception of a remote job (the
    0.8.1 client's exception types per fault are listed in tests/test_ndif_server.py)."""
    import httpx
    import pydantic
    import websocket
    from nnsight.intervention.backends.remote import RemoteError

    text = str(error).strip() or type(error).__name__
    if _dns_failure(error):
        # the host name does not resolve: retrying will not fix a typo in NDIF_HOST / --remote
        return _Fault(False, RemoteRunError, f"cannot resolve the server's host name: {text}")
    if isinstance(error, RemoteError):
        cause = error.__cause__
        if isinstance(cause, httpx.HTTPStatusError):
            return _http_fault(cause.response.status_code, text.removeprefix("Failed to send request: "))
        if isinstance(cause, httpx.HTTPError):
            return _Fault(True, RemoteUnavailableError, f"cannot reach the server: {text}")
        lowered = text.lower()
        if any(marker in lowered for marker in _NOT_SERVED):
            return _Fault(False, ModelNotServedError, f"the server does not serve this model: {_tail(text)}")
        if any(marker in lowered for marker in _TRANSIENT_JOB_ERRORS) and "Traceback" not in text:
            return _Fault(True, RemoteUnavailableError, f"the job failed on the server: {_tail(text)}")
        return _Fault(False, RemoteJobError, f"the job failed on the server (an error inside the trace):\n{text}")
    if isinstance(error, httpx.HTTPStatusError):
        return _http_fault(error.response.status_code, text)
    if isinstance(error, websocket.WebSocketBadStatusException):
        code = _status_code(error)
        body = getattr(error, "resp_body", None)
        body = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
        return _http_fault(code, f"{text} {body}".strip()) if code else _Fault(True, RemoteUnavailableError, text)
    if isinstance(error, (httpx.TransportError, websocket.WebSocketException, OSError, _JobLost)):
        # refused, reset, dropped mid-job, timed out, lost
        return _Fault(True, RemoteUnavailableError, f"connection to the server failed: {type(error).__name__}: {text}")
    if isinstance(error, pydantic.ValidationError):
        # the 0.8.1 client parses a websocket close frame as a status message
        return _Fault(True, RemoteUnavailableError, "the server closed the connection mid-job")
    return _Fault(False, RemoteRunError, f"unexpected error in the remote run: {type(error).__name__}: {text}")


def _dns_failure(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is a failed host name lookup."""
    import socket

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, socket.gaierror):
            return True
        if "Name or service not known" in str(error) or "nodename nor servname" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _tail(text: str, lines: int = 3) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def with_retries(attempt: Callable[[], Any], config: RemoteConfig, what: str,
                 log: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep) -> Any:
    """Call `attempt` until it succeeds, a permanent fault occurs, or `config.max_tries` calls
    failed on transient faults (then RemoteUnavailableError), waiting `backoff_s`, doubling up
    to `max_backoff_s`, between calls (tenacity). Messages name `what`, never the key."""
    import tenacity

    key, tries = config.key(), max(1, int(config.max_tries))

    def transient(error: BaseException) -> bool:
        return isinstance(error, Exception) and not isinstance(error, RemoteRunError) and classify(error).transient

    def announce(state: tenacity.RetryCallState) -> None:
        message = scrub(classify(state.outcome.exception()).message, key)
        log(f"{what}: {message.splitlines()[0]}; retry {state.attempt_number + 1} of {tries} "
            f"in {state.next_action.sleep:.3g}s")

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(tries),
        wait=tenacity.wait_exponential(multiplier=config.backoff_s, max=config.max_backoff_s),
        retry=tenacity.retry_if_exception(transient), before_sleep=announce, sleep=sleep, reraise=True)
    try:
        return retrying(attempt)
    except RemoteRunError:
        raise
    except Exception as error:  # noqa: BLE001  (classified below; KeyboardInterrupt passes)
        fault = classify(error)
        message = scrub(fault.message, key)
        if not fault.transient:
            raise fault.kind(f"{what}: {message}") from None
        raise RemoteUnavailableError(f"{what}: {message} (gave up after {tries} tries)") from None


# --------------------------------------------------------------------------- checks before the first job


class RemoteSetupError(RemoteRunError, BadInputError):
    """The remote run cannot start as configured (no API key, a Python or nnsight version the
    server refuses): fixed on this side, before anything is submitted."""

    exit_code = BadInputError.exit_code


def load_remote_model(info: Any, config: RemoteConfig, attn: str = "sdpa",
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
    refuse_local_kinds(plans)
    if config.simulated:
        return {}
    require_key(config)
    return {plan.info.model_id: load_remote_model(plan.info, config, log=log) for plan in plans}


def refuse_local_kinds(plans: list[Any]) -> None:
    """Intervention kinds whose code cannot travel (a plugin's: only the workbench's own modules
    are shipped by value, `shipped_by_value`) are refused before any job."""
    from ..extend import kind_of

    for plan in plans:
        for condition in plan.conditions:
            for item in condition.interventions:
                kind = kind_of(item)
                if kind is not None and not kind.remote:
                    raise RemoteSetupError(
                        f"condition {condition.name!r}: intervention kind {kind.name!r} comes from plugin module "
                        f"{kind.module!r}, whose code is not shipped to NDIF; expected built-in kinds only "
                        "in a remote run", hint="run this spec locally (without --remote)")


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
    served = sorted(status_rows(deployments), key=lambda r: r[0])
    listing = "\n  ".join(f"{repo} (revision {rev}, task {task}, {state})" for repo, rev, task, _, state, _ in served)
    fields = _key_fields(model.model_key)
    raise ModelNotServedError(
        f"{model.model_id}: {config.label} does not serve this model (repo {fields.get('repo_id')}, revision "
        f"{_revision(fields.get('revision'))}). Served models:\n  {listing or '(none)'}",
        hint="pick a served model (`workbench ndif status` lists them) or run locally (backend: {kind: local})")


def status_rows(deployments: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str, str, str]]:
    """(repo id, revision, task, level, state, model class) of each deployed model."""
    rows = []
    for name, entry in deployments.items():
        level = entry.get("deployment_level") or "?"
        if level not in _DEPLOYED_LEVELS:
            continue
        key = entry.get("model_key") or name
        fields = _key_fields(key)
        model_class = key.split(":", 1)[0].split(".")[-1] if ":" in key else "-"
        rows.append((str(entry.get("repo_id") or fields.get("repo_id") or name),
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
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"{config.label}: {len(rows)} deployed model(s)"]
    lines += ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    return "\n".join(lines)


def images_needed(plan: Any, names: list[str]) -> list[str]:
    """Image modes (real/blank/none) of `names` and of the conditions they read from."""
    return sorted({condition.image for condition in conditions_needed(plan, names)})


def conditions_needed(plan: Any, names: list[str]) -> list[Any]:
    """The plans of `names` and of the conditions they read from (sources, kv_swap donors)."""
    needed: dict[str, Any] = {}
    stack = list(names)
    while stack:
        condition = plan.condition(stack.pop())
        if condition.name in needed:
            continue
        needed[condition.name] = condition
        stack.extend(condition.sources)
        if condition.kv_swap is not None:
            stack.append(condition.kv_swap.donor)
    return list(needed.values())


def run_sample(model: Any, inputs_by_image: Any, conditions: list[Any], plan: Any, config: RemoteConfig,
               log: Callable[[str], None] = print, what: str | None = None) -> dict[str, RunResult]:
    """Run `conditions` of one sample as ONE remote job; per condition its captures, as
    `run_condition` returns them locally."""
    names = [c.name for c in conditions]
    # the job's plan holds the conditions it runs, compiled here (a plan's lazy conditions hold the spec)
    plan = plan.replace(conditions=conditions_needed(plan, names))
    inputs = {mode: inputs_by_image[mode] for mode in images_needed(plan, names)}
    server = model.server_view()
    what = what or f"{model.model_id} | {getattr(getattr(inputs_by_image, 'sample', None), 'id', '?')}"
    raw = with_retries(lambda: _submit(model, server, inputs, names, plan, config), config, what, log)
    missing = [n for n in names if n not in (raw or {})]
    if missing:
        raise RemoteRunError(f"{what}: the job returned no result for {', '.join(missing)}")
    return {
        name: RunResult(**{part: {k: v.numpy() for k, v in raw[name].get(part, {}).items()}
                           for part in RunResult._fields})
        for name in names
    }


@contextlib.contextmanager
def shipped_by_value(packages: tuple[str, ...] = _SHIPPED_PACKAGES) -> Iterator[None]:
    """Pickle `packages` by value (their code travels in the payload) while jobs serialize."""
    import cloudpickle

    added = [name for name in packages if name not in cloudpickle.list_registry_pickle_by_value()]
    for name in added:
        cloudpickle.register_pickle_by_value(sys.modules[name])
    try:
        yield
    finally:
        for name in added:
            if name in sys.modules and name in cloudpickle.list_registry_pickle_by_value():
                cloudpickle.unregister_pickle_by_value(sys.modules[name])


def _remote_backend(model: Any, config: RemoteConfig) -> Any:
    from nnsight.intervention.backends.remote import RemoteBackend

    class _Backend(RemoteBackend):
        """nnsight's backend, keeping what a blocking request returned (the saves dict)."""

        result: Any = None

        def __call__(self, tracer: Any = None) -> Any:
            self.result = super().__call__(tracer)
            return self.result

    backend = _Backend(model.model_key, host=config.host, api_key=config.key() or None,
                       env=model.lm._remoteable_get_env(), blocking=config.blocking)
    backend.display.enabled = False  # our own progress bar reports; statuses would interleave with it
    return backend


def _submit(model: Any, server: Any, inputs: dict, names: list[str], plan: Any, config: RemoteConfig) -> Any:
    """One job: a session whose body runs every listed condition on the server. The body names
    only `_server_run`, `server`, `inputs`, `names`, `plan` (what is pickled); never the config."""
    with shipped_by_value():
        if config.simulated:
            # nnsight's simulation runs the deserialized body here, on this model: load its weights
            # (a real server has them; the meta model would put the inputs on the meta device)
            if not model.lm.dispatched:
                model.lm.dispatch()
            with model.lm.session(remote="local"):
                results = nnsight.save(_server_run(server, inputs, names, plan))
            return results
        backend = _remote_backend(model, config)
        with model.lm.session(backend=backend):
            results = nnsight.save(_server_run(server, inputs, names, plan))  # noqa: F841
    if config.blocking:
        return (backend.result or {}).get("results")
    return _poll(backend, config).get("results")


def _poll(backend: Any, config: RemoteConfig) -> dict:
    """Wait for a submitted non-blocking job. Failed polls (5xx, connection) are retried within
    the job; a job with no status for `lost_after_s` is lost (raised, then resubmitted)."""
    import httpx
    from nnsight.schema.response import ResponseModel, Status

    headers = {"ndif-api-key": backend.api_key} if backend.api_key else None
    started = last_seen = time.monotonic()
    with httpx.Client(timeout=httpx.Timeout(10.0, read=60.0)) as client:
        while True:
            try:
                answer = client.get(f"{backend.host}/response/{backend.job_id}", headers=headers)
                if answer.status_code != 404:
                    answer.raise_for_status()
                    response = ResponseModel.model_validate_json(answer.text)
                    last_seen = time.monotonic()
                    result = backend.handle(response)  # raises RemoteError on ERROR
                    if response.status == Status.COMPLETED:
                        return result or {}
            except httpx.HTTPStatusError as error:
                if not classify(error).transient:
                    raise
            except httpx.TransportError:
                pass
            now = time.monotonic()
            if now - last_seen > config.lost_after_s:
                raise _JobLost(f"no status for job {backend.job_id} in {config.lost_after_s:g}s")
            if config.job_timeout_s is not None and now - started > config.job_timeout_s:
                raise TimeoutError(f"job {backend.job_id} did not finish in {config.job_timeout_s:g}s")
            time.sleep(config.poll_interval_s)
