"""The `workbench` command line: run, validate, info, verify, analyze, report, check, families, sae."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from .plan import ModelPlan
    from .spec import Spec
    from .shards import Shard

_LOG = logging.getLogger("workbench")


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _load(args: argparse.Namespace) -> Any:
    from .spec import load_spec

    limits = {"conditions": getattr(args, "max_conditions", None), "samples": getattr(args, "max_samples", None)}
    spec = load_spec(args.spec, limits=limits)
    overrides = {
        "models": getattr(args, "models", None),
        "data_source": getattr(args, "data", None),
        "limit": getattr(args, "limit", None),
        "store_path": getattr(args, "store", None),
        "device": getattr(args, "device", None),
        "dtype": getattr(args, "dtype", None),
    }
    if any(v is not None for v in overrides.values()):
        spec = spec.with_overrides(**overrides)
    return spec


def cmd_validate(args: argparse.Namespace) -> int:
    from .runner import compile_all
    from .spec.sizes import spec_condition_count

    spec = _load(args)
    plans = compile_all(spec) if args.models_check else []
    if args.quiet:
        return 0
    n_conditions = spec_condition_count(spec)  # counted, not expanded
    print(f"{args.spec}: valid — {len(spec.models)} model(s), {n_conditions} condition(s), "
          f"{spec.data.n} sample(s) from {spec.data.source}, store {spec.store.path}")
    if spec.plugins:
        from .extend import intervention_kinds, site_module
        from .sites import SITES

        def declared(module: str) -> str:
            names = [k.name for k in intervention_kinds().values() if k.module == module]
            names += [f"site {name}" for name in SITES if site_module(name) == module]
            return ", ".join(names) or "no kinds or sites"

        print("  plugins: " + ", ".join(f"{name} ({declared(name)})" for name in spec.plugins))
    for plan in plans:
        print(f"  {plan.info.model_id}: {plan.info.arch.family}, {plan.info.n_layers} layers, "
              f"hidden {plan.info.hidden_size}")
    if args.estimate:
        _print_estimate(spec, plans, timed=args.models_check)
    check = "" if args.models_check else f"workbench validate {args.spec} --models-check (each model's config), or "
    print(f"next: {check}workbench run {args.spec}")
    return 0


def _print_estimate(spec: Spec, plans: list[ModelPlan], timed: bool) -> None:
    """`validate --estimate`: workbench/estimate.py; `timed` (--models-check) adds one measured forward per model."""
    from .estimate import describe, estimate_run, free_disk_problem, measure_forward
    from .worklist import SampleStream

    samples = SampleStream(spec.data)
    estimate = estimate_run(spec, plans or None, samples)
    print("\n".join(describe(estimate)))
    problem = free_disk_problem(str(spec.store.path), estimate.bytes)
    if problem:
        print(f"  warning: {problem}")
    first = next(iter(samples), None)
    if first is None:
        return
    for plan, model in zip(plans if timed else [], estimate.models):
        seconds = measure_forward(plan, first)
        print(f"  {model.model}: one forward (the prompt of {first.id}) took {seconds:.3g} s here; "
              f"{model.forwards} forward(s) take about {seconds * model.forwards:.3g} s (decode steps are shorter)")


def _warn_if_disk_is_short(spec: Spec) -> None:
    """A new store's run whose captures are estimated beyond the disk's free space says so before
    it starts (a warning: the estimate is uncompressed, so the run may still fit). A resumed run
    is not estimated: its store exists, and the estimate would cost it the processors' import
    (seconds) where it may have nothing left to do."""
    from pathlib import Path

    from .estimate import estimate_run, free_disk_problem

    if "://" in str(spec.store.path) or Path(spec.store.path).exists():
        return
    try:
        problem = free_disk_problem(str(spec.store.path), estimate_run(spec).bytes)
    except Exception as err:  # noqa: BLE001  the run itself reports what is wrong, in its own order
        _LOG.debug(f"no disk estimate: {err}")
        return
    if problem:
        _LOG.warning(problem)   # the formatter adds "warning: "


def _remote_target(value: str) -> str:
    if value == "local" or value.startswith(("http://", "https://")):
        return value
    raise argparse.ArgumentTypeError(
        f"got {value!r}; expected a server URL (http://...), 'local', or nothing (NDIF); "
        "put the spec first: workbench run SPEC --remote")


def cmd_ndif_status(args: argparse.Namespace) -> int:
    from .backends.remote_checks import status_table
    from .backends.remote_config import RemoteConfig

    print(status_table(RemoteConfig.from_env(args.remote or True)))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .backends.remote_faults import RemoteRunError
    from .runner import run_spec, tune_allocator

    spec = _load(args)
    shard = args.shard.pair() if args.shard is not None else None
    if shard is not None:
        from .shards import shard_store_path

        spec = spec.with_overrides(store_path=shard_store_path(str(spec.store.path), shard))
        if args.shard.source != "argument":
            _LOG.info(f"shard {shard[0]}/{shard[1]} (from {args.shard.source}) into {spec.store.path}")
        if args.shard.devices is not None:  # read when CUDA starts, after this point
            import os

            os.environ["CUDA_VISIBLE_DEVICES"] = args.shard.devices
    if args.remote is None and getattr(spec.backend, "kind", "local") != "remote":
        _warn_if_disk_is_short(spec)
    tune_allocator()
    quiet = args.quiet
    try:
        summary = run_spec(spec, device=args.device or "auto", dtype=args.dtype or "auto",
                           progress=_progress(args), remote=args.remote, shard=shard)
    except RemoteRunError as err:
        if err.exit_code == 2:  # a setup error (no key, a refused version): checked before the store is touched
            raise
        print(f"error: {err}\nEverything already written to {spec.store.path} is kept; run the same command "
              "again to resume.", file=sys.stderr)
        return 1
    if summary.nonfinite:
        _LOG.warning(f"{len(summary.nonfinite)} capture(s) hold NaN or Inf (stored as is, counted in the "
                     "'nonfinite' variable):\n  " + "\n  ".join(summary.nonfinite[:20]))
    if quiet:
        return 0
    print(f"wrote {summary.written} and skipped {summary.skipped} of {summary.total} "
          f"(model, sample, condition) results into {summary.store}")
    if not args.no_table and summary.total:
        from analyses.norms import print_norm_table

        print_norm_table(summary.store)
    print(f"next: workbench analyze {summary.store}    (tables; `workbench report {summary.store} --out DIR` "
          "for figures, `workbench info` for what is stored)")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from .store import store_history, store_info

    if args.history:
        history = store_history(args.store)
        if args.json:
            print(json.dumps(history, indent=2))
            return 0
        print(f"{'snapshot':<22} {'time (UTC)':<26} {'tags':<10} message")
        for s in history:
            print(f"{s['snapshot']:<22} {s['time']:<26} {','.join(s['tags']):<10} {s['message']}")
        print(f"\nread a past state: workbench.open_store({str(args.store)!r}, snapshot=<tag or snapshot>)")
        return 0
    info = store_info(args.store, snapshot=args.snapshot)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"store {info['path']}  ({info['runs']} run(s) recorded, snapshot {info['snapshot']}, "
          + (f"{info['bytes'] / 1e6:.2f} MB on disk)" if info["bytes"] is not None else "on object storage)"))
    for model_id, model in info["models"].items():
        print(f"\n{model_id}  [{model.get('family', '?')}, {model.get('n_layers', '?')} layers, "
              f"hidden {model.get('hidden_size', '?')}, {model.get('dtype', '?')} on {model.get('device', '?')}]")
        print(f"  {'condition':<20} {'samples':>7} {'tokens':>8} {'layers':>8}  variables")
        for name, c in model["conditions"].items():
            variables = ", ".join(f"{k}{tuple(v['shape'])}" for k, v in c["variables"].items())
            layers = f"{len(c['layers'])}" if c["layers"] else "-"
            print(f"  {name:<20} {c['samples']:>7} {c['tokens']:>8} {layers:>8}  {variables}")
            if c.get("nonfinite_runs"):
                print(f"    {c['nonfinite_runs']} run(s) with NaN/Inf captures (see the 'nonfinite' variable)")
    print(f"\nthis lists the last commit; `workbench verify {args.store}` reads every chunk and checks its "
          f"checksum, and `workbench info {args.store} --history` lists past snapshots")
    return 0


def _shard(value: str) -> Shard:
    import os

    from .shards import ShardError, parse_shard

    try:
        return parse_shard(value, os.environ)
    except ShardError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def cmd_merge(args: argparse.Namespace) -> int:
    from .merge import merge_arguments, merge_stores

    out, shards = merge_arguments(args.out, args.stores)
    merge_stores(out, shards, progress=_progress(args))
    print(f"next: workbench verify {out}   # or: workbench analyze {out}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from .check import check_model, print_results
    from .models.refs import resolve_model

    _quiet_libraries()
    # as `run --models` resolves it, with the same messages; an unregistered type's layout is inferred
    resolve_model(args.model, "command line: MODEL", infer=True)
    return 0 if print_results(args.model, check_model(args.model, device=args.device, dtype=args.dtype)) else 1


def cmd_families(args: argparse.Namespace) -> int:
    from .families import family_entries, format_entries

    _quiet_libraries()
    entries = family_entries()
    print(json.dumps([e.as_json() for e in entries], indent=2) if args.json else format_entries(entries))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from .store import verify_store

    if args.repair:
        from .store import repair_store

        done = repair_store(args.store)
        for line in done:
            print(f"repaired: {line}")
        if not done:
            print(f"{args.store}: its config, branch pointer and branch snapshot read back; nothing to repair")
    damage = verify_store(args.store, progress=_progress(args))
    if args.json:
        print(json.dumps([d.__dict__ for d in damage], indent=2, default=list))
    elif not damage:
        print(f"{args.store}: every chunk read back and matched its checksum")
    else:
        print(f"{args.store}: {len(damage)} damaged piece(s):")
        for d in damage:
            print(f"  {d.describe()}")
            for line in d.details:
                print(f"  {line}")
        if any(d.condition for d in damage):
            print("rerun the spec that wrote the store: it drops the damaged conditions and re-captures them")
    return 1 if damage else 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from analyses.commands import run_analyze

    return run_analyze(args)


def cmd_report(args: argparse.Namespace) -> int:
    from analyses.commands import run_report

    return run_report(args)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="workbench",
        description="Run declarative VLM interpretability experiments (YAML specs) through nnsight "
        "into a labeled zarr store, and inspect the store.",
        epilog="Start with: workbench run specs/demo.yaml, then workbench analyze stores/demo.zarr.",
    )
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    _verbosity(parser, False)
    # -q/-v also after the command: SUPPRESS keeps the top level's value unless given there
    common = argparse.ArgumentParser(add_help=False)
    _verbosity(common, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", parents=[common], help="run a spec into its store (resumes an interrupted run)",
                         description="Run every (model, sample, condition) of SPEC that its store does not hold yet.")
    run.add_argument("spec", help="path to a YAML experiment spec")
    run.add_argument("--store", help="store path (overrides the spec's store.path)")
    run.add_argument("--limit", type=int, help="run only the first N samples")
    run.add_argument("--models", type=_csv, help="comma-separated model ids (override the spec's models)")
    run.add_argument("--data", help="data source override, e.g. builtin")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], help="device (default: the spec's, else auto)")
    run.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="model dtype")
    run.add_argument("--shard", type=_shard, metavar="k/N|auto",
                     help="run samples k, k+N, k+2N, ... into STORE.shardkofN.zarr (N processes or machines share "
                     "a run; `workbench merge` joins their stores); with an s3:// store, every shard commits to "
                     "that one store and no merge is needed. auto: k/N from a SLURM array (SLURM_ARRAY_TASK_ID - "
                     "SLURM_ARRAY_TASK_MIN of SLURM_ARRAY_TASK_COUNT) or from torchrun (RANK of WORLD_SIZE, each "
                     "process on its own GPUs by LOCAL_RANK)")
    _limit_options(run)
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument("--no-table", action="store_true", help="do not print the summary table")
    run.add_argument("--remote", nargs="?", const=True, default=None, type=_remote_target, metavar="URL",
                     help="run on NDIF through nnsight remote execution (the host from NDIF_HOST, the key from "
                     "NDIF_API_KEY); or on the server at URL; 'local' runs nnsight's in-process simulation")
    run.set_defaults(func=cmd_run)

    ndif = sub.add_parser("ndif", parents=[common], help="NDIF: what the server serves",
                          description="Commands about the NDIF server.")
    ndif_sub = ndif.add_subparsers(dest="ndif_command", required=True)
    ndif_status = ndif_sub.add_parser("status", parents=[common], help="the models the server deploys, as a table",
                                      description="List the server's deployed models (GET /status): repo id, "
                                      "revision, task, level, state, class. The host is NDIF_HOST, else nnsight's.")
    ndif_status.add_argument("--remote", type=_remote_target, default=None, metavar="URL", help="another server")
    ndif_status.set_defaults(func=cmd_ndif_status)

    validate = sub.add_parser("validate", parents=[common], help="check a spec without running it",
                              description="Validate SPEC; with --models-check also against each model's config.")
    validate.add_argument("spec")
    validate.add_argument("--models", type=_csv, help="comma-separated model ids (override the spec's models)")
    validate.add_argument("--models-check", action="store_true",
                          help="also compile the plan against each model's config (loads configs, not weights; "
                          "with --estimate, loads each model to time one forward)")
    validate.add_argument("--estimate", action="store_true",
                          help="print the runs and forward passes and the bytes the captures will store, per "
                          "condition and in all (from configs and processors, no weights)")
    _limit_options(validate)
    validate.set_defaults(func=cmd_validate)

    info = sub.add_parser("info", parents=[common], help="what a store holds", description="Models, conditions, samples, "
                          "layers and sizes in STORE, and any damage left by an interrupted run.")
    info.add_argument("store")
    info.add_argument("--json", action="store_true", help="print as JSON")
    info.add_argument("--history", action="store_true", help="list the store's snapshots (one per result) and run tags")
    info.add_argument("--snapshot", help="describe a past state: a run tag (run-1) or a snapshot id")
    info.set_defaults(func=cmd_info)

    merge = sub.add_parser("merge", parents=[common], help="merge the stores of a sharded run (run --shard k/N) into one",
                           description="Merge the stores written by `workbench run SPEC --shard k/N` for k = 0..N-1 "
                           "into OUT, a store equal to a single run's (rows in the same order, labels, identities, "
                           "and every shard's provenance). Resumes an interrupted merge.",
                           epilog="The older form `workbench merge OUT SHARD...` (no --out) still works when OUT is "
                           "new or a merge in progress; it is refused when OUT is itself a shard store.")
    merge.add_argument("stores", nargs="+", metavar="SHARD", help="the shard stores, in any order")
    merge.add_argument("--out", metavar="OUT", help="the merged store (new, or a merge in progress)")
    merge.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    merge.set_defaults(func=cmd_merge)

    check = sub.add_parser("check", parents=[common], help="does the workbench read this model right? (one sample, PASS/FAIL)",
                           description="Run one built-in sample through MODEL (a tiny model name, a local checkpoint "
                           "directory or a hub id) and compare what the workbench reads with independent computations: "
                           "the residual stream against plain PyTorch pre-hooks, the vision-token count against the "
                           "config's image token, and alpha = 1 against the baseline. Exit 1 if any check fails.")
    check.add_argument("model", metavar="MODEL")
    check.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    check.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    check.set_defaults(func=cmd_check)

    families = sub.add_parser("families", parents=[common], help="every supported model family and what applies to it",
                              description="Each registered family: its model types and classes, its tiny model, an "
                              "example hub id, the sites and interventions that apply, and why the others do not "
                              "(asked of each family's config as `validate --models-check` asks, no weights). A model "
                              "of another type whose modules follow one of these layouts is read by `workbench check`.")
    families.add_argument("--json", action="store_true", help="a JSON list, one object per family")
    families.set_defaults(func=cmd_families)

    verify = sub.add_parser("verify", parents=[common], help="read every chunk of a store and check its checksum",
                            description="Read every chunk of STORE's last commit, check each CRC-32C, and report "
                            "each damaged chunk by model, condition, variable and row range (exit 1 if any).")
    verify.add_argument("store")
    verify.add_argument("--json", action="store_true", help="print as JSON")
    verify.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    verify.add_argument("--repair", action="store_true",
                        help="first point a branch whose pointer, config or snapshot is damaged at the newest "
                             "intact snapshot")
    verify.set_defaults(func=cmd_verify)

    from .sae import add_sae_parser  # argparse only: SAELens loads when `sae train` runs

    add_sae_parser(sub, common)

    from analyses import commands  # argparse only: the analyses themselves load on use

    analyze = sub.add_parser("analyze", parents=[common], help=commands.ANALYZE_HELP, description=commands.ANALYZE_DESCRIPTION)
    commands.add_analyze_arguments(analyze)
    analyze.set_defaults(func=cmd_analyze)

    report = sub.add_parser("report", parents=[common], help=commands.REPORT_HELP, description=commands.REPORT_DESCRIPTION)
    commands.add_report_arguments(report)
    report.set_defaults(func=cmd_report)
    return parser


def _count(value: str) -> int:
    if value.replace("_", "").isdigit() and int(value) >= 1:
        return int(value)
    raise argparse.ArgumentTypeError(f"got {value!r}; expected an integer >= 1")


def _limit_options(parser: argparse.ArgumentParser) -> None:
    """Sizes past these are refused before anything expands (workbench/spec/sizes.py)."""
    from .spec.sizes import DEFAULT_MAX_CONDITIONS, DEFAULT_MAX_SAMPLES

    parser.add_argument("--max-conditions", type=_count, metavar="N",
                        help=f"allow up to N conditions after sweeps expand (the spec's limits.conditions, "
                        f"default {DEFAULT_MAX_CONDITIONS:,})")
    parser.add_argument("--max-samples", type=_count, metavar="N",
                        help=f"allow up to N samples from the data source (the spec's limits.samples, "
                        f"default {DEFAULT_MAX_SAMPLES:,})")


def _verbosity(parser: argparse.ArgumentParser, default: Any) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true", default=default,
                       help="only warnings and errors: no progress bar, notes, tables or hints")
    group.add_argument("-v", "--verbose", action="store_true", default=default,
                       help="more detail, and the traceback of an error")


class _StderrHandler(logging.Handler):
    """Log records to the current stderr, through tqdm so a progress bar stays intact."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001  (logging must never raise)
            self.handleError(record)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        return f"{record.levelname.lower()}: {message}" if record.levelno >= logging.WARNING else message


def configure_logging(quiet: bool = False, verbose: bool = False) -> None:
    """The `workbench` logger to stderr: INFO by default, WARNING with -q, DEBUG with -v."""
    handler = _StderrHandler()
    handler.setFormatter(_Formatter())
    _LOG.handlers[:] = [handler]
    _LOG.propagate = False
    _LOG.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)


def _quiet_libraries(progress: bool = False) -> None:
    """Our own bar is the one to watch: transformers' per-file load bars and info logs are off.
    huggingface_hub's download bars (a first download can take minutes, and only they measure it)
    stay on a terminal unless `progress` is off (-q, --no-progress). This process is ours: no restore."""
    try:
        import huggingface_hub.utils
        import transformers
    except ImportError:  # the analysis-only install has neither
        return
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if not progress:
        huggingface_hub.utils.disable_progress_bars()


def _progress(args: argparse.Namespace) -> bool:
    """Whether a command draws its bar: not with -q or --no-progress (and only on a terminal)."""
    return not (getattr(args, "quiet", False) or getattr(args, "no_progress", False))


def main(argv: Sequence[str] | None = None) -> int:
    from .errors import EXIT_SIGINT, EXIT_SIGTERM, Interrupted, Terminated, WorkbenchError
    from .signals import restore_sigterm, stop_on_sigterm

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `workbench`: the help, not an error
        parser.print_help()
        return 0
    configure_logging(args.quiet, args.verbose)
    if args.command in ("run", "validate"):  # the commands that load models
        _quiet_libraries(args.command == "run" and _progress(args))
    previous = stop_on_sigterm()
    try:
        return args.func(args)
    except Interrupted as err:  # a run stopped by Ctrl-C / SIGTERM: how much is stored, how to go on
        print(str(err), file=sys.stderr)
        return err.exit_code
    except WorkbenchError as err:  # expected failures: one message, no traceback (unless -v)
        if args.verbose:
            import traceback

            traceback.print_exc()
        print(f"error: {err.user_message()}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt as exc:  # outside a run (analyze, report, loading): nothing to resume
        print("interrupted", file=sys.stderr)
        return EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT
    finally:
        restore_sigterm(previous)


if __name__ == "__main__":
    sys.exit(main())
