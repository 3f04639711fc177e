"""Reading a YAML file the user wrote: duplicate keys refused, errors with file:line:column.

Model: PyYAML's safe loader, except that a mapping which repeats a key (at any depth)
is an error instead of silently keeping the last value; merge keys (`<<: *base`)
still let an explicit key override a merged one. Every problem is one
`ExperimentError` line, `experiments/x.yaml:9:3: duplicate key 'lr' (first at line 5); ...`,
which editors and terminals turn into a link to the spot.
"""

from __future__ import annotations

from typing import Any

import yaml

from marin_rules.artifacts.errors import ExperimentError

MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
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


def load_yaml_text(text: str, path: str) -> Any:
    """Parse `text` (read from `path`, named in errors)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
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
    if isinstance(e, yaml.constructor.ConstructorError) and str(e.problem).startswith("duplicate key"):
        return f"{where}: {e.problem}"
    problem = " ".join(str(e.problem or "").split())
    context = " ".join(str(e.context or "").split())
    if context and e.context_mark is not None and e.context_mark is not mark:
        context = f" ({context} at line {e.context_mark.line + 1})"
    elif context:
        context = f" ({context})"
    return f"{where}: not valid YAML: {problem}{context}"
