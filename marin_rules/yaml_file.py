"""Reading a YAML file the user wrote: duplicate keys refused, errors with file:line:column.

Model: PyYAML's safe loader, except that a mapping which repeats a key (at any depth)
is an error instead of silently keeping the last value; merge keys (`<<: *base`,
`<<: [*a, *b]`) let an explicit key override a merged one and an earlier merged
mapping a later one (the YAML spec's order, `flatten_mapping`), and a value that holds itself
through an alias (`a: &x [*x]`, a mapping merging or holding its own anchor) is an
error naming its key (`_refuse_recursion`: every reader of it would recurse without end),
as is a value nested more than MAX_DEPTH levels deep or one that its aliases expand to
more than MAX_EXPANDED_VALUES values (anchors of anchors, "billion laughs": every
reader would walk each copy; a file of a few lines would stall the loader for hours).
Every problem is one `ExperimentError` line, `experiments/x.yaml:9:3: duplicate key
'lr' (first at line 5); ...`, which editors and terminals turn into a link to the spot.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from marin_rules.artifacts.errors import ExperimentError

MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_DEPTH = 100  # levels of nesting a value may have (experiments use fewer than 10)
MAX_EXPANDED_VALUES = 1_000_000  # values a document may hold with every alias expanded


class _Recursive(yaml.constructor.ConstructorError):
    """A value that holds itself through an alias: its `problem` is the whole line's text."""


def _label(key_node: yaml.Node) -> str:
    return key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"


def _refuse_recursion(root: yaml.Node, alias_marks: dict[tuple[int, Any], yaml.Mark]) -> None:
    """Raise `_Recursive` at the first alias that leads back to a value it lies in, naming
    that value's key path (`artifacts.raw/a@v1.config.extra[0]`) and the alias's place
    (`alias_marks`: (id of the parent node, item index or id of the key node) -> where
    the alias was written, as `compose_node` saw it). Iterative, and each node is walked
    once however many aliases share it."""
    size: dict[int, int] = {}  # walked nodes -> values they hold with aliases expanded
    on_path: dict[int, str] = {}  # the nodes being walked -> their key path
    stack: list[tuple[yaml.Node, str, Any]] = [(root, "", None)]
    while stack:
        node, path, children = stack[-1]
        if children is None:  # first visit: (path, where it is written, child) of each child
            if len(stack) > MAX_DEPTH:
                shown = path if len(path) <= 80 else f"{path[:77]}..."
                raise _Recursive(None, None, f"{shown}: nested more than {MAX_DEPTH} levels deep; flatten it",
                                 node.start_mark)  # fmt: skip
            on_path[id(node)] = path
            if isinstance(node, yaml.MappingNode):
                pairs = [(f"{path}.{_label(k)}".lstrip("."), alias_marks.get((id(node), id(k)), k.start_mark), v)
                         for k, v in node.value]  # fmt: skip
                pairs += [(f"{path}.{_label(k)}(key)".lstrip("."), k.start_mark, k) for k, _ in node.value]
            elif isinstance(node, yaml.SequenceNode):
                pairs = [(f"{path}[{i}]", alias_marks.get((id(node), i), node.start_mark), item)
                         for i, item in enumerate(node.value)]  # fmt: skip
            else:
                pairs = []
            children = iter(pairs)
            stack[-1] = (node, path, children)
        step = next(children, None)
        if step is None:
            stack.pop()
            del on_path[id(node)]
            size[id(node)] = 1 + sum(size[id(c)] for c in _children(node))
            if size[id(node)] > MAX_EXPANDED_VALUES:
                raise _Recursive(
                    None, None,
                    f"{path or 'the document'}: its aliases expand it to more than {MAX_EXPANDED_VALUES:,} values "
                    "(each alias is a whole copy for every reader); write a smaller value",
                    node.start_mark,
                )  # fmt: skip
            continue
        child_path, mark, child = step
        if id(child) in on_path:
            anchor = on_path[id(child)] or "the document"
            raise _Recursive(
                None, None,
                f"{child_path}: an alias of {anchor}, inside it: a value that holds itself has no end; "
                "write it out, or alias a value defined elsewhere",
                mark,
            )  # fmt: skip
        if id(child) not in size:
            stack.append((child, child_path, None))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _merge_key(node: yaml.Node) -> Any:
    """What tells two keys of merged mappings apart: a scalar's tag and text, another node itself."""
    return (node.tag, node.value) if isinstance(node, yaml.ScalarNode) else id(node)


class _UniqueKeyLoader(yaml.SafeLoader):
    def __init__(self, stream: Any):
        super().__init__(stream)
        self.alias_marks: dict[tuple[int, Any], yaml.Mark] = {}  # see _refuse_recursion

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):  # an alias's node is its anchor's: keep where the alias is
            where = id(index) if isinstance(index, yaml.Node) else index
            self.alias_marks[(id(parent), where)] = self.peek_event().start_mark
        return super().compose_node(parent, index)

    def construct_document(self, node: yaml.Node) -> Any:
        _refuse_recursion(node, self.alias_marks)
        return super().construct_document(node)

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Merge keys (`<<: *a`, `<<: [*a, *b]`) in the YAML spec's order: a key written
        in the mapping wins, then the earliest mapping of a merge list that has it.
        PyYAML 6.0.3-6.0.4 tell merged keys apart by the identity of their Python
        strings, so a key Python does not intern (`d_model`, unlike `x`) took the last
        mapping's value."""
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        seen: set[Any] = set()
        index = 0
        while index < len(node.value):
            key_node, value_node = node.value[index]
            if key_node.tag != MERGE_TAG:
                if key_node.tag == "tag:yaml.org,2002:value":  # `=` as a key: a string, as PyYAML reads it
                    key_node.tag = "tag:yaml.org,2002:str"
                index += 1
                continue
            del node.value[index]
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in sources:
                if not isinstance(source, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"expected a mapping or list of mappings for merging, but found {source.id}", source.start_mark,
                    )  # fmt: skip
                self.flatten_mapping(source)  # its merged pairs first, then its own, which win there
                effective = {_merge_key(k): (k, v) for k, v in source.value}
                for key, pair in effective.items():
                    if key not in seen:
                        seen.add(key)
                        merged.append(pair)
        if merged:
            node.value = merged + node.value

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = key in first_line
            except TypeError:  # an unhashable key: the base constructor reports it
                break
            if seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key {key!r} (first at line {first_line[key]}); YAML would keep only the "
                    "last one: rename or remove one of them",
                    key_node.start_mark,
                )  # fmt: skip
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _UniqueKeyLoader.construct_mapping)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """An integer, or a ConstructorError at its place for one of more digits than Python
    converts (`sys.get_int_max_str_digits`), which PyYAML lets escape as a ValueError."""
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {len(node.value)} characters, more than Python reads "
            f"({sys.get_int_max_str_digits()} digits); no setting needs one", node.start_mark,
        ) from None  # fmt: skip


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load_yaml_text(text: str, path: str) -> Any:
    """Parse `text` (read from `path`, named in errors)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:  # PyYAML composes nested values recursively, before `_refuse_recursion` sees them
        raise ExperimentError(f"{path}: values nested too deeply to read (more than {MAX_DEPTH} levels "
                              "are refused); flatten them") from None  # fmt: skip
    except yaml.MarkedYAMLError as e:
        raise ExperimentError(_marked(path, e)) from None
    except yaml.YAMLError as e:
        raise ExperimentError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None


def load_yaml_file(path: str, what: str = "experiment file") -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ExperimentError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise ExperimentError(f"{path}: is a folder; give the {what} (a .yaml file)") from None
    except UnicodeDecodeError as e:
        raise ExperimentError(f"{path}: not UTF-8 text (byte {e.start}); save the {what} as UTF-8") from None
    return load_yaml_text(text, path)


def _marked(path: str, e: yaml.MarkedYAMLError) -> str:
    mark = e.problem_mark or e.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
    if isinstance(e, _Recursive) or (
        isinstance(e, yaml.constructor.ConstructorError) and str(e.problem).startswith("duplicate key")
    ):
        return f"{where}: {e.problem}"
    problem = " ".join(str(e.problem or "").split())
    context = " ".join(str(e.context or "").split())
    if context and e.context_mark is not None and e.context_mark is not mark:
        context = f" ({context} at line {e.context_mark.line + 1})"
    elif context:
        context = f" ({context})"
    return f"{where}: not valid YAML: {problem}{context}"
