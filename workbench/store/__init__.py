"""The activation store: captured tensors in a transactional zarr repository, read back as labeled
xarray objects.

A store is an **icechunk** repository (Earthmover's transactional storage engine for zarr v3) on
the local filesystem, or on object storage at `s3://bucket/prefix` (`objects`: the
one place that handles URLs; endpoint and credentials from the AWS_* environment). Its zarr
hierarchy:

    /                                 root attrs: format version, provenance of every run
      <model key>/                    one group per model (models differ in depth and width);
                                      attrs: the model's identity (architecture, revision, dtype, ...)
        <condition>/                  one group per condition; attrs["identity"]: what it means
          hidden    (token, layer, dim)  float32   the residual stream
          modality, token_id, token_text (token)            per-token labels (modality: int8
                                                            codes into MODALITIES)
          layer     (layer)                                 layer index of each stored slice
          run_sample, run_tokens, run_input (run)           one row per sample
          run_text  (run)                                   the per-run text labels, one JSON object

Every sample is appended as one "long" block of tokens (no padding across samples). Each token's
`sample` and `position` (and each vision-tower row's `patch_sample` and `patch_position`) follow
from the run rows (`run_sample`, `run_tokens`, `run_patches`) and are derived when a store is
read, not stored (format 3): every array costs a commit a few milliseconds whatever it holds.

Guarantees.
- Atomic commits: each (model, sample, condition) result is one icechunk commit: its groups,
  arrays, attrs, coordinates, rows and labels appear together or not at all. A process killed at
  any instant leaves the store at its last commit; the chunks it wrote after that are unreferenced.
- Consistent readers: `open_store`, `store_info` and `verify` read one committed snapshot, so
  they never see partial rows while a run writes. Every run's last snapshot is tagged
  `run-<n>`; `open_store(path, snapshot="run-1")` reads a past state.
- Checksums: every chunk ends with a CRC-32C (zarr v3's `crc32c` codec); `verify` reads everything
  and reports each damaged chunk by model, condition, variable and row range. A rerun drops the
  damaged conditions (in one commit) and re-captures them.
- No silent mixing: a condition's identity (resolved interventions, data source and seed, capture
  layout) and a model's (revision, dtype, device kind) are stored; a resume whose identity differs
  is refused, as is a sample whose input changed under the same id.
- One writer at a time on a local store (a lock file beside the store, on its real path); any
  number of readers.
- Several writers on an object store (shards: `workbench run SPEC --shard k/N` with an s3:// store):
  no lock; icechunk refuses a commit whose branch moved since its session began, and the writer
  re-stages it on the new tip (`StoreWriter.write_samples`: the touched conditions' layout and the
  provenance list are read again) and retries with a random back-off. A session that starts on a
  tip this writer did not commit drops every cached layout first, so a stale row count never
  overwrites another writer's rows. Run tags are per writer and nothing is compacted (see
  `finish_run`).

Dtype and codec (measured: benchmarks/README.md): float32 with Blosc lz4 (level 1) +
byte shuffle, then CRC-32C. zarr has no bfloat16; fp16 overflows on massive activations. fp32
holds bf16 values exactly. Chunks: ~2 MiB, one layer per chunk, the whole hidden dimension, so
per-layer reductions stream.

Modules, each importing only those listed before it:
    objects     store locations on object storage (s3://), icechunk errors in one line
    repository  the icechunk repository and its snapshots
    paths       path checks, the writer lock, disk failures, fault points of the kill drills
    layout      `Variable`, chunk shapes, dtypes, codecs
    staging     identity checks and a result's rows on their way into a commit
    appending   a block of rows appended to a condition's arrays (zarr's public API)
    readers     the compaction at a run's end, and the readers it keeps safe
    repair      damaged metadata (branch pointer, config, snapshot) back to an intact snapshot
    verify      every chunk read back and checked
    writer      `StoreWriter`
    reading     `open_store`, `store_info`, `store_history`, `list_models`
"""

from ..errors import StoreError, StorePathError
from .layout import _CHUNK_BYTES, _LABEL_CHUNK, MODALITIES, PATCH_DIM, Variable, _array_layout, _chunks
from .objects import ObjectStore, _short, location
from .paths import StoreBusyError, StoreIOError, check_store_path, fault_point, io_failure, lock_path
from .reading import (
    ANALYSES_GROUP, ANALYSIS_KIND, PATCH_PREFIX, RUN_PREFIX, _read_session, _reading, list_models, open_store, store_history,
    store_info,
)
from .repair import Diagnosis, IntactSnapshot, diagnose, repair_store
from .repository import BRANCH, RUN_END, RUN_TAG, STORE_FORMAT, _open_repo, _root_of, is_store, model_key
from .staging import MODEL_IDENTITY, ROW_NAMES, StoredResult, StoreIdentityError, identity_diff
from .verify import Damage, verify_store
from .writer import COMMIT_TRIES, CREATE_WAIT_S, BranchMovedError, StoreWriter

__all__ = [
    "ANALYSES_GROUP", "ANALYSIS_KIND", "BRANCH", "COMMIT_TRIES", "CREATE_WAIT_S", "MODALITIES", "MODEL_IDENTITY",
    "PATCH_DIM", "PATCH_PREFIX", "ROW_NAMES", "RUN_END", "RUN_PREFIX", "RUN_TAG", "STORE_FORMAT", "BranchMovedError", "Damage",
    "Diagnosis", "IntactSnapshot", "ObjectStore", "StoreBusyError", "StoreError", "StoreIOError",
    "StoredResult", "StoreIdentityError", "StorePathError", "StoreWriter", "Variable", "check_store_path", "diagnose", "fault_point",
    "identity_diff", "io_failure", "is_store", "list_models", "location", "lock_path", "model_key", "open_store",
    "repair_store", "store_history", "store_info", "verify_store",
    # private, used by other workbench modules and the tests
    "_CHUNK_BYTES", "_LABEL_CHUNK", "_array_layout", "_chunks", "_open_repo", "_read_session", "_reading",
    "_root_of", "_short",
]
