"""The inventory vars gpurig acts on: a check for each (the rule and its fix) and the connection settings read from them.

A var is checked where it is written (inventory file, group_vars/, host_vars/),
so its error names that file and key; any var not in ``CHECKS`` is free.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpurig.errors import did_you_mean
from gpurig.inventory.sshargs import SSHArgsProblem, jump_hops, ssh_args_jump
from gpurig.strict import validate

CONNECTIONS = ("ssh", "paramiko", "paramiko_ssh", "smart", "local")  # local, or gpurig's own SSH for the others
# Another connection plugin's name (winrm, docker, network_cli, a collection's or a user's): loaded, and refused only
# for the hosts a task that connects targets (connection_problem), as one such host must not make the inventory unusable.
_PLUGIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}(?:\.[A-Za-z_][A-Za-z0-9_]{0,63}){0,3}")
_CONNECTIONS_FIX = f"use {', '.join(CONNECTIONS[:-1])} or {CONNECTIONS[-1]}"
_TRUE = ("yes", "on", "1", "true", "y", "t")
_FALSE = ("no", "off", "0", "false", "n", "f")


def as_port(value: Any) -> Any:
    """A port as written: an int, or digits in quotes ("2222", as INI inventories give it)."""
    number = validate.whole_number(value, 99999) if isinstance(value, str) else None
    return value if number is None else number


def _checked(check, fix: str):
    """A validate.*_problem function as a var check that also says the fix."""

    def problem(value: Any) -> tuple[str, str] | None:
        rule = check(value)
        return (rule, fix) if rule else None

    return problem


def _connection_problem(value: Any) -> tuple[str, str] | None:
    if value in CONNECTIONS or validate.matches(_PLUGIN, value):
        return None
    return ("is not a connection plugin's name", _CONNECTIONS_FIX)


def connection_problem(connection: str) -> tuple[str, str] | None:
    """(rule, fix) where a targeted host's ansible_connection is one gpurig does not drive; None for the ones it does."""
    if connection in CONNECTIONS:
        return None
    return (f"ansible_connection {validate.excerpt(connection)} is not one gpurig drives{did_you_mean(connection, CONNECTIONS)}",
            f"{_CONNECTIONS_FIX}, or leave the host out with --limit '!HOST'")


def template_problem(value: Any) -> tuple[str, str] | None:
    """An Ansible template ("{{ ... }}") where gpurig needs the value itself: said as such, not as a bad character."""
    if isinstance(value, str) and ("{{" in value or "{%" in value):
        return ("is a Jinja template, and gpurig does not template", "write the value itself (Ansible's templating is not run)")
    return None


def _become_problem(value: Any) -> tuple[str, str] | None:
    return None if as_boolean(value) is not None else ("is not a boolean", "use true or false")


def _priority_problem(value: Any) -> tuple[str, str] | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return ("must be a whole number", "use a number such as 10 (higher merges later)")
    return None


def _key_file_problem(value: Any) -> tuple[str, str] | None:
    if not isinstance(value, str) or not value or any(ord(ch) < 32 for ch in value):
        return ("must be a file path on one line", "give the path of the private key")
    return None


def _ssh_args_problem(value: Any) -> tuple[str, str] | None:
    """The same grammar connecting applies, at load: `gpurig hosts` must not accept a ProxyCommand that `facts` refuses."""
    if not isinstance(value, str):
        return ("must be text (ssh options)", "write the options as one string")
    try:
        jump_hops(ssh_args_jump(value), "ProxyJump")
    except SSHArgsProblem as problem:
        return (problem.rule, problem.fix)
    return None


_host_problem = _checked(validate.hostname_problem, "use a DNS name or an IP address")
_user_problem = _checked(validate.user_problem, "use a login name such as ubuntu")
_port_problem = _checked(lambda v: validate.port_problem(as_port(v)), "set it to a TCP port such as 22")
# var -> check(value) -> (rule, fix) or None: the vars gpurig acts on; any other var is free
CHECKS = {
    "ansible_host": _host_problem,
    "ansible_ssh_host": _host_problem,
    "ansible_user": _user_problem,
    "ansible_ssh_user": _user_problem,
    "ansible_port": _port_problem,
    "ansible_ssh_port": _port_problem,
    "ansible_connection": _connection_problem,
    "ansible_become": _become_problem,
    "ansible_group_priority": _priority_problem,
    "ansible_ssh_private_key_file": _key_file_problem,
    "ansible_private_key_file": _key_file_problem,
    "ansible_ssh_common_args": _ssh_args_problem,
    "ansible_ssh_extra_args": _ssh_args_problem,
}


def as_boolean(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        return True if word in _TRUE else False if word in _FALSE else None
    return None


SETTINGS = {
    "address": ("ansible_host", "ansible_ssh_host"),
    "port": ("ansible_port", "ansible_ssh_port"),
    "user": ("ansible_user", "ansible_ssh_user"),
    "key": ("ansible_ssh_private_key_file", "ansible_private_key_file"),
    "become": ("ansible_become",),
    "connection": ("ansible_connection",),
}


def connection_settings(maps: Sequence[Mapping[str, Any]], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The connection settings from ``maps`` (highest precedence first) over ``base``."""
    found = dict(base or {})
    for name, keys in SETTINGS.items():
        for m in maps:
            hit = next((k for k in keys if k in m), None)
            if hit is not None:
                found[name] = m[hit]
                break
    return found
