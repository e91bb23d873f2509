"""Strict YAML loading and typed field access that turn every mistake into one ConfigError line.

PyYAML silently keeps the last of two equal mapping keys; a duplicated host would then vanish
without a word, so the loader here refuses duplicates. The `Fields` helper reads a mapping key by
key, checks each value's type, and at the end refuses keys nobody asked for, always naming the
file and the dotted key path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import yaml

from fleetspec.errors import ConfigError


class PureStrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML would keep the last one)."""


class StrictLoader(getattr(yaml, "CSafeLoader", PureStrictLoader)):  # type: ignore[misc]
    """PureStrictLoader on libyaml's parser where PyYAML has it (its wheels do): the same documents
    and marks for an eighth of the CPU. Its problems say less ("found character that cannot start
    any token", where PyYAML names the tab), so `load` asks the pure loader for the error."""


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "mapping key is not a scalar", key_node.start_mark) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})",
                key_node.start_mark)
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


for _loader in (PureStrictLoader, StrictLoader):
    _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load(text: str, fast: type = StrictLoader, pure: type = PureStrictLoader) -> Any:
    """yaml.load with `fast`; a document it refuses is parsed again with `pure`, whose error (same
    mark, a clearer problem) is raised. Both must be SafeLoaders with the same constructors."""
    try:
        return yaml.load(text, Loader=fast)  # a SafeLoader
    except yaml.YAMLError:
        if fast is pure:
            raise
        try:
            yaml.load(text, Loader=pure)  # a SafeLoader
        except yaml.YAMLError as clearer:
            raise clearer from None
        raise


def load_yaml_text(text: str, path: str | Path) -> Any:
    try:
        return load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = err.problem or err.context or "invalid YAML"
        raise ConfigError(path, where, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise ConfigError(path, None, f"invalid YAML: {err}") from None


def load_yaml_file(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(path, None, f"cannot read: {err}") from None
    return load_yaml_text(text, path)


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               dict: "a mapping", list: "a list"}
Kind = type[Any] | tuple[type[Any], ...]


def type_name(kind: Kind) -> str:
    if isinstance(kind, tuple):
        return " or ".join(type_name(k) for k in kind)
    return _TYPE_NAMES.get(kind, kind.__name__)


def is_type(value: Any, kind: Kind) -> bool:
    """isinstance that keeps bool out of int/float and lets an int stand for a float."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    for k in kinds:
        if k in (int, float) and isinstance(value, bool):
            continue
        if k is float and isinstance(value, int):
            return True
        if isinstance(value, k):
            return True
    return False


def describe(value: Any) -> str:
    if value is None:
        return "nothing"
    text = repr(value)
    return f"{type(value).__name__} {text[:40] + '…' if len(text) > 40 else text}"


class Fields:
    """Typed reads from one mapping of a config file; `done()` refuses the keys nobody read."""

    def __init__(self, data: Any, path: str | Path, key_path: str = ""):
        self.path, self.key_path = path, key_path
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(path, key_path or None, f"expected a mapping, got {describe(data)}")
        self.data = data
        self._read: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.key_path}.{name}" if self.key_path else str(name)

    def fail(self, name: str | None, expected: str) -> NoReturn:
        raise ConfigError(self.path, self.key(name) if name is not None else (self.key_path or None), expected)

    def get(self, name: str, kind: Kind, default: Any = ..., *, required: bool = False) -> Any:
        self._read.add(name)
        if self.data.get(name) is None:
            if required or default is ...:
                self.fail(name, f"missing; expected {type_name(kind)}")
            return default
        value = self.data[name]
        if not is_type(value, kind):
            self.fail(name, f"expected {type_name(kind)}, got {describe(value)}")
        if kind is float and isinstance(value, int):
            value = float(value)
        return value

    def sub(self, name: str, required: bool = False) -> "Fields":
        self._read.add(name)
        if name not in self.data and required:
            self.fail(name, "missing; expected a mapping")
        return Fields(self.data.get(name), self.path, self.key(name))

    def optional_sub(self, name: str) -> "Fields | None":
        """The mapping at `name`, or None where the key is absent or null (an optional section)."""
        self._read.add(name)
        return None if self.data.get(name) is None else Fields(self.data[name], self.path, self.key(name))

    def str_list(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = self.get(name, list, None)
        if value is None:
            return tuple(default)
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.fail(f"{name}[{i}]", f"expected a string, got {describe(item)}")
        return tuple(value)

    def choice(self, name: str, choices: tuple[str, ...], default: Any = ...) -> str:
        value: str = self.get(name, str, default)
        if value not in choices and not (value is default and default is not ...):
            self.fail(name, f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def done(self) -> None:
        unknown = [k for k in self.data if k not in self._read]
        if unknown:
            known = ", ".join(str(k) for k in self._read) or "none"
            self.fail(str(unknown[0]), f"unknown key (known here: {known})")


def compose(text: str) -> Any:
    """The document's node tree: where each value is written (start_mark/end_mark), for edits
    that must keep every other byte (model.container_compose)."""
    return yaml.compose(text, Loader=PureStrictLoader)
