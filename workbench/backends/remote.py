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
function and class the body reaches travels in the payload. So do the plugin modules of the
plan's intervention kinds and of the plugins' sites, when they import only what NDIF allows
(`shipping`; otherwise `remote_checks` refuses the run before any job, naming the import). NDIF unpickles and runs it inside a
module and builtin whitelist (ndif-team/ndif at 028db44, src/services/ray/src/ray/nn/security/protected_environment.py), which is why that code uses
`Record`s, not dataclasses, and imports only torch, numpy, nnsight and typing (see
`ndif_job`). Two more patterns do not survive the trip: a function wrapped by a decorator using
`functools.wraps` (nnsight reads the wrapped function's source but keeps the wrapper's globals),
so `run_condition` travels undecorated and `server_run` enters inference mode itself; and a
function-level relative import (no package on the server). Contract tests check all of it
(tests/test_remote.py, tests/test_ndif_sandbox.py).

The pieces: `remote_config` (where and how jobs run), `remote_faults` (what a failure means,
retries), `remote_checks` (the checks before the first job, the served models).
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import nnsight

from .local import RunResult
from .ndif_job import run_condition as _run_condition, server_run as _server_run  # noqa: F401
from .ndif_job import server_run_samples as _server_run_samples
from .remote_checks import (  # noqa: F401  (re-exported: the remote backend's public names)
    check_versions, find_deployment, load_remote_model, plugin_modules, preflight, prepare_remote, require_key,
    served_key, served_models, status_rows, status_table,
)
from .remote_config import RemoteConfig, RemoteEnv  # noqa: F401  (re-exported)
from .remote_faults import (  # noqa: F401  (re-exported)
    ModelNotServedError, RemoteAuthError, RemoteJobError, RemoteRunError, RemoteSetupError, RemoteUnavailableError,
    JobLost, classify, scrub, with_retries,
)

if TYPE_CHECKING:
    from ..models.model import ModelInputs
    from ..models.remote import RemoteModel
    from ..plan import ConditionPlan, ModelPlan

_SHIPPED_PACKAGES = ("workbench",)


def images_needed(plan: ModelPlan, names: list[str]) -> list[str]:
    """Image modes (real/blank/none) of `names` and of the conditions they read from."""
    return sorted({condition.image for condition in conditions_needed(plan, names)})


def conditions_needed(plan: ModelPlan, names: list[str]) -> list[ConditionPlan]:
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


def run_sample(model: RemoteModel, inputs_by_image: Mapping[str, ModelInputs], conditions: list[ConditionPlan],
               plan: ModelPlan, config: RemoteConfig, log: Callable[[str], None] = print,
               what: str | None = None) -> dict[str, RunResult]:
    """Run `conditions` of one sample as ONE remote job; per condition its captures, as
    `run_condition` returns them locally."""
    names = [c.name for c in conditions]
    # the job's plan holds the conditions it runs, compiled here (a plan's lazy conditions hold the spec)
    plan = plan.replace(conditions=conditions_needed(plan, names))
    inputs = {mode: inputs_by_image[mode] for mode in images_needed(plan, names)}
    server = model.server_view()
    what = what or f"{model.model_id} | {getattr(getattr(inputs_by_image, 'sample', None), 'id', '?')}"
    raw = with_retries(lambda: _submit(model, server, inputs, names, plan, config), config, what, log)
    return _results(raw, names, what)


def run_samples(model: RemoteModel, work: list[tuple[Mapping[str, ModelInputs], list[ConditionPlan]]], plan: ModelPlan,
                config: RemoteConfig, log: Callable[[str], None] = print, what: str = "") -> list[dict[str, RunResult]]:
    """Several samples' conditions as ONE remote job: one nnsight session whose body runs each
    sample as `run_sample`'s job would (`ndif_job.server_run_samples`), so the samples wait in
    NDIF's queue once. Per sample, its captures by condition."""
    every = list(dict.fromkeys(c.name for _, conditions in work for c in conditions))
    plan = plan.replace(conditions=conditions_needed(plan, every))
    jobs = []
    for inputs_by_image, conditions in work:
        names = [c.name for c in conditions]
        jobs.append(({mode: inputs_by_image[mode] for mode in images_needed(plan, names)}, names))
    server = model.server_view()
    raw = with_retries(lambda: _submit(model, server, {}, [], plan, config, jobs), config, what, log)
    if not isinstance(raw, list) or len(raw) != len(jobs):
        raise RemoteRunError(f"{what}: the job returned {len(raw or [])} samples' results of {len(jobs)}")
    return [_results(part, names, f"{what} (sample {i})") for i, (part, (_, names)) in enumerate(zip(raw, jobs))]


def _results(raw: Any, names: list[str], what: str) -> dict[str, RunResult]:
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


def _submit(model: Any, server: Any, inputs: dict, names: list[str], plan: Any, config: RemoteConfig,
            jobs: list | None = None) -> Any:
    """One job: a session whose body runs every listed condition on the server (`jobs`: every
    listed sample's, (inputs, names) each). The body names only `_server_run` /
    `_server_run_samples`, `server`, `inputs`, `names`, `jobs`, `plan` (what is pickled); never the config."""
    with shipped_by_value(_SHIPPED_PACKAGES + plugin_modules(plan)):
        if config.simulated:
            # nnsight's simulation runs the deserialized body here, on this model: load its weights
            # (a real server has them; the meta model would put the inputs on the meta device)
            if not model.lm.dispatched:
                model.lm.dispatch()
            with model.lm.session(remote="local"):
                if jobs is None:
                    results = nnsight.save(_server_run(server, inputs, names, plan))
                else:
                    results = nnsight.save(_server_run_samples(server, jobs, plan))
            return results
        backend = _remote_backend(model, config)
        with model.lm.session(backend=backend):
            if jobs is None:
                results = nnsight.save(_server_run(server, inputs, names, plan))  # noqa: F841
            else:
                results = nnsight.save(_server_run_samples(server, jobs, plan))  # noqa: F841
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
                raise JobLost(f"no status for job {backend.job_id} in {config.lost_after_s:g}s")
            if config.job_timeout_s is not None and now - started > config.job_timeout_s:
                raise TimeoutError(f"job {backend.job_id} did not finish in {config.job_timeout_s:g}s")
            time.sleep(config.poll_interval_s)
