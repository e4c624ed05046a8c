"""Ansible-format YAML inventory -> ``Host`` objects, and host selection by name, group or pattern.

The file format is Ansible's YAML inventory (``all`` / ``children`` / ``hosts`` /
``vars``), so an inventory a team already has works unchanged. Variables are
merged with Ansible's precedence, lowest first:

1. group vars from the inventory file: ``all``, then parents before children,
   siblings by ``ansible_group_priority`` then name (the later wins);
2. ``group_vars/all.yml`` beside the inventory, then ``group_vars/<group>.yml``
   in the same group order;
3. host vars from the inventory file;
4. ``host_vars/<host>.yml`` beside the inventory.

gpurig's own per-host settings (``gpurig_gpu_count``, ``gpurig_gpu_model``,
container settings...) are ordinary vars and follow the same rules.
"""

from __future__ import annotations

import fnmatch
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import yaml

from gpurig.errors import InventoryError, did_you_mean

_GROUP_KEYS = ("hosts", "children", "vars")
_CONNECTIONS = ("ssh", "paramiko", "smart", "local")
_NAME_RANGE = re.compile(r"\[([0-9a-zA-Z]+):([0-9a-zA-Z]+)(?::([0-9]+))?\]")


@dataclass(frozen=True)
class Host:
    """One inventory host with its merged vars and the connection settings read from them."""

    name: str
    groups: tuple[str, ...]
    vars: Mapping[str, Any] = field(repr=False, compare=False)
    address: str = ""
    port: int | None = None
    user: str | None = None
    key_file: str | None = None
    become: bool = False
    connection: str = "ssh"

    @property
    def is_local(self) -> bool:
        return self.connection == "local"

    def var(self, name: str, default: Any = None) -> Any:
        return self.vars.get(name, default)


@dataclass(frozen=True)
class Inventory:
    """All hosts and groups of one inventory file, in file order."""

    path: Path
    hosts: Mapping[str, Host]
    groups: Mapping[str, tuple[str, ...]]  # group -> member host names (all descendants)

    def select(self, hosts: str | None = None, groups: str | None = None, pattern: str | None = None) -> list[Host]:
        """Hosts named by ``--host a,b``, ``--group g`` and/or an Ansible pattern; all hosts if none given.

        Every name or group must match something: a typo is an error with a
        did-you-mean, never a silently smaller fleet.
        """
        if not (hosts or groups or pattern):
            return list(self.hosts.values())
        chosen: set[str] = set()
        for word in _split(hosts):
            chosen |= self._match_hosts(word)
        for word in _split(groups):
            if word not in self.groups:
                raise InventoryError(
                    f"no group {word!r} in {self.path}{did_you_mean(word, self.groups)}",
                    f"use one of: {', '.join(sorted(self.groups))}",
                )
            chosen |= set(self.groups[word])
        if pattern:
            chosen |= self.match(pattern)
        return [h for name, h in self.hosts.items() if name in chosen]

    def match(self, pattern: str) -> set[str]:
        """Host names matching an Ansible pattern: ``a:b`` union, ``a:&b`` intersection, ``a:!b`` exclusion."""
        result: set[str] = set()
        terms = [t for t in re.split(r"[:,]", pattern) if t]
        if not terms:
            raise InventoryError(f"empty host pattern {pattern!r}", "give a host, group or pattern such as 'gpu:!a100-01'")
        # Ansible applies unions first, then intersections, then exclusions, whatever the order written.
        for term in terms:
            if term[0] not in "&!":
                result |= self._match_term(term)
        for term in terms:
            if term[0] == "&":
                result &= self._match_term(term[1:])
        for term in terms:
            if term[0] == "!":
                result -= self._match_term(term[1:])
        return result

    def _match_term(self, term: str) -> set[str]:
        if term in self.groups:
            return set(self.groups[term])
        return self._match_hosts(term)

    def _match_hosts(self, word: str) -> set[str]:
        if word in self.hosts:
            return {word}
        if word.startswith("~"):
            regex = re.compile(word[1:])
            found = {n for n in self.hosts if regex.search(n)}
        elif any(ch in word for ch in "*?["):
            found = {n for n in self.hosts if fnmatch.fnmatchcase(n, word)}
            found |= {h for g in self.groups if fnmatch.fnmatchcase(g, word) for h in self.groups[g]}
        elif word in self.groups:
            return set(self.groups[word])
        else:
            found = set()
        if not found:
            raise InventoryError(
                f"no host or group matches {word!r} in {self.path}{did_you_mean(word, [*self.hosts, *self.groups])}",
                "check the name with 'invoke hosts'",
            )
        return found


def load_inventory(path: str | Path) -> Inventory:
    """Read an Ansible YAML inventory (plus group_vars/ and host_vars/ beside it)."""
    path = Path(path)
    data = _read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InventoryError(f"{path}: top level must be a mapping of groups", "start the file with 'all:'")
    groups: dict[str, _Group] = {}
    host_order: list[str] = []
    host_vars: dict[str, dict[str, Any]] = {}
    root = groups.setdefault("all", _Group("all"))
    for name, body in data.items():
        if name != "all":
            root.children.append(str(name))
        _parse_group(path, str(name), body, groups, host_order, host_vars, f"{name}")
    ungrouped = [h for h in host_order if not any(h in g.hosts for n, g in groups.items() if n != "all")]
    if ungrouped:
        groups.setdefault("ungrouped", _Group("ungrouped")).hosts.extend(ungrouped)
        if "ungrouped" not in root.children:
            root.children.append("ungrouped")
    _check_cycles(path, groups)

    depth = _depths(groups)
    members = {name: _descendant_hosts(name, groups) for name in groups}
    members["all"] = list(host_order)
    group_files = _vars_dir(path.parent / "group_vars")
    host_files = _vars_dir(path.parent / "host_vars")

    hosts: dict[str, Host] = {}
    for hname in host_order:
        mine = [g for g in groups if hname in members[g]]
        mine.sort(key=lambda g: (depth[g], _priority(groups[g].vars), g))
        merged: dict[str, Any] = {}
        for g in mine:
            merged.update(groups[g].vars)
        for g in mine:
            merged.update(group_files.get(g, {}))
        merged.update(host_vars.get(hname, {}))
        merged.update(host_files.get(hname, {}))
        names = tuple(g for g in mine if g not in ("all", "ungrouped")) or ("ungrouped",)
        hosts[hname] = _make_host(path, hname, names, merged)
    return Inventory(
        path=path,
        hosts=MappingProxyType(hosts),
        groups=MappingProxyType({g: tuple(h for h in host_order if h in members[g]) for g in groups}),
    )


@dataclass
class _Group:
    name: str
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"inventory {path} not found", "pass --inventory PATH or create inventory/hosts.yaml") from None
    except OSError as err:
        raise InventoryError(f"cannot read inventory {path}: {err.strerror}", "check the file's permissions") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InventoryError(f"{path}:{where}: malformed YAML: {what}", "fix the YAML syntax at that line") from None


def _parse_group(path, name, body, groups, host_order, host_vars, where) -> None:
    group = groups.setdefault(name, _Group(name))
    if body is None:
        return
    if not isinstance(body, dict):
        raise InventoryError(f"{path}: {where} must be a mapping with hosts/children/vars", "indent the group's contents under it")
    for key in body:
        if key not in _GROUP_KEYS:
            raise InventoryError(
                f"{path}: unknown key {where}.{key}{did_you_mean(key, _GROUP_KEYS)}",
                "a group holds only 'hosts', 'children' and 'vars'",
            )
    gvars = body.get("vars") or {}
    if not isinstance(gvars, dict):
        raise InventoryError(f"{path}: {where}.vars must be a mapping", "write vars as 'name: value' lines")
    group.vars.update(gvars)
    hosts = body.get("hosts") or {}
    if not isinstance(hosts, dict):
        raise InventoryError(f"{path}: {where}.hosts must be a mapping of host names", "write hosts as 'name:' lines, each ending with a colon")
    for pattern, hvars in hosts.items():
        if hvars is not None and not isinstance(hvars, dict):
            raise InventoryError(f"{path}: {where}.hosts.{pattern} must be a mapping of vars", "write host vars as 'name: value' lines")
        for hname in expand_host_pattern(str(pattern)):
            if hname not in host_order:
                host_order.append(hname)
            if hname not in group.hosts:
                group.hosts.append(hname)
            host_vars.setdefault(hname, {}).update(hvars or {})
    children = body.get("children") or {}
    if not isinstance(children, dict):
        raise InventoryError(f"{path}: {where}.children must be a mapping of groups", "write child groups as 'name:' lines")
    for child, cbody in children.items():
        child = str(child)
        if child not in group.children:
            group.children.append(child)
        _parse_group(path, child, cbody, groups, host_order, host_vars, f"{where}.children.{child}")


def expand_host_pattern(pattern: str) -> list[str]:
    """Ansible's ranges in host names: ``gpu[01:03]`` -> gpu01, gpu02, gpu03; ``node[a:c]`` -> nodea..nodec."""
    m = _NAME_RANGE.search(pattern)
    if not m:
        return [pattern]
    start, end, step = m.group(1), m.group(2), int(m.group(3) or 1)
    head, tail = pattern[: m.start()], pattern[m.end():]
    if start.isdigit() and end.isdigit():
        width = len(start) if start.startswith("0") else 0
        items = [str(i).zfill(width) for i in range(int(start), int(end) + 1, step)]
    elif len(start) == 1 and len(end) == 1 and start.isalpha() and end.isalpha():
        letters = string.ascii_letters
        items = list(letters[letters.index(start): letters.index(end) + 1: step])
    else:
        return [pattern]
    return [name for item in items for name in expand_host_pattern(head + item + tail)]


def _check_cycles(path: Path, groups: dict[str, _Group]) -> None:
    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in trail:
            raise InventoryError(f"{path}: group cycle {' -> '.join((*trail, name))}", "a group cannot contain itself")
        for child in groups[name].children:
            visit(child, (*trail, name))

    visit("all", ())


def _depths(groups: dict[str, _Group]) -> dict[str, int]:
    depth = {"all": 0}
    frontier = ["all"]
    while frontier:
        nxt = []
        for g in frontier:
            for c in groups[g].children:
                # Ansible uses the longest path from 'all', so a group nested deeper wins.
                if depth.get(c, -1) < depth[g] + 1:
                    depth[c] = depth[g] + 1
                    nxt.append(c)
        frontier = nxt
    return {g: depth.get(g, 1) for g in groups}


def _descendant_hosts(name: str, groups: dict[str, _Group]) -> list[str]:
    seen: list[str] = []
    stack = [name]
    visited: set[str] = set()
    while stack:
        g = stack.pop()
        if g in visited:
            continue
        visited.add(g)
        seen.extend(h for h in groups[g].hosts if h not in seen)
        stack.extend(groups[g].children)
    return seen


def _priority(gvars: dict[str, Any]) -> int:
    try:
        return int(gvars.get("ansible_group_priority", 1))
    except (TypeError, ValueError):
        return 1


def _vars_dir(directory: Path) -> dict[str, dict[str, Any]]:
    """group_vars/ or host_vars/: NAME.yml, NAME.yaml, or NAME/ holding several YAML files."""
    found: dict[str, dict[str, Any]] = {}
    if not directory.is_dir():
        return found
    for entry in sorted(directory.iterdir()):
        files: Iterable[Path]
        if entry.is_dir():
            name, files = entry.name, sorted(p for p in entry.iterdir() if p.suffix in (".yml", ".yaml"))
        elif entry.suffix in (".yml", ".yaml", ""):
            name, files = entry.stem, [entry]
        else:
            continue
        for f in files:
            data = _read_yaml(f) or {}
            if not isinstance(data, dict):
                raise InventoryError(f"{f}: must be a mapping of vars", "write vars as 'name: value' lines")
            found.setdefault(name, {}).update(data)
    return found


def _make_host(path: Path, name: str, groups: tuple[str, ...], merged: dict[str, Any]) -> Host:
    connection = str(merged.get("ansible_connection", "ssh"))
    if connection not in _CONNECTIONS:
        raise InventoryError(
            f"{path}: host {name}: ansible_connection {connection!r} is not supported{did_you_mean(connection, _CONNECTIONS)}",
            "use 'ssh' or 'local'",
        )
    port = merged.get("ansible_port", merged.get("ansible_ssh_port"))
    if port is not None:
        try:
            port = int(port)
        except (TypeError, ValueError):
            raise InventoryError(f"{path}: host {name}: ansible_port {port!r} is not a number", "set ansible_port to a TCP port such as 22") from None
        if not 0 < port < 65536:
            raise InventoryError(f"{path}: host {name}: ansible_port {port} is out of range", "use a port between 1 and 65535")
    user = merged.get("ansible_user", merged.get("ansible_ssh_user"))
    key = merged.get("ansible_ssh_private_key_file", merged.get("ansible_private_key_file"))
    return Host(
        name=name,
        groups=groups,
        vars=MappingProxyType(dict(merged)),
        address=str(merged.get("ansible_host", merged.get("ansible_ssh_host", name))),
        port=port,
        user=str(user) if user is not None else None,
        key_file=str(Path(str(key)).expanduser()) if key else None,
        become=_truthy(merged.get("ansible_become", False)),
        connection="local" if connection == "local" else "ssh",
    )


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "yes", "true", "on", "y")
    return bool(value)


def _split(value: str | None) -> list[str]:
    return [w.strip() for w in (value or "").split(",") if w.strip()]
