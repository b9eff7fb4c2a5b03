"""The `analyze` and `report` commands: their arguments and what they run.

`workbench analyze` / `workbench report` (workbench/cli.py) and `python -m analyses analyze|report`
(which needs neither torch nor nnsight) share these definitions. Only argparse is imported at
module level, so building the CLI's parser stays cheap.
"""

from __future__ import annotations

import argparse
import difflib
import sys

from workbench.definitions import AVERAGE_LAYERS, RANK_BASES, TEXT_SETS

from . import registry

# default condition names; an explicit --reference/--blank/... must name a condition of the store
CONDITION_DEFAULTS = {"reference": "baseline", "blank": "blank", "text_only": "none", "hybrid": "hybrid",
                      "self_swap": "self_swap"}

ANALYZE_HELP = "print the study's tables (markdown, 95%% bootstrap CIs) from a store"
ANALYZE_DESCRIPTION = (
    "Compute the tables of every registered analysis (or the NAMEs given) from STORE and print them as "
    "markdown. Results are cached in STORE/_analyses and reused while the store is unchanged. Tables whose "
    "inputs the store lacks are skipped with one line each."
)
REPORT_HELP = "write the study's tables and figures into DIR/report.md and DIR/report.html"
REPORT_DESCRIPTION = ("Write DIR/report.md with every table of `analyze` and the figures it embeds (PNG, or --format), "
                      "and DIR/report.html: the same report as one self-contained file (figures inline), with the "
                      "definitions, the provenance and the spec of the store's runs.")
DEFAULT_OVERLAY_SAMPLES = 2  # samples `report` draws over their images when --samples names none
FIGURE_FORMATS = ("png", "svg", "pdf")   # what matplotlib's savefig writes that a report can link


class _RegisteredNames(str):
    """The NAME argument's help, listing the registered analyses only when the help is printed:
    listing them imports every analysis (xarray, dask, matplotlib), which building the workbench
    CLI's parser for another command must not pay for. argparse expands a help string with
    `help % params` (CPython 3.11 Lib/argparse.py, HelpFormatter._expand_help)."""

    def __mod__(self, params: object) -> str:
        return f"tables to print (default: all): {', '.join(registry.names())}"


def _token_pair(value: str) -> tuple[int, int]:
    parts = [p.strip() for p in value.split(",")]
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"got {value!r}; expected two token ids, e.g. 101,205")
    return int(parts[0]), int(parts[1])


def _plugin_modules(value: str) -> list[str]:
    return [m.strip() for m in value.split(",") if m.strip()]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", help="path to a workbench store (.zarr directory)")
    parser.add_argument("--force", action="store_true", help="recompute cached analyses")
    parser.add_argument("--models", type=lambda v: [m.strip() for m in v.split(",") if m.strip()],
                        help="comma-separated model ids (default: every model in the store)")
    parser.add_argument("--reference", help="reference condition: the real image, unmodified, which the comparisons (`compare`, "
                        "KLs, cosines) are against (default: baseline)")
    parser.add_argument("--blank", help="blank-image condition (default: blank)")
    parser.add_argument("--text-only", help="no-image condition (default: none)")
    parser.add_argument("--hybrid", help="KV-substitution condition (default: hybrid)")
    parser.add_argument("--swap", action="append", dest="swaps", metavar="CONDITION",
                        help="another KV-swap condition to report beside --hybrid (repeatable), e.g. each of a "
                             "parts or layers sweep")
    parser.add_argument("--self-swap", help="KV-substitution control, the sample as its own donor (default: self_swap)")
    parser.add_argument("--sweep", help="swept variable of the α tables (default: alpha)")
    parser.add_argument("--text-set", choices=TEXT_SETS,
                        help="tokens the 'text' side averages over (default: the store's definition, else text)")
    parser.add_argument("--average-layers", choices=AVERAGE_LAYERS,
                        help="decoder layers a mean over layers covers (default: the store's definition, else all)")
    parser.add_argument("--rank-base", type=int, choices=RANK_BASES,
                        help="rank of a top token that stays on top (default: the store's definition, else 0)")
    parser.add_argument("--step", type=int, default=0, help="decode step of KLs and ranks (default: 0)")
    parser.add_argument("--metric", choices=("kl", "logit_diff", "answer_logprob"), default="kl",
                        help="the patching scans' metric: KL to the base run, the logit difference of --tokens, or "
                             "the answer's log-prob (default: kl)")
    parser.add_argument("--tokens", type=_token_pair, metavar="A,B",
                        help="two token ids: the patching metric logit_diff is ln p(A) - ln p(B)")
    parser.add_argument("--label", metavar="FIELD",
                        help="per-sample field the `probe` analysis decodes, e.g. category, answer, or a field of "
                             "the data's JSONL (default: category)")
    parser.add_argument("--where", metavar="FIELD=VALUE",
                        help="probe only the samples whose FIELD is VALUE, e.g. category=color")
    parser.add_argument("--sae", action="append", metavar="DIR",
                        help="an SAE in SAELens's format (e.g. from `workbench sae train`), or a directory of them, "
                             "that the `sae` analysis encodes the stored activations with (repeatable; needs the "
                             "optional extra 'sae')")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default: 1000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0)")
    parser.add_argument("--plugins", type=_plugin_modules, action="extend", metavar="MODULE[,MODULE]",
                        help="modules to import first, each registering its own analyses "
                             "(analyses.register_analysis; importable from this environment), e.g. mylab.analyses")
    parser.add_argument("--samples", type=lambda v: [s.strip() for s in v.split(",") if s.strip()], default=[],
                        metavar="ID[,ID]", help="samples whose vision tokens are drawn over their images "
                        f"(default: the first {DEFAULT_OVERLAY_SAMPLES} of the reference condition)")
    parser.add_argument("--format", choices=FIGURE_FORMATS, default="png", dest="figure_format",
                        help="file format of the figures (default: png)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="compute on the dask.distributed scheduler at ADDRESS (e.g. tcp://10.0.0.5:8786; "
                             "default: DASK_SCHEDULER_ADDRESS, else local threads); its workers must reach STORE")


def did_you_mean(value: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_analyses(args: argparse.Namespace) -> None:
    """Import `--plugins` (each registers its analyses), then check the NAMEs against the registry,
    with a did-you-mean: a typo is an error (exit 2) before the store is opened."""
    from workbench.errors import BadInputError

    try:
        registry.load_plugins(args.plugins or ())
    except registry.PluginError as err:
        raise BadInputError(f"--plugins: {err}") from err
    known = list(registry.names())
    for i, name in enumerate(getattr(args, "names", None) or ()):
        if name not in known:
            raise BadInputError(f"NAME[{i}]: unknown table {name!r}{did_you_mean(name, known)}; "
                                f"expected one of {', '.join(known)}")


def check_arguments(args: argparse.Namespace) -> None:
    """Argument values that must name something in the store (models, conditions, the swept
    variable) are checked against it, with the same did-you-mean as spec fields: a typo is an
    error (exit 2), not a report of skipped tables. Fills in the defaults of those left out."""
    from workbench.errors import BadInputError

    from .streaming import layout
    from .tables import open_models

    if getattr(args, "metric", "kl") == "logit_diff" and getattr(args, "tokens", None) is None:
        raise BadInputError("--tokens: --metric logit_diff needs two token ids; expected e.g. --tokens 101,205")
    stored = open_models(args.store)  # raises StoreError if there is no store
    if args.models:
        for i, model in enumerate(args.models):
            if model not in stored:
                raise BadInputError(f"--models[{i}]: no model {model!r} in {args.store}"
                                    f"{did_you_mean(model, list(stored))}; expected one of {', '.join(stored)}")
    chosen = [stored[m] for m in (args.models or stored)]
    conditions = sorted({c for ds in chosen for dim in ("token", "run") for c in layout(ds, dim).conditions})
    for name, default in CONDITION_DEFAULTS.items():
        value = getattr(args, name)
        if value is not None and value not in conditions:
            option = "--" + name.replace("_", "-")
            raise BadInputError(f"{option}: no condition {value!r} in {args.store}{did_you_mean(value, conditions)}; "
                                f"expected one of {', '.join(conditions)}")
        setattr(args, name, value if value is not None else default)
    for i, value in enumerate(args.swaps or ()):
        if value not in conditions:
            raise BadInputError(f"--swap[{i}]: no condition {value!r} in {args.store}{did_you_mean(value, conditions)}; "
                                f"expected one of {', '.join(conditions)}")
    sweeps = sorted({v for ds in chosen for dim in ("token", "run") for v in layout(ds, dim).sweep})
    if args.sweep is not None and args.sweep not in sweeps:
        raise BadInputError(f"--sweep: no swept variable {args.sweep!r} in {args.store}{did_you_mean(args.sweep, sweeps)}; "
                            f"expected {'one of ' + ', '.join(sweeps) if sweeps else 'none: the store holds no sweep'}")
    args.sweep = args.sweep or "alpha"
    held = sorted({str(s) for ds in chosen for s in ds["run_sample"].values}) if args.samples else []
    for i, sample in enumerate(args.samples):
        if sample not in held:
            raise BadInputError(f"--samples[{i}]: no sample {sample!r} in {args.store}{did_you_mean(sample, held)}; "
                                f"expected one of {', '.join(held[:10])}{' ...' if len(held) > 10 else ''}")
    _check_fields(args, chosen)
    _check_saes(args)


def _check_saes(args: argparse.Namespace) -> None:
    """`--sae` must name SAEs in SAELens's format, and SAELens (the extra 'sae') must be installed;
    the `sae` table asked for by name needs one. Each is exit 2 with its message."""
    from workbench.errors import BadInputError

    given = getattr(args, "sae", None) or []
    if not given:
        if "sae" in (getattr(args, "names", None) or ()):
            raise BadInputError("--sae: the sae table encodes with an SAE; expected --sae DIR (an SAE in SAELens's "
                                "format, e.g. from `workbench sae train`)")
        return
    from workbench.sae import require_sae_lens

    from .sae import sae_directories, sae_source

    require_sae_lens("--sae (the sae analysis)")
    try:
        args.sae = sae_directories(given)
        for path in args.sae:
            sae_source(path)
    except (ValueError, OSError, KeyError) as err:
        raise BadInputError(str(err)) from None


def _check_fields(args: argparse.Namespace, chosen: list) -> None:
    """`--label` and the field of `--where` must be per-sample fields of the store (exit 2 otherwise)."""
    from workbench.errors import BadInputError

    from .probe import fields, parse_where

    try:
        kept = parse_where(args.where)
    except ValueError as err:
        raise BadInputError(str(err)) from None
    held = sorted({f for ds in chosen for f in fields(ds)})
    for option, field in (("--label", args.label), ("--where", kept[0] if kept else None)):
        if field is not None and field not in held:
            raise BadInputError(f"{option}: no per-sample field {field!r} in {args.store}{did_you_mean(field, held)}; "
                                f"expected one of {', '.join(held) or 'none (the store holds no run labels)'}")


def add_analyze_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("names", nargs="*", metavar="NAME", help=_RegisteredNames("tables to print (default: all)"))
    parser.add_argument("--figures", metavar="DIR",
                        help="also write the figures of these analyses into DIR (in --format)")


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--out", required=True, help="directory for report.md, report.html and the figures")


def _options(args: argparse.Namespace):
    from .tables import Options

    return Options(reference=args.reference, blank=args.blank, text_only=args.text_only, hybrid=args.hybrid,
                   self_swap=args.self_swap, swaps=tuple(args.swaps or ()), sweep=args.sweep, step=args.step, metric=args.metric, tokens=args.tokens, n_resamples=args.resamples, seed=args.seed,
                   force=args.force, figure_format=args.figure_format, samples=tuple(args.samples), label=args.label or "category",
                   where=args.where, sae=tuple(getattr(args, "sae", None) or ()), definitions={"text_set": args.text_set, "average_layers": args.average_layers,
                                                  "rank_base": args.rank_base})


def _progress(args: argparse.Namespace) -> bool:
    """A bar over the analyses (on a terminal only), unless -q or --no-progress."""
    return not (getattr(args, "quiet", False) or args.no_progress)


def run_analyze(args: argparse.Namespace) -> int:
    from .cluster import computing_on, scheduler_address
    from .tables import analyze

    load_analyses(args)
    check_arguments(args)
    with computing_on(scheduler_address(args.scheduler)):
        sys.stdout.write(analyze(args.store, args.names or None, _options(args), args.models, progress=_progress(args)))
        if args.figures:
            _write_figures(args)
    return 0


def _write_figures(args: argparse.Namespace) -> None:
    """`analyze --figures DIR`: the figures of the analyses asked for, a line for each."""
    from .figures import write_figures
    from .tables import open_models

    for figure in write_figures(open_models(args.store, args.models), _options(args), args.figures, args.names or None):
        print(f"figure {figure.name}: " + (f"wrote {figure.path}" if figure.path else f"skipped — {figure.skipped}"),
              file=sys.stderr)   # stdout is the tables' markdown


def run_report(args: argparse.Namespace) -> int:
    from .cluster import computing_on, scheduler_address
    from .report import write_report

    load_analyses(args)
    check_arguments(args)
    with computing_on(scheduler_address(args.scheduler)):
        path = write_report(args.store, args.out, _options(args), args.models, progress=_progress(args))
    figures = sorted(p.name for p in path.parent.glob(f"*.{args.figure_format}"))
    print(f"wrote {path}, {path.with_suffix('.html')} and {len(figures)} figure(s): {', '.join(figures)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m analyses analyze|report ...`: the same commands without the workbench CLI."""
    from workbench.errors import WorkbenchError

    parser = argparse.ArgumentParser(prog="python -m analyses", description="Analyse a workbench store "
                                     "(needs only numpy, xarray, zarr, dask, pandas, matplotlib).")
    sub = parser.add_subparsers(dest="command", required=True)
    add_analyze_arguments(sub.add_parser("analyze", help=ANALYZE_HELP, description=ANALYZE_DESCRIPTION))
    add_report_arguments(sub.add_parser("report", help=REPORT_HELP, description=REPORT_DESCRIPTION))
    args = parser.parse_args(argv)
    try:
        return run_analyze(args) if args.command == "analyze" else run_report(args)
    except WorkbenchError as err:
        print(f"error: {err.user_message()}", file=sys.stderr)
        return err.exit_code
