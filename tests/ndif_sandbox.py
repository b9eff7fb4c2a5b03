"""The loopback NDIF server's job executor: a separate process that unpickles and runs each
request inside an import and builtin whitelist, as NDIF's model actor does with its `Protector`.

Written from the documented behaviour (read from
ndif-team/ndif at 028db44: src/services/ray/src/ray/deployments/modeling/base.py, the model actor,
and src/services/ray/src/ray/nn/security/protected_environment.py), not copied:

- unpickling runs under `Protector(DESERIALIZATION_MODULES)`, execution under
  `Protector(EXECUTION_MODULES)`. A whitelist entry matches by prefix unless strict.
- While a Protector is active, `builtins.__import__` refuses a module outside the whitelist with
  `ImportError: Module X is not whitelisted`, pickle's `find_class` does the same, and every
  builtin outside `BUILTINS` is deleted process-wide (hence a separate process: the real one
  patches its actor's whole process too).
- Which imports are checked: those made by the request (the nnsight block, and every function
  or class it shipped by value), including the module references cloudpickle resolves while
  unpickling. The server's own installed code (torch, transformers, nnsight, numpy, ...)
  importing its own submodules while it runs is not the request's doing and is let through.
- nnsight 0.8.1 itself needs `linecache`, `compile` and `exec` on the server (it rebuilds the
  block from source), so those are allowed, as the deployed NDIF must for 0.8.1 clients.
- Packages the server does not have (`hidden`, e.g. workbench) cannot be imported at all.
- Per-request `env` (e.g. `attn_implementation`) is ignored, as NDIF ignores it: a model runs
  with the attention implementation it was deployed with.

The job itself runs through the loopback server's one executor (`tests/ndif_executor.py`), here
inside the whitelists. The parent (`tests/ndif_server.py`) sends jobs down a pipe and enforces
the job timeout by killing this process (a new one starts for the next job).
"""

from __future__ import annotations

import builtins
import sys
import traceback
from typing import Any

from ndif_executor import JobOutcome, execute_job

# (name, strict): NDIF's WHITELISTED_MODULES, plus nnsight's own modules and linecache, which
# nnsight 0.8.1 needs on the server.
EXECUTION_MODULES = (
    ("builtins", True), ("torch", False), ("collections", False), ("nnsight", False), ("time", False),
    ("numpy", False), ("sympy", False), ("nnterp", False), ("math", False), ("einops", False),
    ("urllib3", False), ("typing", False), ("_operator", True), ("operator", True), ("pandas", False),
    ("enum", False), ("linecache", True),
)
DESERIALIZATION_MODULES = EXECUTION_MODULES + (
    ("pickle", True), ("cloudpickle", False), ("copyreg", True), ("_codecs", True),
)

# NDIF's builtin whitelist (the ones not listed are deleted while a Protector is active); `open`,
# `breakpoint`, `input`, `exit`, `quit`, `help` are not on it. compile/exec: see the docstring.
BUILTINS = frozenset("""
ArithmeticError AssertionError AttributeError BaseException BaseExceptionGroup BlockingIOError
BrokenPipeError BufferError BytesWarning ChildProcessError ConnectionAbortedError ConnectionError
ConnectionRefusedError ConnectionResetError DeprecationWarning EOFError Ellipsis EncodingWarning
EnvironmentError Exception ExceptionGroup False FileExistsError FileNotFoundError FloatingPointError
FutureWarning GeneratorExit IOError ImportError ImportWarning IndentationError IndexError
InterruptedError IsADirectoryError KeyError KeyboardInterrupt LookupError MemoryError
ModuleNotFoundError NameError None NotADirectoryError NotImplemented NotImplementedError OSError
OverflowError PendingDeprecationWarning PermissionError ProcessLookupError RecursionError
ReferenceError ResourceWarning RuntimeError RuntimeWarning StopAsyncIteration StopIteration
SyntaxError SyntaxWarning SystemError SystemExit TabError TimeoutError True TypeError
UnboundLocalError UnicodeDecodeError UnicodeEncodeError UnicodeError UnicodeTranslateError
UnicodeWarning UserWarning ValueError Warning ZeroDivisionError __build_class__ __debug__ __doc__
__import__ __loader__ __name__ __package__ __spec__ abs aiter all anext any ascii bin bool
bytearray bytes callable chr classmethod compile complex delattr dict dir divmod enumerate eval
exec filter float format frozenset getattr globals hasattr hash hex id int isinstance issubclass
iter len list locals map max memoryview min next object oct ord pow print property range repr
reversed round set setattr slice sorted staticmethod str sum super tuple type vars zip
""".split())


def whitelisted(name: str, modules: tuple) -> bool:
    return any(name == m or (not strict and name.startswith(m + ".")) for m, strict in modules)


class Protector:
    """Context manager: the import and builtin whitelist, process-wide, while active."""

    def __init__(self, modules: tuple, server_packages: frozenset, hidden: tuple) -> None:
        self.modules, self.server_packages, self.hidden = modules, server_packages, hidden
        self._saved: dict | None = None

    def _by_request(self, caller: str) -> bool:
        """Whether an import comes from the request rather than the server's installed code."""
        top = caller.split(".")[0]
        return top not in self.server_packages or top in ("cloudpickle", "pickle", "copyreg")

    def check(self, name: str) -> None:
        top = name.split(".")[0]
        if top in self.hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        if not whitelisted(name, self.modules):
            raise ImportError(f"Module {name} is not whitelisted")

    def __enter__(self) -> "Protector":
        original_import = builtins.__import__
        protector = self

        def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
            caller = (globals or {}).get("__name__") or ""
            if level == 0 and protector._by_request(caller):
                protector.check(name)
            module = original_import(name, globals, locals, fromlist, level)
            if level > 0 and protector._by_request(caller):
                protector.check(module.__name__)  # relative imports: checked after import, by name
            return module

        self._saved = dict(builtins.__dict__)
        for key in list(builtins.__dict__):
            if key not in BUILTINS:
                del builtins.__dict__[key]
        builtins.__import__ = guarded_import
        return self

    def __exit__(self, *exc: Any) -> None:
        builtins.__dict__.clear()
        builtins.__dict__.update(self._saved)
        self._saved = None


def _unpickler(protector: Protector) -> Any:
    from nnsight.intervention.serialization import CustomCloudUnpickler

    class ProtectedUnpickler(CustomCloudUnpickler):
        def find_class(self, module: str, name: str) -> Any:
            protector.check(module)
            return super().find_class(module, name)

    return ProtectedUnpickler


def _load_models(loaders: dict) -> dict:
    """model key -> the dispatched model NDIF would build from it (`from_model_key`), with the
    attention implementation of the deployment (not of any request)."""
    import torch
    from nnsight.modeling.mixins.remotable import Remotable
    from transformers import AutoProcessor, AutoTokenizer

    torch.set_num_threads(1)
    models = {}
    for key, loader in loaders.items():
        kwargs: dict = {"attn_implementation": loader.get("attn", "sdpa")}
        path = loader["path"]
        if loader.get("processor") is not None:  # ("module:function", *args): how to build it
            import importlib

            target, *args = loader["processor"]
            module, function = target.split(":")
            processor = getattr(importlib.import_module(module), function)(*args)
            kwargs["processor"] = processor
            kwargs["tokenizer"] = getattr(processor, "tokenizer", processor)
        elif loader.get("multimodal"):
            kwargs["processor"] = AutoProcessor.from_pretrained(path)
            kwargs["tokenizer"] = kwargs["processor"].tokenizer
        else:
            kwargs["tokenizer"] = AutoTokenizer.from_pretrained(path)
        _seed_local_key(key)
        models[key] = Remotable.from_model_key(key, dispatch=True, **kwargs)
    return models


def _seed_local_key(key: str) -> None:
    import json
    import os

    from nnsight.modeling import huggingface

    repo = json.loads(key.split(":", 1)[1]).get("repo_id")
    if isinstance(repo, str) and os.path.isdir(repo):
        huggingface._ID_CACHE.setdefault(repo, repo)


class _Hidden:
    """sys.meta_path entry: packages this server does not have."""

    def __init__(self, roots: tuple) -> None:
        self.roots = roots

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] in self.roots:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def worker_main(connection: Any, loaders: dict, hidden: tuple) -> None:
    """The executor process: load the models, then run jobs from `connection` one at a time.
    Messages in: (model_key, blob, compress); out: ("ready", None) once, then
    (ok, payload, printed) per job: payload = the result blob, or the error description."""
    try:
        models = _load_models(loaders)
    except Exception:
        connection.send(("failed", traceback.format_exc()))
        return
    # from here on the server "does not have" the hidden packages (what loading used stays loaded)
    for name in [m for m in sys.modules if m.split(".")[0] in hidden]:
        del sys.modules[name]
    sys.meta_path.insert(0, _Hidden(tuple(hidden)))
    # the server's own code that nnsight 0.8.1 imports on a job's path (RequestModel.deserialize:
    # zstandard), loaded as a server is, whatever its models' loading happened to import
    import zstandard  # noqa: F401

    server_packages = frozenset(m.split(".")[0] for m in list(sys.modules)) - set(hidden)

    def protector_for(modules: tuple) -> Protector:
        return Protector(modules, server_packages, tuple(hidden))

    connection.send(("ready", None))
    while True:
        try:
            message = connection.recv()
        except EOFError:
            return
        if message is None:
            return
        key, blob, compress = message
        if key not in models:
            connection.send((False, f"model {key} is not loaded on this server", ""))
            continue
        # unpickled under the deserialization whitelist (pickle's find_class checked too), run
        # under the execution whitelist; the request's env is ignored, as NDIF ignores it
        unpickling = protector_for(DESERIALIZATION_MODULES)
        outcome = execute_job(models[key], blob, compress, unpickler=_unpickler(unpickling),
                              deserializing=unpickling, executing=protector_for(EXECUTION_MODULES))
        connection.send(tuple(outcome))


class SandboxProcess:
    """The parent's side: a spawned executor process (`worker_main`) with its models loaded,
    taking one job at a time down a pipe."""

    def __init__(self, loaders: dict, hidden: tuple, timeout_s: float = 300.0) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        worker = context.Process(target=worker_main, args=(child, loaders, hidden), name="loopback-ndif-sandbox",
                                 daemon=True)
        worker.start()
        child.close()
        if not parent.poll(timeout_s):
            worker.kill()
            raise TimeoutError(f"the sandbox process did not load its models in {timeout_s}s")
        state, detail = parent.recv()
        if state != "ready":
            worker.join(5)
            raise RuntimeError(f"the sandbox process failed to load its models:\n{detail}")
        self.process, self.connection = worker, parent

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def run(self, model_key: str, blob: bytes, compress: bool, timeout_s: float) -> JobOutcome:
        """One job; past `timeout_s` the process is killed and TimeoutError raised."""
        self.connection.send((model_key, blob, compress))
        if not self.connection.poll(timeout_s):
            self.process.kill()
            self.process.join(5)
            self.connection.close()
            raise TimeoutError(f"the job took longer than {timeout_s:g}s")
        return JobOutcome(*self.connection.recv())

    def stop(self) -> None:
        try:
            self.connection.send(None)
        except Exception:
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.connection.close()
