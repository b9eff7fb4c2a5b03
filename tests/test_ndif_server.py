"""The loopback NDIF server (tests/ndif_server.py) against the unmodified nnsight 0.8.1 client.

Client side: a meta ``TransformersModel`` built from a local tiny checkpoint (no weights, as a
remote user has). Server side: the model NDIF would build, ``Remotable.from_model_key(key,
dispatch=True)``. Reference: the same checkpoint dispatched locally. Everything runs offline on
127.0.0.1.

What the 0.8.1 client raises for each fault (the workbench retries the transient ones):

* POST /request answered 503 -> ``RemoteError("Failed to send request: <detail>")``, ``__cause__``
  ``httpx.HTTPStatusError`` (status 503); same for a non-blocking submit.
* bad / missing API key (401) -> ``RemoteError("Failed to send request: Missing or invalid API
  key. ...")``, ``__cause__`` ``httpx.HTTPStatusError`` (status 401).
* websocket cut mid-job (TCP dropped) -> ``websocket.WebSocketConnectionClosedException`` ("Connection
  to remote host was lost."), unwrapped.
* websocket closed with a close frame mid-job -> ``pydantic.ValidationError`` (the client's
  ``recv()`` returns ``""`` and it parses that as a ``ResponseModel``), unwrapped.
* server not listening -> ``ConnectionRefusedError`` (from ``websocket.create_connection``).
* job lost, non-blocking -> polls keep returning ``None`` (404 = "no status yet"): only a deadline
  on the caller's side ends it.
* GET /response answered 503 -> ``httpx.HTTPStatusError`` from ``backend()`` (poll does not wrap).
* error inside the trace, or model not served -> ``RemoteError(<server description>)``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import time

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from ndif_server import BAD_KEY_MESSAGE, LoopbackNDIF, local_model_key  # noqa: E402  (before nnsight)

import nnsight  # noqa: E402
import torch  # noqa: E402
from nnsight import CONFIG  # noqa: E402
from nnsight.intervention.backends.remote import AsyncRemoteBackend, RemoteBackend, RemoteError  # noqa: E402
from nnsight.modeling.mixins.remotable import Remotable  # noqa: E402
from nnsight.modeling.transformers import TransformersModel  # noqa: E402
from nnsight.schema.request import RequestModel  # noqa: E402
from nnsight.schema.response import ResponseModel, Status  # noqa: E402

from workbench.models.tiny import load_processor, tiny_model_dir  # noqa: E402

# The nnsight versions whose client this fixture was checked against, end to end.
VERIFIED_NNSIGHT = {"0.8.1"}
PROMPT = "The tower is in"


class Llama:
    """Client (meta), server (from the key) and local reference models of tiny-llama."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer

        d = str(tiny_model_dir("tiny-llama"))
        # transformers 5.x pipelines no longer say which preprocessors they load, so nnsight
        # 0.8.1 cannot find the tokenizer of a local path by itself: hand it over.
        self.tokenizer = AutoTokenizer.from_pretrained(d)
        kw = dict(task="text-generation", tokenizer=self.tokenizer, attn_implementation="eager")
        self.client = TransformersModel(d, **kw)
        self.key = local_model_key(self.client)
        self.server_model = Remotable.from_model_key(self.key, dispatch=True, tokenizer=self.tokenizer)
        self.local = TransformersModel(d, dispatch=True, **kw)


@pytest.fixture(scope="module")
def llama() -> Llama:
    return Llama()


@pytest.fixture(scope="module")
def server(llama):
    previous = (CONFIG.API.APIKEY, CONFIG.APP.REMOTE_LOGGING)
    CONFIG.API.APIKEY = "test-key"
    CONFIG.APP.REMOTE_LOGGING = False
    srv = LoopbackNDIF({llama.key: llama.server_model}, api_key="test-key").start()
    yield srv
    srv.stop()
    CONFIG.API.APIKEY, CONFIG.APP.REMOTE_LOGGING = previous


@pytest.fixture(autouse=True)
def _reset_faults(request):
    if "server" not in request.fixturenames:
        yield
        return
    srv = request.getfixturevalue("server")
    srv.fail_next_requests = srv.drop_next_jobs = srv.fail_next_polls = 0
    srv.reject_key = False
    srv.served = set(srv.models)
    srv.drop_mode = "abort"
    srv.inline_results = False
    yield


def poll(backend: RemoteBackend, timeout_s: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = backend()
        if result is not None:
            return result
        time.sleep(0.02)
    raise TimeoutError("non-blocking job did not complete")


def local_layer0(llama: Llama) -> torch.Tensor:
    with llama.local.trace(PROMPT):
        hidden = llama.local.model.layers[0].output.save()
    return hidden


# -- happy paths ---------------------------------------------------------------------------------


@pytest.mark.parametrize("inline", [False, True], ids=["result-url", "result-inline"])
def test_blocking_trace_matches_local(llama, server, inline):
    server.inline_results = inline
    client = llama.client
    with client.trace(PROMPT, remote=server.url):
        hidden = client.model.layers[0].output.save()
        logits = client.lm_head.output.save()
        print("hello from the server")
    with llama.local.trace(PROMPT):
        ref_hidden = llama.local.model.layers[0].output.save()
        ref_logits = llama.local.lm_head.output.save()
    assert torch.equal(hidden, ref_hidden)
    assert torch.equal(logits, ref_logits)

    seen = server.requests_seen[-1]
    assert seen["model_key"] == llama.key
    assert seen["env"] == {"attn_implementation": "eager"}
    assert seen["api_key_sent"] and seen["compress"] is True
    job = server.status_log[-1][0]
    states = [state for job_id, state in server.status_log if job_id == job]
    assert states == ["RECEIVED", "QUEUED", "RUNNING", "LOG", "COMPLETED"]


def test_non_blocking_submit_then_poll(llama, server):
    client = llama.client
    with client.trace(PROMPT, remote=server.url, blocking=False) as tracer:
        hidden = client.model.layers[0].output.save()
    backend = tracer.backend
    assert backend.job_id is not None
    assert server.requests_seen[-1]["session_id"] == ""  # no websocket in non-blocking mode

    server.fail_next_polls = 1  # a failed poll raises, unwrapped; the next one still works
    with pytest.raises(httpx.HTTPStatusError) as info:
        backend()
    assert info.value.response.status_code == 503

    result = poll(backend)
    assert set(result) == {"hidden"}
    assert torch.equal(result["hidden"], local_layer0(llama))
    assert backend.status == Status.COMPLETED


def test_session_with_two_traces(llama, server):
    client, local = llama.client, llama.local
    with client.session(remote=server.url):
        with client.trace(PROMPT):
            first = client.model.layers[0].output.save()
        with client.trace("Hello"):
            second = (client.model.layers[1].output + first.mean()).save()
    with local.session():
        with local.trace(PROMPT):
            ref_first = local.model.layers[0].output.save()
        with local.trace("Hello"):
            ref_second = (local.model.layers[1].output + ref_first.mean()).save()
    assert torch.equal(first, ref_first)
    assert torch.equal(second, ref_second)


def test_async_backend(llama, server):
    client = llama.client
    backend = AsyncRemoteBackend(llama.key, host=server.url, env=client._remoteable_get_env())
    with client.trace(PROMPT, backend=backend):
        hidden = client.model.layers[0].output.save()
    result = asyncio.run(backend.resolve())
    assert torch.equal(result["hidden"], local_layer0(llama))


def test_status_whoami_env(llama, server, monkeypatch):
    monkeypatch.setattr(CONFIG.API, "HOST", server.url)  # these helpers read CONFIG.API.HOST only
    status = nnsight.status()
    assert status.status == status.Status.UP
    assert llama.client.repo_id in status
    assert status[llama.client.repo_id]["state"] == "RUNNING"
    deployments = nnsight.status(raw=True)["deployments"]  # keyed by deployment, as NDIF's
    assert llama.key in {d["model_key"] for d in deployments.values()}
    assert {"repo_id", "revision", "dedicated", "config", "n_params", "deployment_level"} <= set(*deployments.values())
    assert nnsight.whoami()["email"] is not None
    assert nnsight.whoami("not-the-key")["email"] is None
    assert "torch" in nnsight.ndif.get_remote_env(force_refresh=True)["packages"]
    # remote=True goes to CONFIG.API.HOST.
    with llama.client.trace(PROMPT, remote=True):
        hidden = llama.client.model.layers[0].output.save()
    assert torch.equal(hidden, local_layer0(llama))


# -- errors and faults ---------------------------------------------------------------------------


def test_error_inside_trace_comes_back(llama, server):
    client = llama.client
    with pytest.raises(RemoteError) as info:
        with client.trace(PROMPT, remote=server.url):
            hidden = client.model.layers[0].output.save()
            raise ValueError("boom from inside the trace")
    text = str(info.value)
    assert "ValueError: boom from inside the trace" in text
    assert "Traceback" in text and __file__ in text  # the block's own file and line

    with pytest.raises(RemoteError, match="IndexError"):
        with client.trace(PROMPT, remote=server.url):
            hidden = client.model.layers[0].output[0, 999].save()  # noqa: F841
    # The server is fine afterwards.
    with client.trace(PROMPT, remote=server.url):
        hidden = client.model.layers[0].output.save()
    assert torch.equal(hidden, local_layer0(llama))


@pytest.mark.parametrize("case", ["wrong-key", "no-key", "rejected"])
def test_bad_api_key_is_refused(llama, server, monkeypatch, case):
    if case == "wrong-key":
        monkeypatch.setattr(CONFIG.API, "APIKEY", "not-the-key")
    elif case == "no-key":
        monkeypatch.setattr(CONFIG.API, "APIKEY", None)
    else:
        server.reject_key = True
    client = llama.client
    with pytest.raises(RemoteError, match="Failed to send request: Missing or invalid API key") as info:
        with client.trace(PROMPT, remote=server.url):
            hidden = client.model.layers[0].output.save()  # noqa: F841
    assert BAD_KEY_MESSAGE in str(info.value)
    assert info.value.__cause__.response.status_code == 401


def test_503_on_submit_is_a_remote_error(llama, server):
    client = llama.client
    server.fail_next_requests = 1
    with pytest.raises(RemoteError, match="Failed to send request: Service temporarily unavailable") as info:
        with client.trace(PROMPT, remote=server.url):
            hidden = client.model.layers[0].output.save()
    assert type(info.value.__cause__).__name__ == "HTTPStatusError"
    assert info.value.__cause__.response.status_code == 503

    server.fail_next_requests = 1  # the non-blocking submit surfaces it the same way
    with pytest.raises(RemoteError, match="Service temporarily unavailable"):
        with client.trace(PROMPT, remote=server.url, blocking=False):
            hidden = client.model.layers[0].output.save()

    assert server.fail_next_requests == 0  # consumed: the retry goes through
    with client.trace(PROMPT, remote=server.url):
        hidden = client.model.layers[0].output.save()
    assert torch.equal(hidden, local_layer0(llama))


def test_dropped_connection(llama, server):
    import pydantic
    import websocket

    client = llama.client
    server.drop_next_jobs = 1
    with pytest.raises(websocket.WebSocketConnectionClosedException):
        with client.trace(PROMPT, remote=server.url):
            hidden = client.model.layers[0].output.save()

    server.drop_mode = "close"
    server.drop_next_jobs = 1
    with pytest.raises(pydantic.ValidationError):
        with client.trace(PROMPT, remote=server.url):
            hidden = client.model.layers[0].output.save()
    assert len(server.dropped_jobs) >= 2

    server.drop_next_jobs = 1  # non-blocking: the job is lost, polls find no status for good
    with client.trace(PROMPT, remote=server.url, blocking=False) as tracer:
        hidden = client.model.layers[0].output.save()
    with pytest.raises(TimeoutError):
        poll(tracer.backend, timeout_s=0.5)

    with client.trace(PROMPT, remote=server.url):
        hidden = client.model.layers[0].output.save()
    assert torch.equal(hidden, local_layer0(llama))


def test_model_not_served(llama, server, monkeypatch):
    server.served = set()
    client = llama.client
    with pytest.raises(RemoteError, match="is not a scheduled model"):
        with client.trace(PROMPT, remote=server.url):
            hidden = client.model.layers[0].output.save()  # noqa: F841
    monkeypatch.setattr(CONFIG.API, "HOST", server.url)
    assert llama.client.repo_id not in nnsight.status()


def test_server_down_and_clean_stop(llama, server):
    down = LoopbackNDIF({}).start()
    url, thread = down.url, down._thread
    down.stop()
    assert not thread.is_alive()
    down.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        with llama.client.trace(PROMPT, remote=url):
            hidden = llama.client.model.layers[0].output.save()  # noqa: F841
    with pytest.raises(ValueError):
        LoopbackNDIF({}, host="0.0.0.0")


# -- the wire format the fixture relies on --------------------------------------------------------


def test_wire_contract(llama, server):
    """Fails loudly when nnsight changes what tests/ndif_server.py speaks."""
    version = nnsight.__version__
    assert version in VERIFIED_NNSIGHT, (
        f"nnsight {version}: re-check tests/ndif_server.py against this client's "
        "intervention/backends/remote.py, then add the version to VERIFIED_NNSIGHT"
    )
    # The envelope (form field `data`) and the status message.
    assert set(RequestModel.model_fields) == {"model_key", "session_id", "compress", "env"}
    assert set(json.loads(RequestModel(model_key="k").metadata())) == {"model_key", "session_id", "compress", "env"}
    assert {"id", "status", "description", "data", "meta"} <= set(ResponseModel.model_fields)
    used = {"RECEIVED", "QUEUED", "RUNNING", "LOG", "COMPLETED", "ERROR"}
    assert used <= {s.value for s in Status}
    blob = ResponseModel(id="x", status=Status.COMPLETED, data=b"\x00\x01").pickle()
    assert RemoteBackend.parse(blob).data == b"\x00\x01"  # binary frame = inline result

    # Endpoints, form fields and headers, as the client builds them.
    src = inspect.getsource(RemoteBackend)
    for needle in (
        'f"{self.host}/request"',
        'data={"data": request.metadata()}',
        'files={"blob": ("request", blob, "application/octet-stream")}',
        '"ndif-api-key"',
        '"nnsight-version"',
        '"python-version"',
        'f"{self.ws_host}/subscribe"',
        '["session_id"]',
        'f"{self.host}/response/{self.job_id}"',
        "status_code == 404",
        'detail = body.get("detail")',
        "zstd.ZstdDecompressor().decompress",
        "torch.load(",
    ):
        assert needle in src, f"nnsight's RemoteBackend no longer contains {needle!r}"
    assert '"/status"' in inspect.getsource(nnsight.ndif.status)
    assert '"deployments"' in inspect.getsource(nnsight.ndif.status)
    from nnsight.modeling.huggingface import HuggingFaceModel

    assert "_ID_CACHE[self.repo_id]" in inspect.getsource(HuggingFaceModel._remoteable_model_key)  # local_model_key

    # ... and as they arrived on the wire.
    with llama.client.trace(PROMPT, remote=server.url):
        hidden = llama.client.model.layers[0].output.save()  # noqa: F841
    seen = server.requests_seen[-1]
    assert seen["form_fields"] == ["blob", "data"]
    assert seen["metadata_fields"] == sorted(RequestModel.model_fields)
    assert seen["headers"]["nnsight-version"] == version
    assert seen["headers"]["python-version"] == sys.version
    assert "ndif-timestamp" in seen["headers"]
    assert json.loads(seen["model_key"].split(":", 1)[1])["repo_id"] == llama.client.repo_id


# -- a VLM with image inputs ---------------------------------------------------------------------


def test_vlm_image_inputs_over_remote():
    import transformers
    from PIL import Image

    d = str(tiny_model_dir("tiny-qwen3vl"))
    processor = load_processor(d, "qwen3vl")
    client = TransformersModel(d, task="image-text-to-text", processor=processor, attn_implementation="eager")
    key = local_model_key(client)
    served = Remotable.from_model_key(key, dispatch=True, processor=processor)
    # The workbench's own way: an already-built module. It computes the same key.
    hf = transformers.Qwen3VLForConditionalGeneration.from_pretrained(d, attn_implementation="eager")
    local = TransformersModel(hf, tokenizer=processor.tokenizer, processor=processor, task="image-text-to-text")
    assert local_model_key(local) == key

    image = Image.new("RGB", (96, 64), "red")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    enc = processor(text=[text], images=[image], return_tensors="pt")
    enc = {k: v for k, v in enc.items() if isinstance(v, torch.Tensor) and k != "token_type_ids"}
    with local.trace(**enc):
        ref = local.model.language_model.layers[0].output.save()

    previous = (CONFIG.API.APIKEY, CONFIG.APP.REMOTE_LOGGING)
    CONFIG.API.APIKEY, CONFIG.APP.REMOTE_LOGGING = "test-key", False
    try:
        with LoopbackNDIF({key: served}) as srv:
            with client.trace(text, images=[image], remote=srv.url):  # processor keywords: PIL travels
                by_processor = client.model.language_model.layers[0].output.save()
            with local.trace(**enc, remote=srv.url):  # prebuilt encoding, module-wrapped client
                by_encoding = local.model.language_model.layers[0].output.save()
    finally:
        CONFIG.API.APIKEY, CONFIG.APP.REMOTE_LOGGING = previous
    assert torch.equal(by_processor, ref)
    assert torch.equal(by_encoding, ref)
