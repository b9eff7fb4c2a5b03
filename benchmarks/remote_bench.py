"""Remote overhead: the same spec run through the loopback NDIF server against a local run.

The loopback server (tests/ndif_server.py) runs nnsight 0.8.1's own server-side path in a thread
of this process, so this process's CPU time covers both sides: serialization of the job (the
workbench functions travel by value), HTTP + websocket, deserialization, the traces, compression
of the results and their transfer back. The local arm is `run_spec` of the same spec with
`remote=False`. Both arms start from `run_spec` (model set-up included: a local load of the tiny
checkpoint against a weightless `RemoteModel`), alternating, a fresh store each time.

Guarded: when `workbench.backends.remote` (or the loopback server) does not exist yet, the
section reports "not available" with the reason. Run as `python -m benchmarks.remote_bench`
(the benchmark runner does, in a subprocess: the server stack must be imported in a set order
relative to nnsight, see tests/ndif_server.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from .common import REPO, interleave, pin_threads

KEY = "bench-key-4e1d"
SPEC = """\
name: bench-remote
models: [{model}]
data: {{source: builtin, n: {n}}}
conditions:
  baseline: {{}}
  alpha:
    sweep: {{alpha: [0.1, 3.0]}}
    interventions:
      - {{kind: scale, site: projector, factor: $alpha, positions: vision}}
capture:
  - {{site: layer, layers: all}}
  - {{site: attention}}
  - {{site: logits}}
store: {{path: {store}}}
"""


def available() -> tuple[bool, str]:
    try:
        import workbench.backends.remote  # noqa: F401
    except ImportError as err:
        return False, f"workbench.backends.remote does not exist yet ({err})"
    if not (REPO / "tests" / "ndif_server.py").is_file():
        return False, "the loopback NDIF server (tests/ndif_server.py) is missing"
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        return False, f"the loopback server needs the test extras ({err})"
    return True, ""


def measure(model: str = "tiny-qwen3vl", n: int = 2, repeats: int = 3, warmup: int = 1) -> dict[str, Any]:
    ok, reason = available()
    if not ok:
        return {"status": "not available", "reason": reason}
    sys.path.insert(0, str(REPO / "tests"))
    from ndif_server import LoopbackNDIF  # before nnsight where possible (see its docstring)

    from nnsight import CONFIG
    from nnsight.modeling.mixins.remotable import Remotable

    from workbench.backends.remote import RemoteConfig
    from workbench.models.model import model_info
    from workbench.models.remote import RemoteModel
    from workbench.runner import run_spec
    from workbench.spec import parse_spec

    client = RemoteModel(model_info(model), attn="eager")
    kwargs: dict[str, Any] = {"tokenizer": client.tokenizer}
    if client.arch.is_multimodal:
        kwargs["processor"] = client.processor
    served = Remotable.from_model_key(client.model_key, dispatch=True, **kwargs)
    CONFIG.APP.REMOTE_LOGGING = False
    try:
        server = LoopbackNDIF({client.model_key: served}, api_key=KEY, hide_modules=("workbench", "analyses"))
    except TypeError:  # an older loopback server without module hiding
        server = LoopbackNDIF({client.model_key: served}, api_key=KEY)
    server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp:
            def run(i: int, remote: Any) -> None:
                store = Path(tmp) / f"{'remote' if remote else 'local'}-{i}.zarr"
                spec = parse_spec(SPEC.format(model=model, n=n, store=store))
                summary = run_spec(spec, device="cpu", dtype="float32", progress=False, log=lambda _: None, remote=remote)
                assert summary.written == summary.total, summary

            config = RemoteConfig(target=server.url, api_key=KEY, backoff_s=0.05, max_tries=3)
            paired = interleave(lambda i: run(i, False), lambda i: run(i, config), repeats, warmup)
    finally:
        server.stop()
    out = paired.summary()
    out.update({"status": "measured", "model": model, "samples": n, "conditions": 3,
                "captures": "layer all, attention, logits", "server": "loopback NDIF (tests/ndif_server.py), in-process thread"})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="write the result JSON here")
    parser.add_argument("--model", default="tiny-qwen3vl")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    try:
        result = measure(args.model, args.samples, args.repeats)
    except Exception as err:  # report, do not hide: the table says what failed
        result = {"status": "error", "reason": f"{type(err).__name__}: {err}"[:2000]}
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
