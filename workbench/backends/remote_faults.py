"""What a failed remote job means, and its retries.

Faults: transient ones (connection refused or dropped, HTTP 5xx/429, a websocket cut, a job lost
while polling, timeouts) are retried with exponential backoff up to `max_tries` submissions of the
sample; permanent ones (a refused API key, a 403, a host name that does not resolve, a model the
server does not serve, a refused version, an error inside the trace) stop the run at once with a
`RemoteRunError`. Either way every sample already written stays in the store and a rerun resumes
after it. The API key never enters the payload, the store, provenance, logs or error messages
(messages are scrubbed).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import nnsight

from ..errors import BadInputError, RemoteError
from .remote_config import RemoteConfig

_TRANSIENT_JOB_ERRORS = ("temporarily unavailable", "try again", "reconnecting", "connection reset",
                         "timed out", "timeout")
_NOT_SERVED = ("not a scheduled model", "is not served", "hotswapping is not supported")


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


class JobLost(Exception):
    """A polled job that no status came back for (the server forgot it)."""



class RemoteSetupError(RemoteRunError, BadInputError):
    """The remote run cannot start as configured (no API key, a Python or nnsight version the
    server refuses): fixed on this side, before anything is submitted."""

    exit_code = BadInputError.exit_code



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
    if isinstance(error, (httpx.TransportError, websocket.WebSocketException, OSError, JobLost)):
        # refused, reset, dropped mid-job, timed out, lost
        return _Fault(True, RemoteUnavailableError, f"connection to the server failed: {type(error).__name__}: {text}")
    if isinstance(error, pydantic.ValidationError):
        # the 0.8.1 client parses a websocket close frame as a status message
        return _Fault(True, RemoteUnavailableError, "the server closed the connection mid-job")
    return _Fault(False, RemoteRunError, f"unexpected error in the remote run: {type(error).__name__}: {text}")


def _dns_failure(error: BaseException | None) -> bool:
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
        error, action = state.outcome.exception() if state.outcome else None, state.next_action
        assert error is not None and action is not None  # tenacity calls before_sleep after a failed attempt
        message = scrub(classify(error).message, key)
        log(f"{what}: {message.splitlines()[0]}; retry {state.attempt_number + 1} of {tries} "
            f"in {action.sleep:.3g}s")

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
