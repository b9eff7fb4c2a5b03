"""Analyses on a dask.distributed cluster: `workbench analyze|report --scheduler ADDRESS` (or
DASK_SCHEDULER_ADDRESS).

The analyses build their dask graphs as they always do (`analyses.streaming`); within
`computing_on(address)` every `dask.compute` runs them on the cluster's workers instead of local
threads. The client is scoped to the command: it is never made dask's default (Client's
`set_as_default=False`, distributed/client.py), and dask's `scheduler` setting names it only
inside a `dask.config.set` block (dask/base.py `get_scheduler` takes a Client there), so nothing
is left behind after the command, whether it finished, failed or never connected.

The workers open the store's chunks themselves: the store must be at a path every worker can
read (a shared file system, or s3://). `pip install "vlm-workbench[cluster]"` brings
dask.distributed; nothing here imports torch or nnsight.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import dask

from workbench.errors import BadInputError, WorkbenchError

ADDRESS_VARIABLE = "DASK_SCHEDULER_ADDRESS"
CONNECT_TIMEOUT_S = 10


class SchedulerError(WorkbenchError):
    """The dask scheduler at the given address could not be reached (a runtime fault: exit 1)."""


def scheduler_address(option: str | None) -> str | None:
    """--scheduler, else DASK_SCHEDULER_ADDRESS, else None (dask's local threads)."""
    return option or os.environ.get(ADDRESS_VARIABLE) or None


@contextlib.contextmanager
def computing_on(address: str | None) -> Iterator[None]:
    """Within this scope dask computes on the scheduler at `address`; None: on local threads."""
    if address is None:
        yield
        return
    try:
        from distributed import Client
    except ImportError:
        raise BadInputError(f"--scheduler {address}: dask.distributed is not installed",
                            hint='pip install "vlm-workbench[cluster]"') from None
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as err:  # refused, timed out, or not an address
        raise SchedulerError(f"cannot reach the dask scheduler at {address}: {err}",
                             hint=f"start one (`dask scheduler`, then `dask worker {address}`), or leave out "
                             f"--scheduler and {ADDRESS_VARIABLE} to compute on local threads") from None
    try:
        with dask.config.set(scheduler=client):
            yield
    finally:
        client.close()
