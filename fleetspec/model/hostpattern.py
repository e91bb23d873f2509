"""Host patterns as Ansible writes them (pure): which of an inventory's hosts a command's targets name.

A target is one or more terms joined by `:` or `,` (several targets join the same way):

    ct129            a host; a bare group name where no host has that name
    @gpu  @all  all  a group; every host
    ct1*  ct1?9      a glob over host names
    ct1[29:31]       a range (ct129, ct130, ct131; `[01:03]` keeps the zeros, `[a:c]` letters)
    !TERM  &TERM     leave out / keep only the hosts TERM names

As Ansible does, the plain terms are joined first, then each `&` term narrows them and each `!`
term removes hosts, whatever the order written: `@gpu:!ct200`, `@gpu:&@hybrid`. A pattern of only
`!`/`&` terms is refused rather than read as "every host but…" (a deploy never widens silently).
Hosts come back in inventory order, each once. A name that matches nothing is one line with at
most three close names ("did you mean"), never the inventory's whole list.
"""

from __future__ import annotations

import difflib
import re
from typing import Iterable, Mapping, Sequence

from fleetspec.errors import UserError

_RANGE = re.compile(r"\[([0-9]+|[a-zA-Z]):([0-9]+|[a-zA-Z])(?::([0-9]+))?\]")
_GLOB = re.compile(r"[*?\[]")


def split(targets: Iterable[str]) -> list[str]:
    """Each target's terms, split at `:` and `,` outside brackets (`ct1[29:31]` is one term)."""
    terms: list[str] = []
    for target in targets:
        depth, term = 0, ""
        for c in target:
            depth += (c == "[") - (c == "]")
            if c in ":," and depth == 0:
                terms.append(term)
                term = ""
            else:
                term += c
        terms.append(term)
    for term in terms:
        if not term.strip("!&"):
            raise UserError(f"empty term in host pattern {':'.join(targets)!r} (write HOST, @group, a glob or a range)")
    return terms


def _range_values(m: re.Match[str]) -> list[str]:
    start, end, step = m.group(1), m.group(2), int(m.group(3) or 1)
    if start.isdigit() != end.isdigit() or step < 1:
        raise UserError(f"range {m.group(0)!r}: expected [N:M] or [a:z] with an optional :STEP >= 1")
    if start.isdigit():
        lo, hi = int(start), int(end)
        if hi < lo:
            raise UserError(f"range {m.group(0)!r} runs backwards")
        if hi - lo > 100_000:
            raise UserError(f"range {m.group(0)!r} is too long")
        width = len(start) if start.startswith("0") and len(start) > 1 else 0
        return [str(n).zfill(width) for n in range(lo, hi + 1, step)]
    if ord(end) < ord(start):
        raise UserError(f"range {m.group(0)!r} runs backwards")
    return [chr(c) for c in range(ord(start), ord(end) + 1, step)]


def _regex(term: str) -> re.Pattern[str]:
    """A glob with ranges as one regular expression over host names."""
    out, i = "", 0
    for m in _RANGE.finditer(term):
        out += _glob_part(term[i:m.start()]) + "(?:" + "|".join(map(re.escape, _range_values(m))) + ")"
        i = m.end()
    out += _glob_part(term[i:])
    return re.compile(out)


def _glob_part(text: str) -> str:
    if "[" in text or "]" in text:
        raise UserError(f"{text!r}: brackets hold a range like [29:31] or [a:c]")
    return "".join("[^:,]*" if c == "*" else "." if c == "?" else re.escape(c) for c in text)


def suggestions(word: str, hosts: Sequence[str], groups: Iterable[str]) -> list[str]:
    """At most three known names close to `word` (hosts, and groups written @group)."""
    known = [*hosts, *("@" + g for g in groups)]
    close = difflib.get_close_matches(word, known, n=3, cutoff=0.6)
    if not close and not word.startswith("@"):
        close = difflib.get_close_matches("@" + word, known, n=3, cutoff=0.6)
    return close


def _unknown(what: str, term: str, where: str, hosts: Sequence[str], groups: Mapping[str, Sequence[str]]) -> UserError:
    close = suggestions(term, hosts, groups)
    hint = f"; did you mean {', '.join(close)}?" if close else \
        f" ({len(hosts)} hosts, {len(groups)} groups: `fleetspec inventory show` lists them)"
    return UserError(f"{what} {term!r} in {where}{hint}")


def names_of(term: str, hosts: Sequence[str], groups: Mapping[str, Sequence[str]], where: str) -> list[str]:
    """The hosts one term (without its `!`/`&`) names; an unknown name or an empty match is refused."""
    if term in ("all", "@all", "*"):
        return list(hosts)
    if term.startswith("@"):
        if term[1:] in groups:
            return list(groups[term[1:]])
        raise _unknown("unknown group", term, where, hosts, groups)
    if _GLOB.search(term):
        rx = _regex(term)
        found = [h for h in hosts if rx.fullmatch(h)]
        if not found:
            raise _unknown("no host matches", term, where, hosts, groups)
        return found
    if term in hosts:
        if term in groups:
            raise UserError(f"{term!r} in {where} is both a host and a group: write {term} for the host "
                            f"with @{term} for the group, or @{term} alone")
        return [term]
    if term in groups:
        return list(groups[term])
    raise _unknown("unknown host", term, where, hosts, groups)


def select(targets: Iterable[str], hosts: Sequence[str], groups: Mapping[str, Sequence[str]],
           where: str = "the inventory") -> list[str]:
    """The host names `targets` name, in `hosts`' order, each once (see the module's grammar)."""
    targets = list(targets)
    terms = split(targets)
    plain = [t for t in terms if t[0] not in "!&"]
    if terms and not plain:
        raise UserError(f"host pattern {':'.join(targets)!r} only narrows or excludes: start with what it "
                        f"selects, e.g. @all:{terms[0]}")
    chosen: set[str] = set()
    for t in plain:
        chosen.update(names_of(t, hosts, groups, where))
    for t in terms:
        if t[0] == "&":
            chosen &= set(names_of(t[1:], hosts, groups, where))
    for t in terms:
        if t[0] == "!":
            chosen -= set(names_of(t[1:], hosts, groups, where))
    if terms and not chosen:
        raise UserError(f"host pattern {':'.join(targets)!r} selects no host in {where}")
    return [h for h in hosts if h in chosen]
