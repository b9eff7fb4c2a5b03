"""Analyses of a workbench store: the tables and figures of the norm-gap study.

They read the store with xarray/zarr/dask/numpy (and matplotlib for figures) and never import
torch or nnsight, so a store copied off a GPU machine can be analysed anywhere
(`python -m analyses analyze STORE` needs nothing else; `workbench analyze` / `workbench report`
are the same commands in the workbench CLI).

Per model (`ds = analyses.cache.open_model(store, model)`, or `workbench.open_store(store,
model=...)` without caching), each function returns labeled xarray with a `stat` dim
(value, ci_low, ci_high: 95% bootstrap CI over samples) or, with `per_sample=True`, one value
per sample:

- `norms.norm_curves`, `norms.vision_text_ratio`            residual-stream norms by modality
- `updates.absolute_update`, `updates.relative_update`      ‖h_l − h_{l−1}‖, ‖u_l‖/‖h_{l−1}‖
- `rotation.cosine_to_first`, `rotation.cosine_to_previous` cos(h_l, h_0), cos(h_l, h_{l−1})
- `correlation.text_curve_correlation`                      text curves across conditions
- `attention.prefill_vision_mass`, `attention.decode_vision_mass`, `attention.vision_attention_kl`
- `logits.logit_kl`, `logits.median_rank`                   next-token distributions
- `kv.kv_cosine`, `kv.kv_substitution`                      the KV cache under intervention
- `compare.output_metrics`, `compare.hidden_metrics`,      any condition against a reference: output
  `compare.answer_logprob_delta`, `compare.accuracy_metrics`  KL, rank, agreement; ‖h‖/‖h_ref‖, cos; Δ ln p(answer); accuracy

The definitions the study leaves open are keyword arguments with the defaults of its code
(`text_set=` of the residual-stream functions, `average_layers=` of `kv_cosine` and
`vision_attention_kl`, `rank_base=` of `median_rank`; see `workbench.definitions`); the tables
take them from the store's `definitions` attr and print them.

Store-wide: `tables.analyze(store)` (markdown), `tables.build_tables(store)` (with xarray data
over a `model` dim), `report.write_report(store, out)`, over every registered analysis. Each
analysis is declared once, by `register_analysis(Analysis(...))` (`registry`): its inputs, its
metrics, its table, its figures and its report section. The built-ins are one module each in
`analyses/builtin/`; a user's module registers the same way and is loaded with `--plugins MODULE`
(or an entry point of the group `workbench.analyses`). Tables are built with `tables.Builder`,
figures with `figures.Plot` and the drawing helpers of `plotting`; `report` also writes the
report as one HTML file (`html`). Expensive per-sample reductions are cached in the store
(`cache`); `streaming` reads bounded blocks; `synthetic` writes a store whose answers are known,
for tests and demos.
"""

from .registry import Analysis, register_analysis

__all__ = ["Analysis", "register_analysis"]
