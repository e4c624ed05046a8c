"""An ``Inventory`` as ``ansible-inventory`` shows it: the ``--list`` document, the ``--graph`` lines, one host's vars.

The shapes follow ansible-core's output (tests/fixtures/inventory/ holds
ansible-inventory 2.19's own output for the same files), so scripts written
against ``ansible-inventory --list`` read gpurig's too.
"""

from __future__ import annotations

import json
from typing import Any

from gpurig.errors import InventoryError, counted, did_you_mean
from gpurig.inventory.hostgroups import Host, Inventory
from gpurig.strict.validate import excerpt

# --graph prints a group once under each parent, so a lattice of groups could ask for billions of lines.
MAX_GRAPH_LINES = 1_000_000


def as_list(inventory: Inventory) -> dict[str, Any]:
    """``ansible-inventory --list``: each group's own hosts and children, every host's resolved vars under ``_meta``."""
    data: dict[str, Any] = {"_meta": {"hostvars": {name: dict(h.vars) for name, h in inventory.hosts.items() if h.vars}}}
    for name, group in inventory.tree.items():
        entry: dict[str, list[str]] = {}
        if group.hosts and name != "all":  # Ansible shows the hosts written under 'all' in 'ungrouped' (or their groups)
            entry["hosts"] = list(group.hosts)
        if group.children:
            entry["children"] = list(group.children)
        if entry:
            data[name] = entry
    return data


def graph(inventory: Inventory, group: str = "all", show_vars: bool = False) -> list[str]:
    """``ansible-inventory --graph [GROUP] [--vars]``: the group tree from ``group``, hosts under their groups."""
    tree = inventory.tree
    if group not in tree:
        raise InventoryError(f"no group {excerpt(group)} in {inventory.path}{did_you_mean(group, tree)}", "pick a group from 'gpurig inventory --graph'")
    size = _graph_size(inventory, show_vars)
    if size[group] > MAX_GRAPH_LINES:
        raise InventoryError(
            f"the graph of {group} would be {size[group]:,} lines (groups repeat under each parent), over {MAX_GRAPH_LINES:,}",
            "graph a smaller group, or use --list",
        )
    lines: list[str] = []
    # Iterative walk: ("group", name, depth) expands; ("line", text, depth) prints.
    stack: list[tuple[str, str, int]] = [("group", group, 0)]
    while stack:
        kind, name, depth = stack.pop()
        if kind == "line":
            lines.append(_indent(name, depth))
            continue
        lines.append(_indent(f"@{name}:", depth))
        todo: list[tuple[str, str, int]] = [("group", child, depth + 1) for child in tree[name].children]
        if name != "all":
            for host in tree[name].hosts:
                todo.append(("line", host, depth + 1))
                if show_vars:
                    todo += _var_lines(inventory.hosts[host].vars, depth + 2)
        if show_vars:
            todo += _var_lines(tree[name].vars, depth + 1)
        stack.extend(reversed(todo))
    return lines


def host_vars(inventory: Inventory, name: str) -> dict[str, Any]:
    """``ansible-inventory --host NAME``: one host's resolved vars (NAME may be a pattern that picks one host)."""
    return dict(one_host(inventory, name).vars)


def one_host(inventory: Inventory, name: str) -> Host:
    if name in inventory.hosts:
        return inventory.hosts[name]
    chosen = inventory.select(name)
    if len(chosen) != 1:
        raise InventoryError(f"{excerpt(name)} matches {counted(len(chosen), 'host')} in {inventory.path}, not one", "give one host's name")
    return chosen[0]


def to_json(data: Any) -> str:
    """``--list``/``--host`` output as ansible-inventory prints it: 4 spaces, keys sorted as text; values JSON lacks (dates) as text.

    YAML keys need not be strings (``{a: 1, 0: 2}``); Ansible prints each as JSON
    names it (0 as "0", true as "true", null as "null") and sorts the names, where
    json's sort_keys compared 0 with "a" and raised TypeError.
    """
    return json.dumps(_named_keys(data), indent=4, sort_keys=True, default=str) + "\n"


def _named_keys(value: Any) -> Any:
    # The inventory reader caps nesting (gpurig/strict/yamlio.py), so this recursion stays shallow.
    if isinstance(value, dict):
        return {_key_name(k): _named_keys(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_named_keys(v) for v in value]
    return value


def _key_name(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)  # null, true, 0, 1.5: as json.dumps names them, and Ansible after it
    return str(key)  # a date: as its value would be shown (ansible-inventory 2.19 stops with a traceback here)


def _indent(text: str, depth: int) -> str:
    return "  |" * depth + "--" + text if depth else text


def _var_lines(values, depth: int) -> list[tuple[str, str, int]]:
    return [("line", f"{{{key} = {values[key]}}}", depth) for key in sorted(values)]


def _graph_size(inventory: Inventory, show_vars: bool) -> dict[str, int]:
    """Lines each group's graph takes, children first (memoised: linear in groups, hosts and vars)."""
    tree = inventory.tree
    size: dict[str, int] = {}
    stack = [(name, False) for name in tree]
    while stack:
        name, ready = stack.pop()
        if name in size:
            continue
        if not ready:
            stack.append((name, True))
            stack.extend((c, False) for c in tree[name].children if c not in size)
            continue
        own = 1 + (len(tree[name].vars) if show_vars else 0)
        if name != "all":
            own += sum(1 + (len(inventory.hosts[h].vars) if show_vars else 0) for h in tree[name].hosts)
        size[name] = own + sum(size[c] for c in tree[name].children)
    return size
