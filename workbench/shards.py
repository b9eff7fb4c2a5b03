"""Which share of a run this process takes: `--shard k/N` as written, or `--shard auto` from the
environment a launcher sets.

- A SLURM job array (`sbatch --array=1-4`) gives every task SLURM_ARRAY_TASK_ID, and the array's
  SLURM_ARRAY_TASK_COUNT, SLURM_ARRAY_TASK_MIN and SLURM_ARRAY_TASK_MAX (SLURM's sbatch manual,
  "OUTPUT ENVIRONMENT VARIABLES"): shard k = ID - MIN of N = COUNT, for a contiguous array.
- torchrun gives each process RANK and WORLD_SIZE, and LOCAL_RANK / LOCAL_WORLD_SIZE on its node
  (torch/distributed/elastic/agent/server/local_elastic_agent.py, torch 2.13): shard RANK of
  WORLD_SIZE, and each process is given its own GPUs (`visible_devices`), as torchrun's one
  process per GPU intends.

Anything else (neither launcher, both at once, a variable missing or not a number, a strided or
sparse array) is refused, naming the variables, rather than guessed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .objectstore import is_url

SLURM_VARIABLES = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN")
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE")


class ShardError(ValueError):
    """`--shard` cannot be resolved: the message names the value or the variables at fault."""


@dataclass(frozen=True)
class Shard:
    """Share `index` of `count`: samples index, index + count, index + 2 count, ..."""

    index: int
    count: int
    source: str  # "argument", "slurm" or "torchrun"
    devices: str | None = None  # the CUDA_VISIBLE_DEVICES a torchrun process keeps to itself

    def pair(self) -> tuple[int, int]:
        return self.index, self.count


def parse_shard(value: str, environ: Mapping[str, str]) -> Shard:
    """`k/N` with 0 <= k < N, or `auto` (from `environ`)."""
    if value == "auto":
        return shard_from_environment(environ)
    k, _, n = value.partition("/")
    if k.isdigit() and n.isdigit() and 0 <= int(k) < int(n):
        return Shard(int(k), int(n), "argument")
    raise ShardError(f"got {value!r}; expected k/N with 0 <= k < N, e.g. 0/4, or auto (from a SLURM array "
                     "or torchrun)")


def shard_from_environment(environ: Mapping[str, str]) -> Shard:
    slurm = [name for name in SLURM_VARIABLES if name in environ]
    torchrun = [name for name in TORCHRUN_VARIABLES if name in environ]
    if slurm and torchrun:
        raise ShardError(f"auto found both a SLURM array ({_listed(environ, slurm)}) and torchrun "
                         f"({_listed(environ, torchrun)}); give the share explicitly: --shard k/N")
    if slurm:
        return _from_slurm(environ)
    if torchrun:
        return _from_torchrun(environ)
    raise ShardError("auto found neither a SLURM array (" + ", ".join(SLURM_VARIABLES) + ") nor "
                     "torchrun (" + ", ".join(TORCHRUN_VARIABLES) + ") in the environment; launch with "
                     "`sbatch --array=0-3` or `torchrun --nproc-per-node=4`, or give --shard k/N")


def _from_slurm(environ: Mapping[str, str]) -> Shard:
    task, count, low = (_integer(environ, name, SLURM_VARIABLES) for name in SLURM_VARIABLES)
    high = _integer(environ, "SLURM_ARRAY_TASK_MAX", ("SLURM_ARRAY_TASK_MAX",)) \
        if "SLURM_ARRAY_TASK_MAX" in environ else low + count - 1
    # --array=0-10:2 or --array=1,5,7 number the tasks with gaps: ID - MIN would skip shards
    if count < 1 or high - low + 1 != count or not low <= task <= high:
        raise ShardError(f"auto needs a contiguous SLURM array (e.g. --array=0-{max(count, 1) - 1}); got "
                         + _listed(environ, [*SLURM_VARIABLES, "SLURM_ARRAY_TASK_MAX"]))
    return Shard(task - low, count, "slurm")


def _from_torchrun(environ: Mapping[str, str]) -> Shard:
    rank, size = (_integer(environ, name, TORCHRUN_VARIABLES) for name in TORCHRUN_VARIABLES)
    if not 0 <= rank < size:
        raise ShardError(f"auto needs 0 <= RANK < WORLD_SIZE; got {_listed(environ, TORCHRUN_VARIABLES)}")
    return Shard(rank, size, "torchrun", visible_devices(environ))


def visible_devices(environ: Mapping[str, str]) -> str | None:
    """The CUDA_VISIBLE_DEVICES of one of several torchrun processes on a node: an equal, disjoint
    slice of the GPUs CUDA_VISIBLE_DEVICES lists, per local process (LOCAL_RANK of
    LOCAL_WORLD_SIZE), so that `--device cuda` in every process does not land on the same GPU;
    with CUDA_VISIBLE_DEVICES unset, process i takes GPU i. None (left as is) for a single
    process on its node, which may spread a model over every GPU (`backend.device_map`)."""
    names = ("LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if "LOCAL_RANK" not in environ or "LOCAL_WORLD_SIZE" not in environ:
        return None
    local, processes = (_integer(environ, name, names) for name in names)
    if processes <= 1:
        return None
    if "CUDA_VISIBLE_DEVICES" not in environ:
        return str(local)
    gpus = [g for g in environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    each = len(gpus) // processes
    if each == 0 or not 0 <= local < processes:
        raise ShardError(f"torchrun started {processes} processes on this node and CUDA_VISIBLE_DEVICES lists "
                         f"{len(gpus)} GPU(s) ({_listed(environ, [*names, 'CUDA_VISIBLE_DEVICES'])}): "
                         "give each process at least one GPU")
    return ",".join(gpus[local * each:(local + 1) * each])


def shard_store_path(path: str, shard: tuple[int, int]) -> str:
    """stores/x.zarr -> stores/x.shard0of4.zarr: each shard writes its own local store. An
    object store (s3://) is written by every shard at once: its path is kept."""
    if is_url(path):
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.shard{shard[0]}of{shard[1]}{p.suffix}"))


def _integer(environ: Mapping[str, str], name: str, group: tuple[str, ...]) -> int:
    value = environ.get(name)
    if value is None or not value.strip().lstrip("-").isdigit():
        raise ShardError(f"auto needs {', '.join(group)} as integers; got {_listed(environ, group)}")
    return int(value)


def _listed(environ: Mapping[str, str], names: list[str] | tuple[str, ...]) -> str:
    return ", ".join(f"{name}={environ[name]}" if name in environ else f"{name} unset" for name in names)
