"""A loopback NDIF server for tests: speaks nnsight 0.8.1's remote wire protocol on 127.0.0.1.

The unmodified 0.8.1 client (``model.trace(..., remote=server.url)``, ``blocking=False`` + poll,
``model.session(remote=...)``, ``AsyncRemoteBackend``, ``nnsight.status()``) talks to it exactly as
it talks to the real NDIF. Each request is executed by ``tests/ndif_executor.py`` (the one job
executor of this server and its sandbox) with nnsight's own server-side pieces, as its
``remote="local"`` backend does: ``model._remoteable_persistent_objects()``,
``model._remoteable_set_env(env)``, ``RequestModel.deserialize(...)``, ``tracer.execute(...)``; the
saved values are those the trace marked with ``save`` (nnsight's own save set), ``torch.save``-d and
zstd-compressed when the request says ``compress``. Nothing of the trace is reimplemented here.

Wire protocol (nnsight 0.8.1, ``nnsight/intervention/backends/remote.py``):

* ``GET /subscribe`` (websocket, blocking mode): first text frame ``{"session_id": ...}``, then one
  frame per status update: JSON ``ResponseModel`` (text) or ``ResponseModel.pickle()`` (binary, used
  for a COMPLETED whose ``data`` is the result bytes themselves).
* ``POST /request`` (multipart): form field ``data`` = ``RequestModel.metadata()`` JSON
  ``{model_key, session_id, compress, env}``, file ``blob`` = ``RequestModel.serialize(...)``;
  headers ``ndif-api-key``, ``nnsight-version``, ``python-version``, ``ndif-timestamp``. Answers
  the RECEIVED ``ResponseModel`` as JSON; an HTTP error answers FastAPI-style ``{"detail": ...}``
  (the client surfaces ``detail`` in its ``RemoteError``).
* ``GET /response/{id}`` (non-blocking polling): latest status JSON, 404 while none is recorded.
* ``GET /result/{id}``: the result blob a COMPLETED status points at (``data`` = that URL).
* ``GET /status`` (``nnsight.status()`` / ``is_model_running``), ``GET /whoami``, ``GET /env``
  (``nnsight.compare()``), ``GET /ping``.

Status sequence of a job: RECEIVED (HTTP answer) -> QUEUED -> RUNNING -> LOG* (what the trace
printed) -> COMPLETED | ERROR.

Fault injection (plain attributes the tests set; counters decrement as they fire):
``fail_next_requests`` (POST /request answers 503), ``drop_next_jobs`` (blocking: the websocket is
cut after RUNNING, before COMPLETED, by dropping the TCP connection, or with a 1011 close frame
when ``drop_mode = "close"``; non-blocking: the job is forgotten, so polls answer 404 for good), ``fail_next_polls`` (GET /response answers 503), ``reject_key`` (401 as the real NDIF does for
a bad key), ``served`` (keys reported by /status; any other key gets the real NDIF's "not a
scheduled model" ERROR after RECEIVED).

Sandboxed mode (``sandbox={model key: {"path", "multimodal", "processor", "attn"}}``), the faithful
one: each job runs in a separate process (tests/ndif_sandbox.py) that unpickles and executes it
inside an import and builtin whitelist like NDIF's Protector, on models it builds itself from
NDIF-format keys (``nnsight.modeling.language.LanguageModel:{"repo_id", "revision"}``) with the
deployment's attention implementation; per-request ``env`` is ignored, as NDIF ignores it; a job
past ``job_timeout_s`` ends in ERROR (its process is killed; a new one serves the next job). In
both modes ``/request`` refuses a client whose Python minor version differs from
``python_version`` (HTTP 400, NDIF's rule), ``/env`` reports ``python_version``, and ``/status``
lists deployments keyed by deployment with ``repo_id``, ``revision``, ``dedicated``, ``config`` and
``n_params``. The in-process mode below (models given as live objects) applies the request's env,
which NDIF does not: it serves the client-side contract tests and the fault drills.

User code the server does not have: ``hide_modules=("workbench", ...)`` makes the server behave
as a real NDIF does, where only torch, nnsight, transformers, numpy, ... are installed. While a
request is deserialized, executed and its result serialized, the executor thread cannot import a
hidden package (``import``, ``__import__``, pickle's ``find_class`` and new-module lookups all
raise ``ModuleNotFoundError``), and cloudpickle's class tracker starts empty, so classes shipped
by value are rebuilt from the payload instead of resolving to the client's live classes (as
they would in a separate server process). The client's threads are not affected.

Importing this module loads anyio's lazily imported modules (and the server stack) up front,
lifting nnsight's ``.save`` mount meanwhile if nnsight is already imported: anyio rejects classes
defined after that mount (see `_preload_server_stack`).
"""

# No `from __future__ import annotations`: FastAPI must see the route annotations (Request,
# WebSocket) as real classes, and they are imported inside `_asgi_app`.
import importlib

# anyio's TypedAttributeSet rejects any subclass with an unannotated public attribute, and
# nnsight's PYMOUNT puts `save` on every object at import; anyio (4.x) imports the modules that
# define such subclasses lazily, so whichever of them loads after nnsight raises "Attribute
# 'save' is missing its type annotation" (the server stack and nnsight's AsyncRemoteBackend both
# reach them). Load them all now; if nnsight is already imported, lift its mount meanwhile.
_ANYIO_EAGER = (
    "anyio._backends._asyncio",
    "anyio.abc._sockets",
    "anyio.streams.tls",
    "anyio.streams.file",
    "anyio.streams.memory",
    "anyio.streams.stapled",
    "anyio.streams.buffered",
    "anyio.streams.text",
    "anyio.to_thread",
    "anyio.from_thread",
    "starlette.applications",
    "starlette.websockets",
    "fastapi",
    "uvicorn",
    "uvicorn.protocols.websockets.websockets_sansio_impl",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.lifespan.off",
    "uvicorn.loops.asyncio",
    "python_multipart",
)


def _preload_server_stack() -> None:
    mounted = object.__dict__.get("save")
    unmount = mount = None
    if mounted is not None:
        from nnsight._c import mount, unmount  # nnsight is imported: it mounted `save`
    if unmount is not None:
        unmount("save")
    try:
        for name in _ANYIO_EAGER:
            importlib.import_module(name)
    finally:
        if unmount is not None:
            mount(mounted, "save")


_preload_server_stack()

import asyncio  # noqa: E402
import concurrent.futures  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any, Optional  # noqa: E402

__all__ = ["LoopbackNDIF", "local_model_key", "NOT_SERVED_MESSAGE", "BAD_KEY_MESSAGE", "UNAVAILABLE_MESSAGE"]

# The real NDIF's wording (ndif-team/ndif: api dependencies.py / queue coordinator.py).
BAD_KEY_MESSAGE = "Missing or invalid API key. Please visit https://login.ndif.us/ to create a new one."
UNAVAILABLE_MESSAGE = (
    "Service temporarily unavailable: compute backend is reconnecting. Please try again in a few minutes."
)
NOT_SERVED_MESSAGE = (
    "Model {model_key} is not a scheduled model and hotswapping is not supported for this API key. "
    "See https://nnsight.net/status/ for a list of scheduled models."
)

_LOOPBACK_HOSTS = {"127.0.0.1", "localhost"}


def local_model_key(model: Any) -> str:
    """The key the 0.8.1 client computes for ``model``, without asking the Hub.

    ``HuggingFaceModel._remoteable_model_key`` canonicalizes ``repo_id`` through
    ``HfApi().model_info``; for a local checkpoint directory (or a module whose
    ``config._name_or_path`` is one) seeding nnsight's ``_ID_CACHE`` with the path itself skips
    that lookup, so the key is ``'<import path>:{"repo_id": <path>, "revision": ..., "task": ...}'``.
    """
    import os

    from nnsight.modeling import huggingface

    repo_id = getattr(model, "repo_id", None)
    if isinstance(repo_id, str) and os.path.isdir(repo_id):
        huggingface._ID_CACHE.setdefault(repo_id, repo_id)
    return model.to_model_key()


class _JobError(Exception):
    """A request failed on the server; ``description`` is what the ERROR status carries."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


class _Job:
    __slots__ = ("id", "model_key", "session_id", "compress", "env", "blob")

    def __init__(self, id: str, model_key: str, session_id: str, compress: bool, env: dict, blob: bytes):
        self.id = id
        self.model_key = model_key
        self.session_id = session_id
        self.compress = compress
        self.env = env
        self.blob = blob


class LoopbackNDIF:
    """An in-process NDIF stand-in on 127.0.0.1 for the unmodified nnsight 0.8.1 client.

    Args:
        models: model key (as the client computes it: see `local_model_key`) -> a dispatched
            nnsight model that executes the requests for that key (e.g.
            ``Remotable.from_model_key(key, dispatch=True)``, which is how NDIF builds it).
        api_key: the one key accepted (header ``ndif-api-key``).
        host: must be a loopback name; the server binds 127.0.0.1 only.
        port: 0 picks a free port.
        inline_results: blocking jobs get their result inside the COMPLETED websocket frame (a
            binary ``ResponseModel.pickle()``) instead of a URL to download. Polled jobs always
            get a URL (a JSON status cannot carry bytes).
        hide_modules: top-level packages the server "does not have" while it runs a request
            (see the module docstring); e.g. ``("workbench", "analyses")``.
    """

    def __init__(
        self,
        models: dict[str, Any],
        api_key: str = "test-key",
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        inline_results: bool = False,
        hide_modules: tuple[str, ...] = (),
        start_timeout_s: float = 20.0,
        stop_timeout_s: float = 20.0,
        sandbox: Optional[dict] = None,
        job_timeout_s: float = 3600.0,
        python_version: Optional[str] = None,
        min_nnsight_version: str = "0.5",
    ) -> None:
        if host not in _LOOPBACK_HOSTS:
            raise ValueError(f"LoopbackNDIF binds 127.0.0.1 only, not {host!r}")
        # sandbox: model key -> {"path", "multimodal", "attn"}: jobs run in a separate process
        # inside NDIF's import and builtin whitelist (tests/ndif_sandbox.py), on models that
        # process builds from the key with the deployment's attention implementation
        self.sandbox = dict(sandbox) if sandbox else None
        self.models: dict[str, Any] = dict(models) if not sandbox else {k: None for k in sandbox}
        self.job_timeout_s = job_timeout_s
        # what the server runs: a client whose Python minor version differs is refused (HTTP 400)
        self.python_version = python_version or sys.version.split()[0]
        self.min_nnsight_version = min_nnsight_version
        self._worker: Any = None  # the sandbox process (ndif_sandbox.SandboxProcess)
        self.api_key = api_key
        self.host = "127.0.0.1"
        self.port = port
        self.inline_results = inline_results
        self.hide_modules: tuple[str, ...] = tuple(hide_modules)
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s

        # Fault injection.
        self.fail_next_requests: int = 0
        self.drop_next_jobs: int = 0
        self.fail_next_polls: int = 0
        self.reject_key: bool = False
        # POST /request answers 403 with `forbid_body` as its detail (a proxy, a quota, a key)
        self.forbid_next_requests: int = 0
        self.forbid_body: str = "Forbidden"
        # How drop_next_jobs cuts a blocking job's websocket: "abort" (TCP connection dropped, no
        # close frame: a crashed server or proxy) or "close" (a close frame, code 1011).
        self.drop_mode: str = "abort"
        self.served: set[str] = set(self.models)

        # Observations for assertions.
        self.requests_seen: list[dict] = []
        self.status_log: list[tuple[str, str]] = []  # (job id, status) in emission order
        self.dropped_jobs: list[str] = []

        self.url: str = ""
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._sessions: dict[str, asyncio.Queue] = {}
        self._responses: dict[str, Any] = {}  # job id -> latest ResponseModel (for polling)
        self._results: dict[str, bytes] = {}  # job id -> result blob
        self._tasks: set = set()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "LoopbackNDIF":
        import uvicorn

        if self._thread is not None:
            raise RuntimeError("LoopbackNDIF already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"

        # One thread runs every request, one at a time, as an NDIF model actor does.
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="loopback-ndif-exec")
        config = uvicorn.Config(
            self._asgi_app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            ws="websockets-sansio",
            ws_ping_interval=None,
            timeout_graceful_shutdown=2,
        )
        if self.sandbox is not None and self._worker is None:
            self.start_worker()
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="loopback-ndif", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("LoopbackNDIF failed to start (see stderr)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"LoopbackNDIF did not start within {self.start_timeout_s}s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(self.stop_timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(5)
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self.stop_worker()
        self._thread = None
        self._executor = None
        self._sessions.clear()
        self._tasks.clear()

    def __enter__(self) -> "LoopbackNDIF":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- helpers -----------------------------------------------------------------------------

    def _take(self, counter: str) -> bool:
        """Consume one unit of a fault counter; True when it fired."""
        with self._lock:
            value = getattr(self, counter)
            if value > 0:
                setattr(self, counter, value - 1)
                return True
            return False

    def deployments(self) -> dict:
        """The /status body: one HOT, RUNNING deployment per served key, as NDIF reports it."""
        out = {}
        for key in sorted(self.served):
            suffix = key.split(":", 1)[1] if ":" in key else "{}"
            try:
                info = json.loads(suffix)
            except ValueError:
                info = {}
            # keyed by deployment (as NDIF's /status), not by model key
            out[f"deployment-{len(out)}"] = {
                "model_key": key,
                "repo_id": info.get("repo_id", key),
                "revision": info.get("revision"),
                "task": info.get("task"),
                "trust_remote_code": bool(info.get("trust_remote_code")),
                "deployment_level": "HOT",
                "application_state": "RUNNING",
                "dedicated": True,
                "config": self._config(info.get("repo_id")),
                "n_params": None,
            }
        return {"deployments": out}

    @staticmethod
    def _config(repo_id: Any) -> dict:
        import os

        path = os.path.join(str(repo_id), "config.json")
        if isinstance(repo_id, str) and os.path.isfile(path):
            with open(path) as handle:
                return json.load(handle)
        return {}

    # -- the app -----------------------------------------------------------------------------

    def _asgi_app(self) -> Any:
        from fastapi import FastAPI, Request, WebSocket
        from fastapi.responses import JSONResponse, Response
        from nnsight.schema.request import RequestModel
        from nnsight.schema.response import ResponseModel, Status

        app = FastAPI(title="loopback-ndif")
        server = self

        @app.get("/ping")
        async def ping() -> str:
            return "pong"

        @app.get("/status")
        async def status() -> dict:
            return server.deployments()

        @app.get("/whoami")
        async def whoami(request: Request) -> dict:
            ok = not server.reject_key and request.headers.get("ndif-api-key") == server.api_key
            return {"email": "tests@loopback.invalid" if ok else None, "tags": []}

        @app.get("/env")
        async def env() -> dict:
            from nnsight.ndif import get_local_env

            local = get_local_env()
            packages = {k: v for k, v in local["packages"].items() if v != "local"}
            return {"python_version": server.python_version, "packages": packages}

        @app.websocket("/subscribe")
        async def subscribe(websocket: WebSocket) -> None:
            await websocket.accept()
            session_id = uuid.uuid4().hex
            queue: asyncio.Queue = asyncio.Queue()
            server._sessions[session_id] = queue
            receiver = asyncio.ensure_future(websocket.receive())
            try:
                await websocket.send_text(json.dumps({"session_id": session_id}))
                # Bounded: ends when the client disconnects, when a job drops the connection,
                # or when uvicorn closes the socket on shutdown (which disconnects `receiver`).
                while True:
                    getter = asyncio.ensure_future(queue.get())
                    done, _ = await asyncio.wait({getter, receiver}, return_when=asyncio.FIRST_COMPLETED)
                    if receiver in done:
                        getter.cancel()
                        if receiver.result().get("type") == "websocket.disconnect":
                            return
                        receiver = asyncio.ensure_future(websocket.receive())  # ignore client frames
                        continue
                    kind, payload = getter.result()
                    if kind == "text":
                        await websocket.send_text(payload)
                    elif kind == "bytes":
                        await websocket.send_bytes(payload)
                    elif kind == "drop":
                        if server.drop_mode == "close":
                            await websocket.close(code=1011, reason="loopback: job dropped")
                        else:
                            _abort(websocket)
                        return
            except Exception:  # the client went away mid-send
                return
            finally:
                receiver.cancel()
                server._sessions.pop(session_id, None)

        @app.post("/request")
        async def submit(request: Request) -> Response:
            form = await request.form()
            metadata = json.loads(form["data"])
            blob = await form["blob"].read()
            headers = {k.lower(): v for k, v in request.headers.items()}
            api_key = headers.pop("ndif-api-key", None)
            server.requests_seen.append(
                {
                    "model_key": metadata.get("model_key"),
                    "session_id": metadata.get("session_id"),
                    "compress": metadata.get("compress"),
                    "env": metadata.get("env"),
                    "metadata_fields": sorted(metadata),
                    "form_fields": sorted(form.keys()),
                    "blob_bytes": len(blob),
                    "api_key_sent": api_key is not None,
                    "headers": {
                        k: v
                        for k, v in headers.items()
                        if k in ("nnsight-version", "python-version", "ndif-timestamp", "user-agent")
                    },
                }
            )
            if server._take("fail_next_requests"):
                return JSONResponse(status_code=503, content={"detail": UNAVAILABLE_MESSAGE})
            if server._take("forbid_next_requests"):
                return JSONResponse(status_code=403, content={"detail": server.forbid_body})
            if server.reject_key or api_key != server.api_key:
                return JSONResponse(status_code=401, content={"detail": BAD_KEY_MESSAGE})
            if not headers.get("nnsight-version") or not headers.get("python-version"):
                return JSONResponse(
                    status_code=400,
                    content={"detail": "Client nnsight/python version was not provided to the NDIF server."},
                )
            refusal = server._version_refusal(headers["python-version"], headers["nnsight-version"])
            if refusal:
                return JSONResponse(status_code=400, content={"detail": refusal})
            envelope = RequestModel.model_validate(metadata)  # the client's own envelope schema
            job = _Job(
                uuid.uuid4().hex,
                envelope.model_key,
                envelope.session_id,
                envelope.compress,
                dict(envelope.env),
                blob,
            )
            received = ResponseModel(
                id=job.id,
                status=Status.RECEIVED,
                description="Your job has been received and is waiting to be queued.",
            )
            server._record(job, received)
            task = asyncio.ensure_future(server._run(job))
            server._tasks.add(task)
            task.add_done_callback(server._tasks.discard)
            return Response(content=received.model_dump_json(), media_type="application/json")

        @app.get("/response/{job_id}")
        async def response(job_id: str) -> Response:
            if server._take("fail_next_polls"):
                return JSONResponse(status_code=503, content={"detail": UNAVAILABLE_MESSAGE})
            latest = server._responses.get(job_id)
            if latest is None:
                return JSONResponse(status_code=404, content={"detail": f"No response for {job_id}"})
            return Response(content=latest.model_dump_json(), media_type="application/json")

        @app.get("/result/{job_id}")
        async def result(job_id: str) -> Response:
            blob = server._results.get(job_id)
            if blob is None:
                return JSONResponse(status_code=404, content={"detail": f"No result for {job_id}"})
            return Response(content=blob, media_type="application/octet-stream")

        async def outer(scope: dict, receive: Any, send: Any) -> None:
            # Keep the transport-level `send` reachable so a job can cut its websocket abruptly
            # (FastAPI wraps `send`, hiding the protocol object behind it).
            if scope["type"] == "websocket":
                scope["loopback.raw_send"] = send
            await app(scope, receive, send)

        return outer

    # -- jobs --------------------------------------------------------------------------------

    def _record(self, job: _Job, response: Any) -> None:
        self._responses[job.id] = response
        self.status_log.append((job.id, response.status.value))

    def _emit(self, job: _Job, response: Any, inline_data: Optional[bytes] = None) -> None:
        """Record `response` for polling and push it down the job's websocket, if any."""
        self._record(job, response)
        queue = self._sessions.get(job.session_id) if job.session_id else None
        if queue is None:
            return
        if inline_data is not None:
            queue.put_nowait(("bytes", response.model_copy(update={"data": inline_data}).pickle()))
        else:
            queue.put_nowait(("text", response.model_dump_json()))

    async def _run(self, job: _Job) -> None:
        from nnsight.schema.response import ResponseModel, Status

        def status(state: Status, description: str, **extra: Any) -> ResponseModel:
            return ResponseModel(id=job.id, status=state, description=description, **extra)

        if job.model_key not in self.served or job.model_key not in self.models:
            self._emit(job, status(Status.ERROR, NOT_SERVED_MESSAGE.format(model_key=job.model_key)))
            return
        self._emit(job, status(Status.QUEUED, "Your job has been queued."))
        self._emit(job, status(Status.RUNNING, "Your job has started running."))

        if self._take("drop_next_jobs"):
            self.dropped_jobs.append(job.id)
            if job.session_id and job.session_id in self._sessions:
                self._sessions[job.session_id].put_nowait(("drop", None))
            else:
                self._responses.pop(job.id, None)  # a lost job: polls answer 404 from now on
            return

        model = self.models[job.model_key]
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            blob, printed = await loop.run_in_executor(self._executor, self._execute, model, job)
        except _JobError as error:
            meta = {"loopback": True, "run_s": time.perf_counter() - started}
            self._emit(job, status(Status.ERROR, error.description, meta=meta))
            return
        meta = {"loopback": True, "run_s": time.perf_counter() - started, "result_bytes": len(blob)}
        for line in printed.splitlines():
            self._emit(job, status(Status.LOG, line))
        self._results[job.id] = blob
        completed = status(Status.COMPLETED, "Your job has been completed.", data=f"{self.url}/result/{job.id}", meta=meta)
        inline = blob if (self.inline_results and job.session_id) else None
        self._emit(job, completed, inline_data=inline)

    def _version_refusal(self, client_python: str, client_nnsight: str) -> Optional[str]:
        """NDIF's rule (api dependencies.py): the Python minor versions must match; nnsight must
        be at least the server's minimum."""
        from packaging.version import Version

        ours = ".".join(self.python_version.split(".")[:2])
        theirs = ".".join(client_python.split()[0].split(".")[:2])
        if ours != theirs:
            return (f"Client python version {client_python} does not match server version: {self.python_version}. "
                    f"Please use python {ours}.")
        try:
            too_old = Version(client_nnsight) < Version(self.min_nnsight_version)
        except Exception:
            too_old = True
        if too_old:
            return (f"Client nnsight version {client_nnsight} is incompatible with the server; "
                    f"nnsight >= {self.min_nnsight_version} is required.")
        return None

    def _execute(self, model: Any, job: _Job) -> tuple[bytes, str]:
        """Run one request (`ndif_executor.execute_job`): in the sandbox process, or here on the
        executor thread with the request's env applied. Returns the result blob and what the
        trace printed."""
        if self.sandbox is not None:
            return self._execute_sandboxed(job)
        from ndif_executor import execute_job, hidden_modules

        with hidden_modules(self.hide_modules) as unpickler:
            outcome = execute_job(model, job.blob, job.compress, env=job.env, unpickler=unpickler)
        if not outcome.ok:
            raise _JobError(outcome.payload)
        return outcome.payload, outcome.printed

    # -- the sandboxed executor process (tests/ndif_sandbox.py) -------------------------------

    def start_worker(self, timeout_s: float = 300.0) -> None:
        """Start the executor process and wait until its models are loaded."""
        from ndif_sandbox import SandboxProcess

        self._worker = SandboxProcess(self.sandbox, tuple(self.hide_modules), timeout_s)

    def stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def _execute_sandboxed(self, job: _Job) -> tuple[bytes, str]:
        if self._worker is None or not self._worker.alive:
            self.stop_worker()
            self.start_worker()
        try:
            outcome = self._worker.run(job.model_key, job.blob, job.compress, self.job_timeout_s)
        except TimeoutError:
            # as NDIF: a job past the timeout is killed (here with its process; a fresh one
            # serves the next job)
            self._worker = None
            raise _JobError(f"Job took longer than timeout: {self.job_timeout_s:g} seconds") from None
        if not outcome.ok:
            raise _JobError(outcome.payload)
        return outcome.payload, outcome.printed


def _abort(websocket: Any) -> None:
    """Cut the websocket's TCP connection without a close frame, as a crashed server would."""
    send = websocket.scope.get("loopback.raw_send")
    protocol = getattr(send, "__self__", None)
    transport = getattr(protocol, "transport", None)
    if transport is None:
        raise RuntimeError("cannot reach the websocket transport to drop the connection")
    transport.abort()
