"""One NDIF request executed with nnsight 0.8.1's own server-side pieces (the `remote="local"`
path: ``model._remoteable_persistent_objects()``, ``model._remoteable_set_env(env)``,
``RequestModel.deserialize(...)``, ``tracer.execute(...)``): the one job executor of the loopback
server, shared by its in-process mode (tests/ndif_server.py, on the server's executor thread) and
its sandbox process (tests/ndif_sandbox.py, inside NDIF's import and builtin whitelist). In the
server's own process, `hidden_modules` makes the executor thread lack the packages a real NDIF
does not have.

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


class HiddenModuleFinder:
    """A sys.meta_path entry refusing hidden packages on one thread (new imports only)."""

    def __init__(self, roots: tuple[str, ...], thread_id: int) -> None:
        self.roots, self.thread_id = roots, thread_id

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if threading.get_ident() == self.thread_id and name.split(".")[0] in self.roots:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed on this server)", name=name)
        return None


class hidden_modules:
    """Context manager: while a job runs on this thread, the packages in `roots` cannot be
    imported from it, and cloudpickle rebuilds by-value classes afresh. Yields the unpickler
    class for ``RequestModel.deserialize`` (None when nothing is hidden)."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = tuple(roots)

    def __enter__(self) -> Any:
        if not self.roots:
            return None
        import builtins
        import weakref

        from cloudpickle import cloudpickle as cp
        from nnsight.intervention.serialization import CustomCloudUnpickler

        roots, thread_id = self.roots, threading.get_ident()

        def hidden(name: str) -> bool:
            return threading.get_ident() == thread_id and name.split(".")[0] in roots

        def refuse(name: str) -> None:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed on this server)", name=name)

        original_import = builtins.__import__

        def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and hidden(name):
                refuse(name)
            return original_import(name, globals, locals, fromlist, level)

        class Unpickler(CustomCloudUnpickler):
            def find_class(self, module: str, name: str) -> Any:
                if hidden(module):
                    refuse(module)
                return super().find_class(module, name)

        self._import, self._finder = original_import, HiddenModuleFinder(roots, thread_id)
        self._tracker = cp._DYNAMIC_CLASS_TRACKER_BY_ID
        builtins.__import__ = guarded_import
        sys.meta_path.insert(0, self._finder)
        cp._DYNAMIC_CLASS_TRACKER_BY_ID = weakref.WeakValueDictionary()
        return Unpickler

    def __exit__(self, *exc: Any) -> None:
        if not self.roots:
            return
        import builtins

        from cloudpickle import cloudpickle as cp

        builtins.__import__ = self._import
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        cp._DYNAMIC_CLASS_TRACKER_BY_ID = self._tracker
