"""Where and how remote jobs run: `RemoteConfig`, from the WORKBENCH_REMOTE_* environment
(`RemoteEnv`) and the run's `remote` argument."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..errors import BadInputError


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


def _strip_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"

