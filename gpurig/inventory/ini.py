"""Ansible's INI inventory format read into the same groups and host vars as the YAML reader, and as strictly.

The grammar is ansible-core's ini plugin's: ``[group]`` sections list hosts
(``name[:port] [var=value ...]``, split like a shell line, ranges such as
``gpu[01:20]``), ``[group:children]`` child groups (one may be named before
its own section), ``[group:vars]`` ``name = value`` lines; hosts before any
section are ungrouped; a line starting with ``#`` or ``;`` is a comment. A
value is what Ansible makes of it: the Python literal it spells (``5``,
``True``, ``[1, 2]``, ``{'a': 1}``; tuples become lists) or else the text as
written, in host lines and ``:vars`` sections alike.

What Ansible would take silently is refused with one line naming the file and
line: a section of unknown type, a host listed twice in one group, a var given
twice on one line or in one section (or two values for one host or group), a
port Ansible would ignore, a set (it has no order), a dict literal with a key
twice, a number past 18 digits or not finite, values nested deeper than the
YAML reader allows, and everything the YAML reader refuses (names, ranges,
sizes).
"""

from __future__ import annotations

import ast
import ipaddress
import math
import re
import shlex
import warnings
from pathlib import Path
from typing import Any

from gpurig.errors import InventoryError, did_you_mean
from gpurig.inventory.hostgroups import Inventory
from gpurig.inventory.loader import _Group, _label, _Loader
from gpurig.strict.validate import excerpt
from gpurig.strict.yamlio import MAX_DEPTH, MAX_INT_DIGITS, MAX_NODES, read_text

_KINDS = ("hosts", "children", "vars")
# A section header, and a child group line: a name without ':', ']' or spaces, then at most a '#' comment.
_SECTION = re.compile(r"\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?")
_CHILD = re.compile(r"([^:\]\s]+)\s*(?:#.*)?")
# host:port, as Ansible splits it: [anything]:port, or a name (brackets only around ranges) then :port
_HOST_PORT = (re.compile(r"\[(.+)\]:([0-9]+)"), re.compile(r"((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)"))
# A name Ansible takes as a host once its port is split off: DNS-like labels not ending in '_' or '-'
_ANSIBLE_NAME = re.compile(r"\w[\w-]*(?<![_-])(?:\.\w[\w-]*(?<![_-]))*")


def load_ini_inventory(path: Path, text: str | None = None) -> Inventory:
    """Read an Ansible INI inventory (plus group_vars/ and host_vars/ beside it); ``text``: the file's, if already read."""
    if text is None:
        text = read_text(path, error=InventoryError, what="inventory", fix_missing="pass --inventory PATH or create inventory/hosts.yaml")
    return _IniReader(path, text).load()


class _IniReader(_Loader):
    """read() takes INI lines; the group graph, vars files and merging are the YAML reader's."""

    def __init__(self, path: Path, text: str) -> None:
        super().__init__(path)
        self.text = text
        # a group named before a section of its own: (kind of that mention, its line, the parents waiting for it)
        self.pending: dict[str, tuple[str, int, list[str]]] = {}
        self.child_lines: dict[tuple[str, str], int] = {}

    def locate(self, entry: tuple[str, str], key: Any = None) -> str:
        if not entry[0].startswith("line "):
            return super().locate(entry, key)  # a group_vars/ or host_vars/ file
        return entry[0] if key is None else f"{entry[0]}: {_label(key)}"

    def read(self) -> None:
        group, kind = self.groups["ungrouped"], "hosts"
        seen: dict[str, int] = {}  # var -> line, in the [group:vars] section being read
        for number, raw in enumerate(self.text.splitlines(), 1):
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            here = f"line {number}"
            section = _SECTION.fullmatch(line)
            if section:
                group, kind = self.section(section.group(1), section.group(2) or "hosts", number)
                seen = {}
            elif line.startswith("[") and not _HOST_PORT[0].fullmatch(line.split()[0]):
                raise self.fail(here, f"{excerpt(line)} is not a section header", "write [group], [group:children] or [group:vars], with no spaces")
            elif kind == "hosts":
                self.host_line(group, line, here)
            elif kind == "children":
                self.child_line(group, line, number)
            else:
                self.vars_line(group, line, here, seen, number)
        self.finish()

    def section(self, name: str, kind: str, number: int) -> tuple[_Group, str]:
        here = f"line {number}"
        if kind not in _KINDS:
            raise self.fail(
                here, f"section [{_label(name)}:{_label(kind)}] has an unknown type{did_you_mean(kind, _KINDS)}",
                "a section is [group], [group:children] or [group:vars]",
            )
        name = self.group_name(name, here)
        if name not in self.groups:
            # as in Ansible, a group exists from its first section, [group:vars] included, in that order
            self.groups[name] = _Group(name)
            if kind == "vars":
                self.pending.setdefault(name, ("vars", number, []))
        if kind != "vars" and name in self.pending:
            for parent in self.pending.pop(name)[2]:
                self.groups[parent].children[name] = None
        return self.groups[name], kind

    def host_line(self, group: _Group, line: str, here: str) -> None:
        try:
            words = shlex.split(line, comments=True)
        except ValueError as err:
            raise self.fail(here, f"cannot split the line into words ({str(err).lower()})", "close the quote, or escape it with a backslash") from None
        if not words or not words[0]:
            raise self.fail(here, "names no host", "start a host line with the host's name")
        pattern, port = _split_port(words[0])
        if pattern.endswith(":"):
            raise self.fail(here, f"host {excerpt(words[0])} ends in ':' with no port", "write host:PORT, or drop the ':'")
        hvars: dict[str, Any] = {}
        for word in words[1:]:
            key, eq, text = word.partition("=")
            if not eq:
                raise self.fail(here, f"{excerpt(word)} is not a name=value host var", "write host vars as name=value; quote a value with spaces")
            if key in hvars:
                raise self.fail(here, f"var {_label(key)} is given twice on this line", "keep one of them")
            hvars[key] = self.value(text, here, key)
        self.parse_host_entry(group, pattern, hvars, here, port)

    def child_line(self, group: _Group, line: str, number: int) -> None:
        here = f"line {number}"
        match = _CHILD.fullmatch(line)
        if not match:
            raise self.fail(here, f"{excerpt(line)} is not a group name", "list one child group per line")
        child = self.group_name(match.group(1), here)
        if child == "all":
            raise self.fail(here, "'all' cannot be a child group", "'all' is the root; remove this line")
        first = self.child_lines.setdefault((group.name, child), number)
        if first != number:
            raise self.fail(here, f"group {_label(child)} is listed twice in [{group.name}:children] (first at line {first})", "keep one of them")
        if child in self.groups:
            group.children[child] = None
        else:  # as in Ansible, it joins its parents when its own section comes, or the inventory is refused
            self.pending.setdefault(child, ("children", number, []))[2].append(group.name)

    def vars_line(self, group: _Group, line: str, here: str, seen: dict[str, int], number: int) -> None:
        key, eq, text = line.partition("=")
        if not eq:
            raise self.fail(here, f"{excerpt(line)} is not a name = value line", f"write the vars of [{group.name}:vars] as name = value")
        key = key.strip()
        if key in seen:
            raise self.fail(here, f"var {_label(key)} is given twice in [{group.name}:vars] (first at line {seen[key]})", "keep one of them")
        seen[key] = number
        self.add_vars(("group", group.name), group.vars, {key: self.value(text.strip(), here, key)}, (here, ""))

    def value(self, text: str, here: str, key: str) -> Any:
        try:
            return read_value(text)
        except InventoryError as err:
            raise self.fail(f"{here}: {_label(key)}", err.problem, err.fix) from None

    def finish(self) -> None:
        for name, (kind, number, parents) in self.pending.items():
            if kind == "vars":
                raise self.fail(
                    f"line {number}", f"[{name}:vars] is for a group no section defines", f"add a [{name}] section (it may be empty) or fix the name"
                )
            raise self.fail(
                f"line {number}", f"[{parents[-1]}:children] names group {_label(name)}, which no section defines",
                f"add a [{name}] section (it may be empty) or fix the name",
            )
        listed = {h for g in self.groups.values() if g.name not in ("all", "ungrouped") for h in g.hosts}
        ungrouped = self.groups["ungrouped"]
        ungrouped.hosts = {h: entry for h, entry in ungrouped.hosts.items() if h not in listed}  # as Ansible: a host in a group is not ungrouped
        parented = {c for g in self.groups.values() for c in g.children}
        for name in self.groups:
            if name != "all" and name not in parented:
                self.groups["all"].children[name] = None
        for g in self.groups.values():
            if "ansible_group_priority" in g.vars:
                g.priority = g.vars.pop("ansible_group_priority")


def _split_port(word: str) -> tuple[str, int | None]:
    """host:port -> (host, port), where Ansible splits it: a port stays part of a name Ansible would not take as a host."""
    for pattern in _HOST_PORT:
        match = pattern.fullmatch(word)
        if match:
            host = match.group(1)
            plain = re.sub(r"\[[^\]]*\]", "0", host)
            try:
                ipaddress.ip_address(plain)
            except ValueError:
                if not _ANSIBLE_NAME.fullmatch(plain):
                    break
            digits = match.group(2).lstrip("0") or "0"
            return host, int(digits) if len(digits) <= 6 else 999_999  # past 65535 either way: the port check says so
    return word, None


def read_value(text: str) -> Any:
    """A value as Ansible's INI reader makes it: the Python literal ``text`` spells (checked), else ``text`` itself."""
    # every separator or operator may be a node of the parse tree: bound them before Python builds it (1+1+... too)
    if sum(map(text.count, ",[{(+-*/%@&|^~<>=:")) > MAX_NODES:
        raise InventoryError(f"a value of more than {MAX_NODES:,} items", "move big values to a YAML file in group_vars/ or host_vars/")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # not a literal: the text as written, as Ansible keeps it
    except (TypeError, RecursionError, MemoryError):
        raise InventoryError(f"{excerpt(text)} is not a value Ansible can read", "write a plain list, dict or number, or quote the text") from None
    if isinstance(value, str):
        return value
    _refuse_repeated_keys(text)
    return _plain(value, 1)


def _refuse_repeated_keys(text: str) -> None:
    """A dict literal that gives a key twice (Python keeps the last one silently, as YAML would: refused there too)."""
    for node in ast.walk(ast.parse(text.lstrip(" \t"), mode="eval")):
        if isinstance(node, ast.Dict):
            keys: list[Any] = []
            for key_node in node.keys:
                key = ast.literal_eval(key_node) if key_node is not None else None
                if key in keys:
                    raise InventoryError(f"key {excerpt(key)} is given twice in one dict", "keep one of them")
                keys.append(key)


def _plain(value: Any, depth: int) -> Any:
    """A literal as Ansible 2.19 stores it (tuples as lists, complex and ... as text), refusing what has no JSON form."""
    if depth > MAX_DEPTH:
        raise InventoryError(f"the value nests deeper than {MAX_DEPTH} levels", "flatten it, or move it to a YAML vars file")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if value.bit_length() > 60 and len(str(abs(value))) > MAX_INT_DIGITS:
            raise InventoryError(f"integer of {len(str(abs(value)))} digits is too large", f"use at most {MAX_INT_DIGITS} digits, or quote it")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InventoryError(f"{excerpt(value)} is not a finite number", "write a finite number, or quote it")
        return value
    if isinstance(value, complex) or value is ...:
        return "..." if value is ... else str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise InventoryError("a bytes value that is not UTF-8", "write text") from None
    if isinstance(value, (set, frozenset)):
        raise InventoryError("a set has no order, so its list would change from run to run", "write a list: [a, b]")
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        for key in value:
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise InventoryError(f"dict key {excerpt(key)} is not text or a whole number", "quote the key")
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    raise InventoryError(f"a {type(value).__name__} value", "write text, a number, a list or a dict")
