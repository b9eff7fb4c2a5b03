"""Public signatures use the project's own types (`Spec`, `ModelInfo`, `ModelPlan`, ...) and the
libraries' (icechunk `Repository`, `Session`): `Any` only where a value really is arbitrary. Each
public function or method of workbench/ and analyses/ whose signature names `Any` is listed in
`ANY_ALLOWED` with why; a new one fails here until it is typed or listed."""

from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("workbench", "analyses")

# "module:qualname" patterns (fnmatch) -> why `Any` is right there
ANY_ALLOWED: dict[str, str] = {
    # nnsight 0.8.1 ships no types: what a trace hands out is untyped, and this code travels to NDIF
    "workbench.sites.*": "nnsight envoys and proxies read and edited inside a trace, and saved values by key",
    "workbench.capture:*": "nnsight proxies read inside a trace, and readers of every site",
    "workbench.backends.local:*": "nnsight proxies, live tensors and the model-built KV cache inside traces",
    "workbench.backends.ndif_job:*": "the server's deployed nnsight model and its tensors",
    "workbench.models.protocol:*": "nnsight's model and envoys, and the families' processors (no common type)",
    "workbench.models.model:WorkbenchModel.*": "nnsight envoys, and the processor's raw outputs",
    "workbench.models.remote:RemoteModel.*": "nnsight's remote model, and the processor's raw outputs",
    "workbench.interventions.*.bind": "values read at a source condition, by layer key (None: a layer-less site)",
    "workbench.interventions.*.from_spec": "the kind's own validated spec model (each kind has its own class)",
    "workbench.interventions.base:needs_source": "an intervention of any kind, its `source` read if it has one",
    "workbench.extend:InterventionKind.source_of": "the kind's own validated spec model",
    "workbench.plan:build_intervention": "the kind's own validated spec model",
    # values that are arbitrary by nature
    "workbench.spec.*": "raw spec values as YAML gives them, before or while they are validated",
    "workbench.models.refs:model_ref_problem": "a raw spec value, refused with a message when not a model name",
    "workbench.definitions:*": "definition values as YAML gives them (numbers, strings, lists)",
    "workbench.store.*": "JSON values: a store's attributes, identities and provenance",
    "workbench.provenance:provenance": "JSON values of the provenance record",
    "workbench.resume:*": "JSON values of a run's identity",
    "workbench.verified:collect": "JSON values of the verification record",
    "workbench.plan:ConditionPlan.store_attrs": "JSON values of a condition's store attributes",
    "workbench.models.model:ModelInfo.describe": "JSON values of a model's description",
    "workbench.*.describe": "JSON values of a description stored with the run",
    "workbench.backends.remote_config:*": "settings as the environment and the caller give them",
    "workbench.backends.remote_checks:*": "NDIF's /status and /env responses (JSON), nnsight's remote objects",
    "workbench.backends.remote_faults:with_retries": "whatever the retried call returns",
    "workbench.records:Record.replace": "field values of any Record subclass",
    "workbench.signals:*": "signal handlers as `signal` gives them",
    "workbench.labels:*": "tokenizers of every family (their processors share no type)",
    "workbench.data:*": "dataset rows as `datasets` yields them",
    "workbench.worklist:*": "store condition groups and dataset rows",
    "workbench.checks:nonfinite_report": "a run's variables: arrays of any dtype, or scalars",
    "workbench.accessor:WorkbenchAccessor.sel": "selection values as xarray's own `sel` takes them",
    "workbench.api:run": "keyword settings passed through to the spec's sections",
    "workbench.runner:run_spec": "keyword settings passed through to the executor",
    "analyses.cache:*": "JSON values of a cached table's inputs record",
    "analyses.tables:Options.*": "JSON values of the analysis options stored with a table",
    "analyses.synthetic:scan_runs": "sweep words of a synthetic scan's runs (JSON values)",
    "analyses.training:training_point": "a store's `training` attrs (JSON values)",
    "workbench.attribution:*": "the images' model inputs and the metric's raw outputs, as the forward takes them",
    "workbench.families:*": "JSON values of the listing (`--json`)",
    "workbench.models.architectures.tiny_*:load_processor": "each family's processor (they share no type)",
    "workbench.models.geometry:*": "each family's image processor and its raw outputs (they share no type)",
    "workbench.models.infer:*": "transformers models and configs of any type, built on the meta device",
    "workbench.models.model:InputEncoder.*": "the families' processors and their raw outputs (no common type)",
    "workbench.models.model:*": "transformers sub-configs of any model type (their attributes differ per family)",
    "workbench.models.training:*": "transformers models, tokenizers and processors of the two trained families",
    "workbench.plan:site_layers": "a model's info or a server-side model's, read for two attributes",
}


def _mentions_any(node: ast.expr | None) -> bool:
    """Whether an annotation names `Any` (quoted parts parsed as annotations too)."""
    for part in ast.walk(node) if node is not None else ():
        if isinstance(part, ast.Constant) and isinstance(part.value, str):
            if _mentions_any(ast.parse(part.value, mode="eval").body):
                return True
        elif (isinstance(part, ast.Name) and part.id == "Any") or (isinstance(part, ast.Attribute) and part.attr == "Any"):
            return True
    return False


def _signature_annotations(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr | None]:
    args = fn.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    return [a.annotation for a in every if a is not None] + [fn.returns]


def public_functions_with_any() -> set[str]:
    """'module:qualname' of every public function and method (of a public class) naming Any."""
    found = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if any(part.startswith("_") and part != "__init__" for part in module.split(".")):
                continue
            tree = ast.parse(path.read_text())
            scopes: list[tuple[str, list[ast.stmt]]] = [("", tree.body)]
            scopes += [(node.name + ".", node.body) for node in tree.body
                       if isinstance(node, ast.ClassDef) and not node.name.startswith("_")]
            for prefix, body in scopes:
                for node in body:
                    if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")
                            and any(_mentions_any(a) for a in _signature_annotations(node))):
                        found.add(f"{module}:{prefix}{node.name}")
    return found


def _allowed(name: str) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in ANY_ALLOWED)


def test_any_in_public_signatures_only_where_listed():
    new = sorted(name for name in public_functions_with_any() if not _allowed(name))
    assert not new, ("public signatures naming Any: type them with the project's or the libraries' types, "
                     "or list them in ANY_ALLOWED with why:\n  " + "\n  ".join(new))


def test_the_allowlist_names_only_what_still_needs_it():
    found = public_functions_with_any()
    stale = sorted(p for p in ANY_ALLOWED if not any(fnmatchcase(name, p) for name in found))
    assert not stale, f"listed in ANY_ALLOWED but typed now (drop them): {stale}"
    assert all(reason.strip() for reason in ANY_ALLOWED.values())


def test_mypy_skips_no_module():
    """Every module of workbench/ and analyses/ has its mypy errors reported: none is exempted
    ([tool.mypy.overrides] with ignore_errors), and every function body is checked."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    skipped = [m for o in config.get("overrides", []) if o.get("ignore_errors") for m in o["module"]]
    assert not skipped, f"mypy ignores the errors of {skipped}: make them pass instead"
    assert config["files"] == ["workbench", "analyses"] and config.get("check_untyped_defs")
