"""YAML with line numbers: a spec's text, composed by PyYAML's *safe* composer, built into plain
data with the line each path came from (mapping entries at their key's line, list items at the
item's line). Tags other than plain YAML values, duplicate keys, recursive aliases and documents
that expand past a bound are problems, located like every other."""

from __future__ import annotations

from typing import Any

import yaml

from .problems import Problem, SpecPath

# Guards against alias bombs ("billion laughs") and runaway documents.
_MAX_YAML_VALUES = 200_000


class _SpecLoader(yaml.SafeLoader):
    """Safe composer only: we never let PyYAML construct tagged objects."""


# Scalars we accept; everything else (!!python/..., !custom, !!set, ...) is refused.
_SCALAR_TAGS = {
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:timestamp",  # kept as its text: a spec has no date fields
}
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _short_tag(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


class _YamlBuilder:
    """Builds plain data from a composed node tree, recording each path's line (1-based).

    Mapping entries are located at their key's line; list items at the item's line.
    """

    def __init__(self) -> None:
        self.lines: dict[SpecPath, int] = {}
        self.problems: list[Problem] = []
        self._scalars = yaml.constructor.SafeConstructor()
        self._active: set[int] = set()  # node ids on the current path, to stop alias cycles
        self._count = 0

    def build(self, node: yaml.Node, path: SpecPath) -> Any:
        self._count += 1
        if self._count > _MAX_YAML_VALUES:
            raise _TooLarge()
        if id(node) in self._active:
            self._problem(path, node, "recursive alias; expected a finite document")
            return None
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode) and node.tag == _MAP_TAG:
                return self._mapping(node, path)
            if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ_TAG:
                return [self._item(item, path + (i,)) for i, item in enumerate(node.value)]
            if isinstance(node, yaml.ScalarNode) and node.tag in _SCALAR_TAGS:
                return self._scalar(node, path)
            self._problem(
                path,
                node,
                f"unsupported YAML tag '{_short_tag(node.tag)}'; expected plain YAML values "
                "(mappings, lists, strings, numbers, booleans, null)",
            )
            return None
        finally:
            self._active.discard(id(node))

    def _item(self, node: yaml.Node, path: SpecPath) -> Any:
        self.lines.setdefault(path, _line(node))
        return self.build(node, path)

    def _mapping(self, node: yaml.MappingNode, path: SpecPath) -> dict:
        result: dict = {}
        explicit: dict[Any, int] = {}
        merged: list[yaml.Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged.append(value_node)
                continue
            key = self._key(key_node, path)
            if key is _INVALID:
                continue
            if key in explicit:
                self._problem(
                    path + (key,),
                    key_node,
                    f"duplicate key '{key}' (first on line {explicit[key]}); expected each key once",
                )
                continue
            explicit[key] = _line(key_node)
            self.lines[path + (key,)] = _line(key_node)
            result[key] = self.build(value_node, path + (key,))
        # YAML merge keys ("<<: *defaults") fill in only keys the mapping did not set.
        for source in merged:
            for key_node, value_node in self._merge_pairs(source, path):
                key = self._key(key_node, path)
                if key is _INVALID or key in result:
                    continue
                self.lines[path + (key,)] = _line(key_node)
                result[key] = self.build(value_node, path + (key,))
        return result

    def _merge_pairs(self, node: yaml.Node, path: SpecPath) -> list[tuple[yaml.Node, yaml.Node]]:
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        pairs = []
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                self._problem(path, source, "bad merge key '<<'; expected a mapping or list of mappings")
                continue
            pairs.extend(source.value)
        return pairs

    def _key(self, node: yaml.Node, path: SpecPath) -> Any:
        if not (isinstance(node, yaml.ScalarNode) and node.tag in _SCALAR_TAGS):
            self._problem(path, node, "complex mapping key; expected a plain name")
            return _INVALID
        return self._scalar(node, path)

    def _scalar(self, node: yaml.ScalarNode, path: SpecPath) -> Any:
        if node.tag == "tag:yaml.org,2002:timestamp":
            return node.value
        try:
            return self._scalars.construct_object(node, deep=True)
        except (ValueError, yaml.YAMLError) as exc:
            self._problem(path, node, f"unreadable value {node.value!r} ({exc}); expected a plain value")
            return None

    def _problem(self, path: SpecPath, node: yaml.Node, message: str) -> None:
        self.problems.append(Problem(path, _line(node), message))


class _TooLarge(Exception):
    pass


_INVALID = object()


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _read_yaml(text: str) -> tuple[Any, dict[SpecPath, int], list[Problem]]:
    """Parse YAML safely; return (data, line of each path, structural problems)."""
    try:
        root = yaml.compose(text, Loader=_SpecLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        return None, {}, [Problem((), line, f"invalid YAML: {what}; expected valid YAML syntax")]
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (NUL, other control characters)
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        what = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        return None, {}, [Problem((), line, f"unacceptable character {what} at column {column} (a control "
                                            "character); expected printable text")]
    except yaml.YAMLError as exc:
        return None, {}, [Problem((), None, f"invalid YAML: {exc}; expected valid YAML syntax")]
    if root is None:
        return None, {}, []
    builder = _YamlBuilder()
    builder.lines[()] = _line(root)
    try:
        data = builder.build(root, ())
    except _TooLarge:
        message = f"document expands to more than {_MAX_YAML_VALUES} values; expected a small spec"
        return None, {}, [Problem((), _line(root), message)]
    return data, builder.lines, builder.problems


def _line_of(path: SpecPath, lines: dict[SpecPath, int]) -> int | None:
    """Line of the deepest node along path that exists (a missing key: its parent's); a swept
    run (`sweeps.RunKey`) is found at its condition."""
    path = tuple(getattr(part, "base", part) for part in path)
    for end in range(len(path), -1, -1):
        line = lines.get(path[:end])
        if line is not None:
            return line
    return None
