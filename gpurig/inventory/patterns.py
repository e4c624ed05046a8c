"""Ansible's host pattern language over an ``Inventory``: which hosts ``gpu:&h100*:!h100-01`` means.

One pattern is terms joined by ``,`` or, when there is no comma, ``:`` (union), ``:&`` (intersection)
and ``:!`` (exclusion); Ansible applies the unions first, then the
intersections, then the exclusions, whatever the order written, and a pattern
of only exclusions starts from ``all``. A term is ``all`` or ``*``, a group or
host name, a glob (``a100-*``), a regex (``~a10[0-9]``, matched from the
start as Ansible does), each with an optional subscript (``gpu[0]``,
``gpu[1:3]``, both ends included). Several patterns (``-l`` given twice,
``--group`` beside ``--host``) are intersected: a limit narrows, never widens.
Unlike Ansible, a term that matches nothing is an error with a did-you-mean.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpurig.errors import InventoryError, counted, did_you_mean
from gpurig.strict.validate import excerpt

if TYPE_CHECKING:
    from gpurig.inventory.hostgroups import Host, Inventory

_TERMS = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")  # ':'-separated, keeping [...] whole
_SUBSCRIPT = re.compile(r"(.+)\[(?:(-?[0-9]+)|(-?[0-9]+)?\s*:\s*(-?[0-9]+)?)\]")
_GLOB = "*?["
_FIX = "check the name with 'gpurig inventory --graph'"


def select(inventory: Inventory, patterns: Sequence[str]) -> list[Host]:
    """The hosts every pattern matches, in inventory order; all hosts when no pattern is given."""
    chosen: set[str] | None = None
    for pattern in patterns:
        found = match(inventory, pattern)
        chosen = found if chosen is None else chosen & found
    if chosen is None:
        return list(inventory.hosts.values())
    return [h for name, h in inventory.hosts.items() if name in chosen]


def split_pattern(pattern: str) -> list[str]:
    """Ansible's split: on ',' if there is one, else on ':' unless the whole is an IPv6 address; [...] stays whole."""
    pattern = str(pattern).strip()
    if "," in pattern:
        return [p.strip() for p in pattern.split(",") if p.strip()]
    if _is_ipv6(pattern):
        return [pattern]
    terms = _TERMS.findall(pattern)
    if _bare("".join(terms)) != _bare(pattern):  # findall skipped a lone '[' or ']'
        raise InventoryError(f"host pattern {excerpt(pattern)} has an unbalanced '[' or ']'", "close the range or subscript, e.g. gpu[0:3]")
    return terms


def _bare(text: str) -> str:
    return "".join(ch for ch in text if ch != ":" and not ch.isspace())


def match(inventory: Inventory, pattern: str) -> set[str]:
    """Host names one pattern matches."""
    terms = split_pattern(pattern)
    if not terms:
        raise InventoryError(f"empty host pattern {excerpt(pattern)}", "give a host, group or pattern such as 'gpu:!a100-01'")
    unions = [t for t in terms if t[0] not in "&!"]
    result: set[str] = set()
    for term in unions:
        result |= _term(inventory, term)
    if not unions:
        result = set(inventory.hosts)
    for term in terms:
        if term[0] == "&":
            result &= _term(inventory, term[1:])
    for term in terms:
        if term[0] == "!":
            result -= _term(inventory, term[1:])
    return result


def _term(inventory: Inventory, term: str) -> set[str]:
    if not term:
        raise InventoryError("a host pattern has '&' or '!' with no name after it", "write e.g. 'gpu:&a100' or 'all:!h100-01'")
    if term in ("all", "*"):
        return set(inventory.hosts)
    base, subscript = _split_subscript(term)
    found = _names(inventory, base)
    if not found:
        literal = not (base.startswith("~") or any(ch in base for ch in _GLOB))
        hint = did_you_mean(base, [*inventory.groups, *inventory.hosts]) if literal else ""
        raise InventoryError(f"no host or group matches {excerpt(base)} in {inventory.path}{hint}", _FIX)
    if subscript is None:
        return set(found)
    return set(_apply_subscript(term, found, subscript))


def _names(inventory: Inventory, word: str) -> list[str]:
    """Hosts of the groups ``word`` names or matches, then the hosts it names or matches (Ansible's order)."""
    groups, hosts = inventory.groups, inventory.hosts
    if word.startswith("~"):
        try:
            regex = re.compile(word[1:])
        except re.error as err:
            raise InventoryError(f"host pattern {excerpt(word)} is not a valid regular expression ({err.msg})", "fix the regex after '~'") from None
        test = regex.match
    elif any(ch in word for ch in _GLOB):
        test = re.compile(fnmatch.translate(word)).match
    else:
        # A plain name: a group, else a host (a name with a dot may be both, as in Ansible).
        found = list(groups.get(word, ()))
        if (not found or "." in word) and word in hosts:
            found.append(word)
        return found
    found = [h for g in groups if test(g) for h in groups[g]]
    found += [h for h in hosts if test(h)]
    return found


def _split_subscript(term: str) -> tuple[str, tuple[int, int | None] | None]:
    if term.startswith("~") or "[" not in term:
        return term, None
    m = _SUBSCRIPT.fullmatch(term)
    if not m:
        return term, None
    base, index, start, end = m.groups()
    if index is not None:
        return base, (int(index), None)
    return base, (int(start or 0), int(end) if end is not None else -1)


def _apply_subscript(term: str, found: list[str], subscript: tuple[int, int | None]) -> list[str]:
    hosts = list(dict.fromkeys(found))
    start, end = subscript
    if end is None:
        if not -len(hosts) <= start < len(hosts):
            raise InventoryError(f"{excerpt(term)}: index {start} is past the {counted(len(hosts), 'host')} it selects", "use an index from 0")
        return [hosts[start]]
    if end == -1:
        end = len(hosts) - 1
    return hosts[start: end + 1]


def _is_ipv6(piece: str) -> bool:
    bare = piece[1:-1] if piece.startswith("[") and piece.endswith("]") else piece
    if ":" not in bare:
        return False
    try:
        ipaddress.IPv6Address(bare)
    except ValueError:
        return False
    return True
