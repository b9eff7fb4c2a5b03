"""Names the store reserves: a condition or sweep variable that took one would overwrite a label,
a coordinate or a zarr file, or escape its group. Checked in the spec (with a located error) and
again by the store writer."""

from __future__ import annotations

from .sites import variable_dims

TOKEN_LABELS = ("sample", "position", "modality", "token_id")
# vision-tower rows (`patch` dim): the sample and the row's index within it
PATCH_LABELS = ("patch_sample", "patch_position")
RUN_LABELS = ("run_sample", "run_tokens", "run_input", "run_patches")
# each token's place in its image (workbench.models.geometry: int32 and float32, -1 where none)
GEOMETRY_LABELS = ("image", "tile", "patch_row", "patch_col", "box_x0", "box_y0", "box_x1", "box_y1")
# ... stored together as one (token, GEOMETRY_DIM) float32 array, unpacked when a store is read
GEOMETRY, GEOMETRY_DIM = "geometry", "geometry_label"
# readable labels the runner stores beside the ids (workbench.labels.text_labels)
TEXT_LABELS = ("token_text", "run_prompt", "run_question", "run_category", "run_answer", "run_eval_mode", "run_all_answers",
               "run_generated_text", "run_response", "run_answer_ids", "run_id_texts")
# the per-run text labels above (all but token_text) are stored together, one JSON object per run,
# in this one array: a commit then appends one array for them instead of eight
RUN_TEXT = "run_text"
RUN_TEXT_LABELS = tuple(name for name in TEXT_LABELS if name.startswith("run_"))
# run variables no site captures: an attribution scan's estimate of m(run) − m(base) per run
# (`workbench.attribution`), stored in place of the run's captures
ESTIMATE_DIMS = {"attribution": ("run",)}
# labels the store derives from the run rows instead of storing them per token (patch)
DERIVED_LABELS = ("sample", "position", "patch_sample", "patch_position")


def _reserved(dims_of: dict[str, tuple[str, ...]]) -> frozenset[str]:
    dims = dict.fromkeys(d for row_dims in dims_of.values() for d in ("token", "run", *row_dims))
    return frozenset({".", "..", "zarr.json", "condition", "patch_condition", *TOKEN_LABELS, *PATCH_LABELS,
                      *GEOMETRY_LABELS, GEOMETRY, GEOMETRY_DIM, *RUN_LABELS, *TEXT_LABELS, RUN_TEXT, *dims, *dims_of,
                      "n_tokens", "nonfinite"})


# every capture's variable and dims come from the site registry; these are the built-in sites'
# (a store's keys are escaped by this fixed set, the same in every process: store/repository.py)
_BUILTIN_DIMS = variable_dims()
DIMS = tuple(dict.fromkeys(d for dims in _BUILTIN_DIMS.values() for d in ("token", "run", *dims)))
VARIABLES = (*_BUILTIN_DIMS, "n_tokens", "nonfinite")
RESERVED_NAMES = _reserved(_BUILTIN_DIMS)


def reserved_name_problem(name: str) -> str | None:
    """Why `name` cannot name a condition or sweep variable, or None (a plugin site's variables
    and dims are reserved too, once it is registered)."""
    reserved = RESERVED_NAMES | _reserved(variable_dims())
    if name in reserved:
        shown = ", ".join(sorted(reserved - {".", ".."}))
        return f"'{name}' is reserved by the store; expected a name other than . .. {shown}"
    if not name or name.strip() != name or "/" in name or "\\" in name or name.startswith((".", "_", "run_")):
        return f"'{name}' cannot name a store group; expected no '/' or '\\\\', no leading '.', '_' or 'run_'"
    return None
