"""`kv-substitution`: per model and KV-swap condition, D_KL(z_real ‖ z_hybrid),
D_KL(z_blank ‖ z_hybrid), D_KL(z_real ‖ z_blank) and the self-swap control D_KL(z_real ‖ z_self)
(`kv.kv_substitution`). No figure.
"""

from __future__ import annotations

import xarray as xr

from .. import kv
from ..registry import Analysis, register_analysis
from ..streaming import layout
from ..tables import Builder, Options, Table, estimate, missing


def kv_substitution_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    real, blank, own = options.reference, options.blank, options.self_swap
    swaps = list(dict.fromkeys((options.hybrid, *options.swaps)))
    b = Builder("kv-substitution", f"KV-cache substitution ({', '.join(swaps)}: {real} image decoding from the "
                f"{blank} image's KV cache; step {options.step})",
                ["model", "condition", "D_KL(z_real ‖ z_hybrid)", "D_KL(z_blank ‖ z_hybrid)", "D_KL(z_real ‖ z_blank)",
                 "D_KL(z_real ‖ z_self)"], options)

    def present(ds: xr.Dataset) -> list[str]:
        return [c for c in swaps if c in layout(ds, "run").conditions]

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, ("logprobs",), (real, blank))
        if not present(ds):
            lacking.append(f"condition {' or '.join(repr(c) for c in swaps)}")
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        rows = []
        for hybrid in present(ds):
            data = kv.kv_substitution(ds, real, blank, hybrid, options.step, self_swap=own, **options.boot())
            control = estimate(data["kl_real_self"], 3) if "kl_real_self" in data else "n/a"
            b.table.rows.append([model, hybrid, estimate(data["kl_real_hybrid"], 3), estimate(data["kl_blank_hybrid"], 3),
                                 estimate(data["kl_real_blank"], 3), control])
            b.count(model, data["kl_real_hybrid"])
            rows.append(data.expand_dims(condition=[hybrid]))
        return xr.concat(rows, dim="condition", join="outer")

    return b.run(models, need, fill, first_note=(
        f"z_hybrid: the row's condition. D_KL(z_real ‖ z_blank) is the scale the hybrid KLs read "
        f"against (the whole image replaced); D_KL(z_real ‖ z_self) is the control {own!r} (the "
        "sample as its own donor), which must be 0 up to float round-off (n/a: no such condition "
        "stored)."))


register_analysis(Analysis(
    name="kv-substitution", section="KV-cache substitution", inputs=("logprobs",), metrics=(kv.kv_substitution,),
    table=kv_substitution_table, order=70))
