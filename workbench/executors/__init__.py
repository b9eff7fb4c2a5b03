"""Executors: where a run's traces execute, chosen once per run (`choose_executor`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .protocol import Executor, LazyInputs, Outcome, SampleWork  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from ..backends.remote_config import RemoteConfig
    from ..spec import Spec


def choose_executor(spec: Spec, remote: bool | str | RemoteConfig | None = None, device: str = "auto", dtype: str = "auto",
                    log: Callable[[str], None] = print) -> Executor:
    """The run's executor. remote: None runs where the spec's `backend.kind` says; False runs
    locally; True (NDIF), "local" (nnsight's in-process simulation), a server URL or a
    `RemoteConfig` run remotely. device / dtype "auto": the spec's `backend` ones."""
    backend = spec.backend
    if remote is not None or backend.kind == "remote":
        from ..backends.remote_config import RemoteConfig

        config = RemoteConfig.resolve(remote, backend.kind)
        if config is not None:
            from .remote import RemoteExecutor

            return RemoteExecutor(config, log, backend.samples_per_job)
    from .local import LocalExecutor

    return LocalExecutor(device if device != "auto" else backend.device,
                         dtype if dtype != "auto" else backend.dtype, backend.device_map, log)
