"""Reading an inventory file (plus group_vars/ and host_vars/) into an Inventory, in bounded, linear work."""


from __future__ import annotations

import os
import re
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpurig.errors import InventoryError, did_you_mean
from gpurig.inventory.hostgroups import Group, Host, Inventory
from gpurig.inventory.hostrange import expand_host_pattern
from gpurig.inventory.hostvars import CHECKS, CONNECTIONS, as_boolean, as_port, connection_settings, template_problem
from gpurig.strict import validate
from gpurig.strict.yamlio import load_yaml

VAULT = "$ANSIBLE_VAULT;"  # how ansible-vault's files start

MAX_HOSTS = 100_000
# host-in-group pairs, counting every ancestor group: bounds the work that deep
# or wide group graphs can ask for, whatever the host count.
MAX_MEMBERSHIPS = 2_000_000

_GROUP_KEYS = ("hosts", "children", "vars")
_GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_PLAIN = re.compile(r"[A-Za-z0-9_.:\[\]-]{1,40}")  # shown as written in a key path; anything else as a short excerpt
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_VARS_SUFFIXES = (".yml", ".yaml", "")
_UNREAD = object()


def load_yaml_inventory(path: str | Path, data: Any = _UNREAD) -> Inventory:
    """Read an Ansible YAML inventory (plus group_vars/ and host_vars/ beside it); ``data``: the document, if already parsed."""
    return _Loader(Path(path), data).load()


@dataclass
class _Group:
    name: str
    hosts: dict[str, tuple[str, str]] = field(default_factory=dict)  # host -> (where, pattern) of its entry
    children: dict[str, None] = field(default_factory=dict)
    vars: dict[str, Any] = field(default_factory=dict)
    priority: int | None = None  # ansible_group_priority, when the group sets it


class _Loader:
    """One load: groups and hosts as written, then the group graph, then each host's vars. Linear in the input."""

    def __init__(self, path: Path, data: Any = _UNREAD) -> None:
        self.path = path
        self.data = data  # the parsed document when the caller has read it already (gpurig/inventory/source.py)
        # As in Ansible, 'ungrouped' always exists and is the first child of 'all'.
        self.groups: dict[str, _Group] = {"all": _Group("all", children={"ungrouped": None}), "ungrouped": _Group("ungrouped")}
        self.host_vars: dict[str, dict[str, Any]] = {}  # insertion order is the inventory's host order
        self.var_where: dict[tuple[str, str, str], tuple] = {}  # (kind, owner, var) -> (file or None, entry) that set it
        self.entries = 0
        self.var_names: set[str] = set()  # names already checked
        self.budget = 0  # host-group pairs and parent links walked
        self.parents: dict[str, list[str]] | None = None
        self.direct: dict[str, list[str]] = {}

    def fail(self, where: str, rule: str, fix: str, source: Path | None = None) -> InventoryError:
        return InventoryError(f"{source or self.path}: {where}: {rule}", fix)

    def locate(self, entry: tuple[str, str], key: Any = None) -> str:
        """Where an entry (and optionally one var of it) is, as errors name it: its key path here, a line in INI."""
        return _path(entry, key)

    def load(self) -> Inventory:
        self.read()
        return self.build()

    def read(self) -> None:
        """The file as written into groups and host vars: the YAML document here, INI in gpurig/inventory/ini.py."""
        data = self.data if self.data is not _UNREAD else load_yaml(
            self.path, error=InventoryError, what="inventory", fix_missing="pass --inventory PATH or create inventory/hosts.yaml"
        )
        if data is None:
            data = {}
        if isinstance(data, str) and data.startswith(VAULT):
            raise InventoryError(f"{self.path}: is vault-encrypted; gpurig does not decrypt vaults", "decrypt it (ansible-vault decrypt)")
        if not isinstance(data, dict):
            raise InventoryError(f"{self.path}: top level must be a mapping of groups", "start the file with 'all:'")
        root = self.groups["all"]
        for name, body in data.items():
            name = self.group_name(name, "top level")
            if name != "all":
                root.children[name] = None
            self.parse_group(name, body, _label(name))

    def build(self) -> Inventory:
        """The group graph and each host's merged vars, from what read() found."""
        self.direct = _direct_groups(self.groups)
        ungrouped = [h for h in self.host_vars if h not in self.direct]
        for h in ungrouped:
            self.groups["ungrouped"].hosts.setdefault(h, ("all.hosts", h))
        order = _topological(self.path, self.groups)
        depth = _depths(order, self.groups)
        group_files = self.vars_files("group_vars", self.groups)
        host_files = self.vars_files("host_vars", self.host_vars)
        # Ansible's merge order of groups, once for the whole inventory: each host's groups are sorted by it.
        rank = {g: i for i, g in enumerate(sorted(self.groups, key=lambda g: (depth[g], _priority(self.groups[g]), g)))}
        members: dict[str, list[str]] = {g: [] for g in self.groups}
        hosts: dict[str, Host] = {}
        # Hosts with the same direct groups share their ancestors, their group layers and their group names.
        shared: dict[tuple[str, ...], tuple[tuple[str, ...], list[dict[str, Any]], tuple[str, ...], dict[str, Any]]] = {}
        for hname, own in self.host_vars.items():
            direct = tuple(self.direct.get(hname, ("ungrouped",)))
            found = shared.get(direct)
            if found is None:
                ordered = sorted(self.ancestors(direct), key=rank.__getitem__)
                # lookups find the first: group_vars/ files (deepest first) before the file's group vars
                group_layers: list[dict[str, Any]] = [
                    m for m in [group_files.get(g) for g in reversed(ordered)] + [self.groups[g].vars for g in reversed(ordered)] if m
                ]
                names = tuple(g for g in ordered if g not in ("all", "ungrouped")) or ("ungrouped",)
                found = shared[direct] = (tuple(ordered), group_layers, names, connection_settings(group_layers))
            mine, layers, names, settings = found
            self.spend(len(mine))
            for g in mine:
                members[g].append(hname)
            mine_maps: list[dict[str, Any]] = [m for m in (host_files.get(hname), own) if m]
            if mine_maps:
                settings = connection_settings(mine_maps, settings)
            hosts[hname] = _make_host(hname, names, ChainMap(*mine_maps, *layers), settings)
        tree = {name: Group(name, tuple(g.hosts), tuple(g.children), _group_vars(g, group_files.get(name))) for name, g in self.groups.items()}
        return Inventory(
            path=self.path,
            hosts=MappingProxyType(hosts),
            groups=MappingProxyType({g: tuple(m) for g, m in members.items()}),
            tree=MappingProxyType(tree),
        )

    # -- the file as written -------------------------------------------------

    def group_name(self, name: Any, where: str) -> str:
        if isinstance(name, bool) or not isinstance(name, (str, int)) or not _GROUP_NAME.fullmatch(str(name)):
            raise self.fail(
                where,
                f"group {validate.excerpt(name)} is not a valid group name (letters, digits, '_', '-', '.'; at most 128)",
                "rename the group; ':', ',', '&', '!', '*' and spaces belong to host patterns",
            )
        return str(name)

    def parse_group(self, name: str, body: Any, where: str) -> None:
        group = self.groups.setdefault(name, _Group(name))
        if body is None:
            return
        if not isinstance(body, dict):
            raise self.fail(where, "must be a mapping with hosts/children/vars", "indent the group's contents under it")
        for key in body:
            if key not in _GROUP_KEYS:
                raise self.fail(
                    f"{where}.{_label(key)}",
                    f"unknown key{did_you_mean(key, _GROUP_KEYS)}",
                    "a group holds only 'hosts', 'children' and 'vars'",
                )
        gvars = body.get("vars") or {}
        if not isinstance(gvars, dict):
            raise self.fail(f"{where}.vars", "must be a mapping", "write vars as 'name: value' lines")
        self.add_vars(("group", name), group.vars, gvars, (where, "vars"))
        if "ansible_group_priority" in group.vars:
            # as in Ansible, a setting of the group (its merge order), not a var its hosts see
            group.priority = group.vars.pop("ansible_group_priority")
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise self.fail(f"{where}.hosts", "must be a mapping of host names", "write hosts as 'name:' lines, each ending with a colon")
        for pattern, hvars in hosts.items():
            self.parse_host_entry(group, pattern, hvars, f"{where}.hosts")
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise self.fail(f"{where}.children", "must be a mapping of groups", "write child groups as 'name:' lines")
        for child, cbody in children.items():
            child = self.group_name(child, f"{where}.children")
            if child == "all":
                raise self.fail(f"{where}.children.all", "'all' cannot be a child group", "'all' is the root; remove this entry")
            group.children[child] = None
            self.parse_group(child, cbody, f"{where}.children.{_label(child)}")

    def parse_host_entry(self, group: _Group, pattern: Any, hvars: Any, where: str, port: int | None = None) -> None:
        """One host (or range) entry of ``group``; ``port``: INI's host:port, which Ansible applies at a host's first entry only."""
        if isinstance(pattern, bool) or not isinstance(pattern, str):
            # as Ansible: "Host pattern 1234 must be a string" (a YAML number is not the name as written: 0x1F, 1_000)
            raise self.fail(f"{where}.{_label(pattern)}", "is not a host name: a host name must be a string", "enclose it in quotes")
        pattern = str(pattern)
        entry = (where, pattern)  # formatted only for a message
        if hvars is not None and not isinstance(hvars, dict):
            raise self.fail(self.locate(entry), "must be a mapping of vars", "write host vars as 'name: value' lines")
        try:
            names = expand_host_pattern(pattern)
        except InventoryError as err:
            raise self.fail(self.locate(entry), err.problem, err.fix) from None
        self.entries += len(names)
        if self.entries > MAX_MEMBERSHIPS:
            raise self.fail(self.locate(entry), f"the inventory lists more than {MAX_MEMBERSHIPS:,} host entries", "split the inventory")
        for hname in names:
            problem = validate.hostname_problem(hname)
            if problem:
                raise self.fail(
                    self.locate(entry), f"host name {validate.excerpt(hname)} {problem}", "name hosts with letters, digits, '-', '.' (or an IP address)"
                )
            first = group.hosts.get(hname)
            if first is not None:
                raise self.fail(
                    self.locate(entry),
                    f"host {_label(hname)} is listed twice in group {_label(group.name)} (first at {self.locate(first)})",
                    "keep one entry (ranges such as node[1:4] count as entries for each host)",
                )
            group.hosts[hname] = entry
            own = self.host_vars.get(hname)
            if own is None:
                if len(self.host_vars) >= MAX_HOSTS:
                    raise self.fail(
                        self.locate(entry), f"the inventory defines more than {MAX_HOSTS:,} hosts", f"split it into inventories of at most {MAX_HOSTS:,} hosts"
                    )
                own = self.host_vars[hname] = {}
                if port is not None:
                    self.add_vars(("host", hname), own, {"ansible_port": port}, entry)
            elif port is not None and own.get("ansible_port") != port:
                raise self.fail(
                    self.locate(entry),
                    f"host {_label(hname)} is defined above without this port, and Ansible ignores a port after a host's first entry",
                    "give the port on the host's first entry, or as ansible_port=",
                )
            if hvars:
                self.add_vars(("host", hname), own, hvars, entry)

    def add_vars(self, owner: tuple[str, str], into: dict[str, Any], new: dict, where: tuple[str, str], source: Path | None = None) -> None:
        """Check each var and add it; the same var given two different values for one owner is an error."""
        for key, value in new.items():
            if key not in self.var_names:
                if not isinstance(key, str) or not _VAR_NAME.fullmatch(key):
                    raise self.fail(
                        self.locate(where, key), "is not a valid variable name (letters, digits, '_'; not starting with a digit)", "rename the variable", source
                    )
                self.var_names.add(key)
            check = CHECKS.get(key)
            problem = (template_problem(value) or check(value)) if check else None
            if problem:
                raise self.fail(self.locate(where, key), f"{validate.excerpt(value)} {problem[0]}", problem[1], source)
            if key in into and into[key] != value:
                first_source, first_where = self.var_where[(*owner, key)]
                first = f"{first_source}: {self.locate(first_where, key)}" if first_source else self.locate(first_where, key)
                raise self.fail(
                    self.locate(where, key),
                    f"{owner[0]} {_label(owner[1])} already has {_label(key)} = {validate.excerpt(into[key], 30)} from {first}",
                    "give each var one value per host or group",
                    source,
                )
            into[key] = value
            self.var_where[(*owner, key)] = (source, where)

    # -- group_vars/ and host_vars/ -----------------------------------------

    def vars_files(self, dirname: str, known: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """NAME.yml, NAME.yaml, NAME or NAME/*.yml beside the inventory, for the groups or hosts it defines."""
        directory = self.path.parent / dirname
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except OSError as err:
            raise InventoryError(f"cannot read {directory}: {err.strerror}", "check the directory's permissions") from None
        found: dict[str, dict[str, Any]] = {}
        for entry in entries:
            if entry.is_dir():
                name = entry.name
                files = sorted(Path(entry.path) / f for f in os.listdir(entry.path) if f.endswith((".yml", ".yaml")))
            else:
                stem, suffix = os.path.splitext(entry.name)
                if suffix not in _VARS_SUFFIXES or entry.name.startswith("."):
                    continue
                name, files = stem, [Path(entry.path)]
            if name not in known:
                continue  # Ansible ignores vars of hosts and groups the inventory does not define
            into = found.setdefault(name, {})
            for f in files:
                data = load_yaml(f, error=InventoryError, what="vars file") or {}
                if isinstance(data, str) and data.startswith(VAULT):
                    raise InventoryError(f"{f}: is vault-encrypted; gpurig does not decrypt vaults",
                                         "keep these vars in a plain file (gpurig needs no secrets in vars), or decrypt it")
                if not isinstance(data, dict):
                    raise InventoryError(f"{f}: must be a mapping of vars", "write vars as 'name: value' lines")
                self.add_vars((dirname, name), into, data, ("", ""), source=f)
        return found

    # -- the group graph -----------------------------------------------------

    def ancestors(self, direct: tuple[str, ...]) -> list[str]:
        """Every group a host in ``direct`` belongs to, 'all' included (a walk up the parents, within the budget)."""
        if self.parents is None:
            self.parents = {g: [] for g in self.groups}
            for g in self.groups.values():
                for c in g.children:
                    self.parents[c].append(g.name)
        seen = dict.fromkeys(direct)
        stack = list(direct)
        while stack:
            parents = self.parents[stack.pop()]
            self.spend(len(parents))
            for p in parents:
                if p not in seen:
                    seen[p] = None
                    stack.append(p)
        seen.setdefault("all")
        self.spend(len(seen))
        return list(seen)

    def spend(self, work: int) -> None:
        """Count host-group pairs and parent links walked; past MAX_MEMBERSHIPS the inventory is refused."""
        self.budget += work
        if self.budget > MAX_MEMBERSHIPS:
            raise InventoryError(
                f"{self.path}: hosts belong to more than {MAX_MEMBERSHIPS:,} groups in all (counting parents)",
                "nest groups less deeply or split the inventory",
            )


def _path(entry: tuple[str, str], key: Any = None) -> str:
    """The key path of an entry (where, name) and optionally one var under it: all.children.gpu.hosts.a1.ansible_port."""
    parts = [p for p in (entry[0], _label(entry[1]) if entry[1] else "", _label(key) if key is not None else "") if p]
    return ".".join(parts)


def _label(key: Any) -> str:
    """A key as it goes into a key path: as written when plain, else a short escaped excerpt."""
    text = str(key)
    return text if isinstance(key, (str, int)) and _PLAIN.fullmatch(text) else validate.excerpt(key, 30)


def _priority(group: _Group) -> int:
    return 1 if group.priority is None else group.priority


def _group_vars(group: _Group, from_files: dict[str, Any] | None) -> Mapping[str, Any]:
    """A group's own vars as ansible-inventory shows them: group_vars/ over the file's, with its priority."""
    own = {"ansible_group_priority": group.priority} if group.priority is not None else {}
    return MappingProxyType(ChainMap(from_files or {}, group.vars, own))


def _direct_groups(groups: dict[str, _Group]) -> dict[str, list[str]]:
    """Host -> the groups that list it, except 'all' and 'ungrouped'."""
    direct: dict[str, list[str]] = {}
    for g in groups.values():
        if g.name not in ("all", "ungrouped"):
            for h in g.hosts:
                direct.setdefault(h, []).append(g.name)
    return direct


def _topological(path: Path, groups: dict[str, _Group]) -> list[str]:
    """Groups parents-first (iterative DFS, linear); a cycle is an error that names it."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(groups, WHITE)
    post: list[str] = []
    for start in groups:
        if color[start] != WHITE:
            continue
        stack: list[tuple[str, Any]] = [(start, iter(groups[start].children))]
        color[start] = GREY
        while stack:
            name, children = stack[-1]
            for child in children:
                if color[child] == GREY:
                    trail = [n for n, _ in stack]
                    cycle = trail[trail.index(child):] + [child]
                    shown = [_label(g) for g in cycle] if len(cycle) <= 8 else [*map(_label, cycle[:4]), "...", *map(_label, cycle[-3:])]
                    raise InventoryError(f"{path}: group cycle {' -> '.join(shown)}", "a group cannot contain itself")
                if color[child] == WHITE:
                    color[child] = GREY
                    stack.append((child, iter(groups[child].children)))
                    break
            else:
                stack.pop()
                color[name] = BLACK
                post.append(name)
    return post[::-1]


def _depths(order: list[str], groups: dict[str, _Group]) -> dict[str, int]:
    """Longest path from 'all' (Ansible's group depth: a group nested deeper wins), in one pass over the DAG."""
    depth = dict.fromkeys(groups, 0)
    for g in order:
        for c in groups[g].children:
            depth[c] = max(depth[c], depth[g] + 1)
    return depth


def _make_host(name: str, groups: tuple[str, ...], merged: ChainMap, s: Mapping[str, Any]) -> Host:
    """A Host from merged vars that were each checked where they were written, and its settings from them."""
    port, key = s.get("port"), s.get("key")
    return Host(
        name=name,
        groups=groups,
        vars=MappingProxyType(merged),
        address=s.get("address") or name,
        port=as_port(port) if port is not None else None,
        user=s.get("user"),
        key_file=str(Path(key).expanduser()) if key else None,
        become=bool(as_boolean(s.get("become", False))),
        connection=_connection(s.get("connection")),
    )


def _connection(value: Any) -> str:
    """'local', 'ssh' for every name of gpurig's own SSH, or another plugin's name as written (refused where targeted)."""
    if value is None or value in CONNECTIONS:
        return "local" if value == "local" else "ssh"
    return str(value)
