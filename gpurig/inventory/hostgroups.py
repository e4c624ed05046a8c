"""The inventory as gpurig uses it: hosts with their merged vars, groups, and selection by Ansible patterns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpurig.inventory import patterns as host_patterns


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
class Group:
    """One group as the inventory defines it: its own hosts and child groups, and its vars (file, then group_vars/)."""

    name: str
    hosts: tuple[str, ...]
    children: tuple[str, ...]
    vars: Mapping[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class Inventory:
    """All hosts and groups of one inventory file, in file order."""

    path: Path
    hosts: Mapping[str, Host]
    groups: Mapping[str, tuple[str, ...]]  # group -> member host names (all descendants), in host order
    tree: Mapping[str, Group] = field(default_factory=dict, repr=False, compare=False)

    def select(self, *patterns: str | None, hosts: str | None = None, groups: str | None = None, pattern: str | None = None) -> list[Host]:
        """Hosts matching every Ansible pattern given (each narrows: ``select('gpu', 'h100-01')`` is h100-01), in inventory order.

        ``hosts=``, ``groups=`` and ``pattern=`` are the older spelling and
        narrow the same way. No pattern at all selects every host. Every term
        must match something: a typo is an error with a did-you-mean, never a
        silently smaller fleet.
        """
        return host_patterns.select(self, [p for p in (*patterns, hosts, groups, pattern) if p])

    def match(self, pattern: str) -> set[str]:
        """Host names matching one Ansible pattern (``a:b`` union, ``a:&b`` intersection, ``a:!b`` exclusion)."""
        return host_patterns.match(self, pattern)


