"""Is the Hugging Face hub reachable? One quick probe per process, so that a machine without the
network fails in seconds with a hint instead of after half a minute of retries per file.
Torch-free (the data side uses it too)."""

from __future__ import annotations

_REACHABLE: dict[str, bool] = {}


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_offline() -> bool:
    """HF_HUB_OFFLINE=1: the user switched the network off for Hugging Face libraries."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the hub answers at all (any HTTP status counts: a refusal is still an answer)."""
    endpoint = hub_endpoint()
    if endpoint not in _REACHABLE:
        import httpx

        try:
            httpx.head(endpoint, timeout=timeout_s)
            _REACHABLE[endpoint] = True
        except httpx.HTTPError:
            _REACHABLE[endpoint] = False
    return _REACHABLE[endpoint]
