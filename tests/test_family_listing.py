"""`workbench families`: one entry per registered family, as text and as JSON; the docs' family table
is built from the same entries and says the same; what it refuses agrees with the families' records."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import transformers

from workbench import sites
from workbench.cli import main
from workbench.extend import intervention_kinds
from workbench.models.architectures import ARCHITECTURES

REPO = Path(__file__).resolve().parents[1]
FAMILIES = list(dict.fromkeys(a.family for a in ARCHITECTURES))


@pytest.fixture(scope="module")
def listed() -> list[dict]:
    """`workbench families --json`, parsed (run once for the module)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["families", "--json"]) == 0
    return json.loads(out.getvalue())


def test_the_json_has_one_object_per_registered_family(listed):
    assert [e["family"] for e in listed] == FAMILIES
    for entry in listed:
        assert {"family", "model_types", "tiny", "text_only", "hub_id", "sites", "sites_refused", "interventions",
                "interventions_refused"} <= set(entry)


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.family)
def test_each_entry_is_its_familys_record(listed, arch):
    entry = next(e for e in listed if e["family"] == arch.family)
    config_class = getattr(transformers, arch.model_class).config_class
    assert config_class.model_type in entry["model_types"]
    assert set(arch.config_architectures) <= set(entry["model_classes"])
    assert entry["tiny"] == arch.tiny and entry["text_only"] == (arch.vision is None)
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry["hub_id"] or ""), f"{arch.family}: no example hub id (hub_id)"
    # every registered site and the family's connector parts: each either applies or is refused with a reason
    parts = {sites.PROJECTOR_PART_PREFIX + p for p in arch.projector_parts}
    assert set(entry["sites"]) | set(entry["sites_refused"]) == set(sites.SITES) | parts
    assert not set(entry["sites"]) & set(entry["sites_refused"]) and all(entry["sites_refused"].values())
    kinds = set(intervention_kinds()) | {"kv_swap", "image: blank", "image: none"}
    assert set(entry["interventions"]) | set(entry["interventions_refused"]) == kinds
    # against the record: a text model has no vision site and takes no image; DeepStack's site is
    # Qwen3-VL's; a prefix-LM refuses kv_swap
    vision_sites = {n for n, s in sites.SITES.items() if s.vision} | parts
    assert (vision_sites <= set(entry["sites_refused"])) == (arch.vision is None)
    assert ("image: blank" in entry["interventions_refused"]) == (arch.vision is None)
    assert ("layer.pre_deepstack" in entry["sites"]) == arch.deepstack
    if arch.prefix_lm:
        assert "kv_swap" in entry["interventions_refused"]
    assert ("kv_swap" in entry["interventions_refused"]) == kv_swap_refused(arch)
    assert parts <= set(entry["interventions"]["scale"]) | set(entry["sites_refused"])


def kv_swap_refused(arch) -> bool:
    """Whether `compile_plan` refuses a spec with a kv_swap for the family (its config's defaults)."""
    from workbench.models.model import info_from_config
    from workbench.plan import PlanError, compile_plan
    from workbench.spec import parse_spec

    info = info_from_config("org/model", "", getattr(transformers, arch.model_class).config_class(), arch)
    spec = parse_spec("name: swap\nmodels: [org/model]\ndata: {source: builtin, n: 1}\nstore: {path: s.zarr}\n"
                      "conditions:\n  base: {}\n  swap: {kv_swap: {donor: base}}\ncapture: [{site: logits}]\n")
    try:
        compile_plan(spec, info)
    except PlanError:
        return True
    return False


def test_the_text_listing_names_each_family_its_tiny_model_and_hub_id(listed, capsys):
    assert main(["families"]) == 0
    out = capsys.readouterr().out
    for entry in listed:
        assert f"{entry['family']}  (model type {', '.join(entry['model_types'])};" in out
        assert f"tiny model: {entry['tiny'] or 'none'}    example: {entry['hub_id']}" in out
        for site, why in entry["sites_refused"].items():
            assert f"    not {site}: {why}" in out


def test_the_docs_table_is_the_listing(listed):
    """docs/hooks/reference.py builds docs/families.md's table from the same entries: row for row,
    the same family, model types, tiny model, hub id, and the same refusals."""
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "docs" / "hooks" / "reference.py")
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    table = reference.family_listing()
    rows = [re.split(r"(?<!\\) \| ", line.strip("| ")) for line in table.splitlines()[2:]]
    assert len(rows) == len(listed)
    for row, entry in zip(rows, listed):
        family, types, tiny, hub, text_only, site_cell, intervention_cell = row
        assert family == f"`{entry['family']}`"
        assert types == ", ".join(f"`{t}`" for t in entry["model_types"])
        assert tiny == f"`{entry['tiny']}`" and hub == f"`{entry['hub_id']}`"
        assert (text_only == "yes") == entry["text_only"]
        assert set(re.findall(r"`([^`]+)` \(", site_cell)) == set(entry["sites_refused"])
        assert set(re.findall(r"`([^`]+)` \(", intervention_cell)) == set(entry["interventions_refused"])
