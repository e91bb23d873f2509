"""Edits of a YAML text by its nodes' spans (pure): every byte outside the edited values stays.

A round trip through a YAML library (ruamel.yaml too) re-emits the whole document with one
indentation for every sequence; published Kubernetes manifests mix two in one file (the SGLang
LeaderWorkerSet example indents its leader's `env:` items and not its worker's), so the bytes
around the edit would change. Here the text is composed once with PyYAML's pure loader (its marks
are character offsets), and each edit is a splice: a block sequence item is removed or added as
its own lines at the indentation of its neighbours (comments on kept lines stay), a flow sequence
is replaced whole, a missing key is added as new lines under its mapping. The caller parses the
result back and checks it against the intended data (k8s_lws.patch).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Sequence

import yaml

from fleetspec.errors import UserError

_PLAIN = re.compile(r"^[A-Za-z0-9_./@%+-][A-Za-z0-9_./:@%+=,-]*$")


class EditRefused(UserError):
    """A value fleetspec cannot edit exactly in place (its layout, not its meaning)."""


def compose_all(text: str) -> list[yaml.Node]:
    """The documents' nodes, composed by the pure loader (libyaml's marks are not character offsets)."""
    return [n for n in yaml.compose_all(text, Loader=yaml.SafeLoader) if n is not None]


def scalar(word: Any) -> str:
    """One value as YAML: plain where it reads back as the same string, else JSON (a YAML
    double-quoted scalar)."""
    if isinstance(word, str) and _PLAIN.match(word) and yaml.safe_load(word) == word:
        return word
    return json.dumps(word)


def flow(value: Any) -> str:
    """A list or mapping as one flow-style line (JSON is YAML)."""
    return json.dumps(value)


def get(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return v
    return None


def key_node(node: yaml.MappingNode, key: str) -> yaml.Node | None:
    return next((k for k, _ in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)


def content_end(node: yaml.Node) -> int:
    """Where a node's own text ends (a block collection's end mark lies at the next token)."""
    if isinstance(node, yaml.MappingNode) and not node.flow_style and node.value:
        return content_end(node.value[-1][1])
    if isinstance(node, yaml.SequenceNode) and not node.flow_style and node.value:
        return content_end(node.value[-1])
    return node.end_mark.index


@dataclass(frozen=True)
class Splice:
    start: int
    end: int
    text: str
    rank: int = 0            # at one place: items added to a list (0) before a new key after it (1)


class Editor:
    """Splices over one text; `result()` applies them (they must not overlap)."""

    def __init__(self, text: str, where: str):
        self.text, self.where = text, where
        self.splices: list[Splice] = []

    def _line_start(self, i: int) -> int:
        return self.text.rfind("\n", 0, i) + 1

    def _line_end(self, i: int) -> int:
        j = self.text.find("\n", i)
        return len(self.text) if j < 0 else j + 1

    def _dash(self, item: yaml.Node) -> int:
        """The column of a block sequence item's `-`, which must start its line."""
        i = item.start_mark.index - 1
        while i >= 0 and self.text[i] == " ":
            i -= 1
        start = self._line_start(i)
        if i < 0 or self.text[i] != "-" or self.text[start:i].strip():
            raise EditRefused(f"{self.where}: line {item.start_mark.line + 1}: a list item that does not start its "
                              f"own line; write each item as `- value` on a line of its own")
        return i - start

    def _item_span(self, seq: yaml.SequenceNode, k: int) -> tuple[int, int]:
        item = seq.value[k]
        self._dash(item)
        start = self._line_start(item.start_mark.index)
        end = (self._line_start(seq.value[k + 1].start_mark.index) if k + 1 < len(seq.value)
               else self._line_end(content_end(item)))
        return start, end

    def replace_sequence(self, seq: yaml.Node, old: Sequence[Any], new: Sequence[Any]) -> None:
        """`seq` (whose items read as `old`) made to read as `new`: in a block list, only the items
        that differ are removed or added (difflib's opcodes); a flow list is replaced whole."""
        if not isinstance(seq, yaml.SequenceNode) or seq.flow_style or not seq.value:
            self.splices.append(Splice(seq.start_mark.index, seq.end_mark.index, flow(list(new))))
            return
        indent = " " * self._dash(seq.value[0])
        spans = [self._item_span(seq, k) for k in range(len(seq.value))]
        for op, i1, i2, j1, j2 in SequenceMatcher(a=list(old), b=list(new), autojunk=False).get_opcodes():
            if op == "equal":
                continue
            added = "".join(f"{indent}- {scalar(w)}\n" for w in new[j1:j2])
            if i1 < i2:
                self.splices.append(Splice(spans[i1][0], spans[i2 - 1][1], added))
            else:
                at = spans[i1][0] if i1 < len(spans) else spans[-1][1]
                self.splices.append(Splice(at, at, added))

    def remove_items(self, seq: yaml.SequenceNode, indexes: Sequence[int]) -> None:
        """Remove block list items (a flow list is refused: its caller rewrites it whole)."""
        for k in indexes:
            start, end = self._item_span(seq, k)
            self.splices.append(Splice(start, end, ""))

    def append_items(self, seq: yaml.Node, items: Sequence[Any], old: Sequence[Any] = ()) -> None:
        """Add items at the end of a list: one flow line each in a block list; a flow list (or an
        empty one) is replaced by a flow list of `old` + `items`."""
        if not isinstance(seq, yaml.SequenceNode) or seq.flow_style or not seq.value:
            self.splices.append(Splice(seq.start_mark.index, seq.end_mark.index, flow([*old, *items])))
            return
        indent = " " * self._dash(seq.value[0])
        at = self._line_end(content_end(seq.value[-1]))
        self.splices.append(Splice(at, at, "".join(f"{indent}- {flow(i)}\n" for i in items)))

    def add_key(self, mapping: yaml.MappingNode, key: str, items: Sequence[Any]) -> None:
        """A new `key:` holding a block list of `items` (one flow line each), after the mapping's last
        line, at its keys' column."""
        if mapping.flow_style or not mapping.value:
            raise EditRefused(f"{self.where}: line {mapping.start_mark.line + 1}: a flow-style mapping; write it "
                              f"as a block mapping (one key a line)")
        column = mapping.value[0][0].start_mark.column
        pad = " " * column
        at = self._line_end(content_end(mapping))
        if at == len(self.text) and not self.text.endswith("\n"):
            pad = "\n" + pad
        lines = f"{pad}{key}:\n" + "".join(f"{' ' * column}- {flow(i)}\n" for i in items)
        self.splices.append(Splice(at, at, lines, 1))

    def result(self) -> str:
        out, last = [], 0
        for s in sorted(self.splices, key=lambda s: (s.start, s.end, s.rank)):
            if s.start < last:
                raise EditRefused(f"{self.where}: edits overlap at character {s.start}; the manifest's layout is "
                                  f"not one fleetspec can edit in place")
            out.append(self.text[last:s.start])
            out.append(s.text)
            last = s.end
        out.append(self.text[last:])
        return "".join(out)
