"""The analyses registry: every analysis once, by name -> its table -> its figures -> its report
section. `workbench analyze` (the table names it accepts and prints), `workbench report` (its
sections, in this order) and the CLI's choices all read it; adding an analysis is a table builder
in `analyses.tables`, its figures in `analyses.figures` and one entry here.

Import-light on purpose (no xarray, no matplotlib): the CLI reads it to build `--help`.
"""

from __future__ import annotations

from typing import NamedTuple


class Analysis(NamedTuple):
    name: str                   # the table's name: `workbench analyze STORE NAME`
    table: str                  # its builder in analyses.tables
    figures: tuple[str, ...]    # names in analyses.figures.FIGURES
    section: str                # the report's heading: what is measured
    claim: str | None = None    # what the study reports about it, quoted in the report, or None


ANALYSES: tuple[Analysis, ...] = (
    Analysis("norm-ratio", "norm_ratio_table", ("norms_updates",), "Vision and text token norms at the LLM input",
             "vision tokens enter the LLM with higher norms than text tokens (Observation 1)"),
    Analysis("first-update", "first_update_table", ("cosine_to_first",), "First-layer update and rotation by modality",
             "high norms dilute vision-token updates: the first layer changes vision tokens less, relative to their "
             "norm, than text tokens (Observation 2)"),
    Analysis("correlation", "correlation_table", ("text_curves",), "Text-token trajectories with a real, blank or no image"),
    Analysis("alpha", "alpha_table", ("kl_vs_alpha", "attention_mass"), "Scaling the projector output (α sweep)"),
    Analysis("kv-cosine", "kv_cosine_table", ("kv_cosine_vs_alpha",), "Vision-token keys and values under α"),
    Analysis("kv-heads", "kv_heads_table", ("kv_heads_vs_alpha",), "Vision-token keys and values per KV head under α"),
    Analysis("kv-substitution", "kv_substitution_table", (), "KV-cache substitution"),
    Analysis("depth", "depth_table", ("depth",), "Norm growth and update size with depth"),
    Analysis("heads", "heads_table", ("heads",), "Attention per head: vision mass and the sink"),
    # no claim quoted: the study measured two models; the cross-family question is the guide's
    Analysis("atlas", "atlas_table", ("norm_ladder",), "Norms across the vision-language interface (norm atlas)"),
    Analysis("update-decomposition", "update_decomposition_table", ("branch_shares",),
             "Attention and MLP updates by modality and layer",
             "due to higher norms, the same update vector has a smaller impact on vision tokens (Observation 2)"),
    Analysis("trajectories", "trajectories_table", ("trajectories_vs_alpha",), "Vision-token trajectories against α",
             "inference-time downscaling breaks visual trajectories, decode-time attention patterns, and output logits"),
    Analysis("logit-lens", "logit_lens_table", ("lens_curves",), "Logit lens on vision and text tokens by layer"),
    Analysis("accuracy", "accuracy_table", ("accuracy_vs_alpha",), "Task accuracy under each condition",
             "Fan et al. suggest that scaling vision tokens down at inference time degrades visual understanding "
             "(cited there, not measured)"),
)

NAMES: tuple[str, ...] = tuple(a.name for a in ANALYSES)


def by_name(name: str) -> Analysis:
    return next(a for a in ANALYSES if a.name == name)
