"""The model Protocol (workbench/models/protocol.py): the local, remote and server models all
offer every member of `ModelLike` with the same kind (a method where the Protocol has a method,
a value where it has a property), the client-side two also `ClientModel`; and the Protocol
module imports only `typing` at run time, since the backend code that names it travels to NDIF."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import workbench
from workbench.backends.ndif_job import ServerModel
from workbench.models.model import WorkbenchModel, model_info
from workbench.models.protocol import ClientModel, ModelLike
from workbench.models.remote import RemoteModel


def members(protocol: type) -> dict[str, str]:
    """Each member the Protocol declares (its own and inherited), as 'method' or 'value'."""
    found = {}
    for klass in reversed(protocol.__mro__):
        if klass is object or klass.__module__ == "typing":
            continue
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property):
                found[name] = "value"
            elif inspect.isfunction(value):
                found[name] = "method"
        for name in getattr(klass, "__annotations__", {}):
            found.setdefault(name, "value")
    return found


def kind_on(cls: type, instance: object, name: str) -> str | None:
    """'method', 'value' or None (missing) for `name` on a class, falling back to an instance
    attribute set in `__init__` (ServerModel.lm)."""
    if name in dir(cls):
        attr = inspect.getattr_static(cls, name)
        if isinstance(attr, property):
            return "value"
        return "method" if inspect.isfunction(attr) else "value"
    return "value" if instance is not None and name in vars(instance) else None


def test_protocol_members_are_what_the_backends_read():
    assert members(ModelLike) == {
        "lm": "value", "info": "value", "arch": "value", "device": "value", "dtype": "value",
        "model_id": "value", "n_layers": "value",
        "module": "method", "decoder_layers": "method", "text_embedding_norm": "method", "prepare": "method",
    }
    assert set(members(ClientModel)) - set(members(ModelLike)) == {"tokenizer", "describe", "encode", "token_modality"}


@pytest.fixture(scope="module")
def models(load_tiny):
    """One instance of each class (RemoteModel and ServerModel need no weights)."""
    local = load_tiny("tiny-llama")
    remote = RemoteModel(model_info("tiny-llama"))
    server = ServerModel(local.lm, local.info)
    return {WorkbenchModel: local, RemoteModel: remote, ServerModel: server}


@pytest.mark.parametrize("cls, protocol", [(WorkbenchModel, ModelLike), (RemoteModel, ModelLike), (ServerModel, ModelLike),
                                           (WorkbenchModel, ClientModel), (RemoteModel, ClientModel)],
                         ids=lambda c: c.__name__)
def test_each_model_class_satisfies_the_protocol(cls, protocol, models):
    instance = models[cls]
    wrong = {name: kind_on(cls, instance, name) for name, kind in members(protocol).items()
             if kind_on(cls, instance, name) != kind}
    assert not wrong, f"{cls.__name__}: members missing (None) or of another kind: {wrong}"
    assert isinstance(instance, protocol)


def test_methods_take_the_protocols_parameters():
    """Same parameter names as the Protocol's methods (a caller passing them by name works on all)."""
    for cls in (WorkbenchModel, RemoteModel, ServerModel):
        protocol = ClientModel if cls is not ServerModel else ModelLike
        for name, kind in members(protocol).items():
            if kind == "method":
                want = list(inspect.signature(getattr(protocol, name)).parameters)
                assert list(inspect.signature(getattr(cls, name)).parameters) == want, (cls.__name__, name)


def test_protocol_module_imports_only_typing_at_run_time():
    tree = ast.parse((Path(workbench.__file__).parent / "models" / "protocol.py").read_text())
    for node in tree.body:  # module level; the `if TYPE_CHECKING:` block never runs
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        else:
            continue
        assert all(name in ("typing", "__future__") for name in names), names
