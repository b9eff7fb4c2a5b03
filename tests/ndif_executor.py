"""One NDIF request executed with nnsight 0.8.1's own server-side pieces (the `remote="local"`
path: ``model._remoteable_persistent_objects()``, ``model._remoteable_set_env(env)``,
``RequestModel.deserialize(...)``, ``tracer.execute(...)``): the one job executor of the loopback
server, shared by its in-process mode (tests/ndif_server.py, on the server's executor thread) and
its sandbox process (tests/ndif_sandbox.py, inside NDIF's import and builtin whitelist).

The saved values are those the trace marked with ``save`` (nnsight's own save set),
``torch.save``-d and zstd-compressed when the request says ``compress``.
"""

from __future__ import annotations

import contextlib
import io
import linecache
import sys
import threading
import traceback
from typing import Any, NamedTuple, Optional


class JobOutcome(NamedTuple):
    """What one request came to: ``payload`` is the result blob when ``ok``, else the error
    description (what NDIF's ERROR status carries); ``printed``: what the trace printed."""

    ok: bool
    payload: Any  # bytes when ok, else str
    printed: str


class ThreadStdout:
    """sys.stdout stand-in that captures writes from one thread and forwards every other thread's.

    The client's status display writes to stdout from its own thread while an in-process job runs,
    so a plain ``redirect_stdout`` would capture the client's spinner as the job's LOG output.
    """

    def __init__(self, target: Any, thread_id: int) -> None:
        self._target = target
        self._thread_id = thread_id
        self.buffer = io.StringIO()

    def write(self, text: str) -> int:
        if threading.get_ident() == self._thread_id:
            return self.buffer.write(text)
        return self._target.write(text)

    def flush(self) -> None:
        if threading.get_ident() != self._thread_id:
            self._target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def execute_job(model: Any, blob: bytes, compress: bool, *, env: Optional[dict] = None, unpickler: Any = None,
                deserializing: Any = None, executing: Any = None) -> JobOutcome:
    """Run one request on `model` (a dispatched nnsight model).

    env: the request's env, applied as nnsight's local simulation does (None: ignored, as NDIF
    ignores it). unpickler: the unpickler class for ``RequestModel.deserialize`` (None: nnsight's
    own). deserializing / executing: context managers entered while the request is unpickled
    and while it runs (the sandbox's whitelists; None: nothing).

    Runs on the calling thread, so nnsight's per-thread save set and trace depth are this job's
    alone, and only that thread's prints are captured.
    """
    import torch
    from nnsight.schema.request import RequestModel
    from nnsight.tracing.tracer import _saves, dec, inc

    # deserialize() registers the block's source in linecache under the client's filename; in
    # the client's process that would shadow the client's real file for its next trace: restore it
    lines_before = dict(linecache.cache)
    capture = ThreadStdout(sys.stdout, threading.get_ident())
    sys.stdout = capture
    tracer = None
    try:
        persistent = model._remoteable_persistent_objects()
        if env is not None:
            model._remoteable_set_env(env)
        extra = {"unpickler": unpickler} if unpickler is not None else {}
        with deserializing or contextlib.nullcontext():
            tracer = RequestModel.deserialize(blob, persistent, compress=compress, **extra)
        inc()  # depth 1: this is the outermost trace, so only save()-marked values come back
        try:
            with executing or contextlib.nullcontext():
                tracer.execute(tracer.info.code)
            marked = _saves()
            saves = {k: v for k, v in tracer.info.frame.f_locals.items() if id(v) in marked}
        finally:
            dec()
    except Exception as exception:
        tb = exception.__traceback__
        if tracer is not None and hasattr(tracer, "traceback"):
            try:
                tb = tracer.traceback(exception)
            except Exception:
                pass
        return JobOutcome(False, "".join(traceback.format_exception(type(exception), exception, tb)),
                          capture.buffer.getvalue())
    finally:
        if sys.stdout is capture:
            sys.stdout = capture._target
        linecache.cache.clear()
        linecache.cache.update(lines_before)
        tracer = None
    buffer = io.BytesIO()
    torch.save(saves, buffer)
    result = buffer.getvalue()
    if compress:
        import zstandard as zstd

        result = zstd.ZstdCompressor(level=6).compress(result)
    return JobOutcome(True, result, capture.buffer.getvalue())
