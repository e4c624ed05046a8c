"""Where and as whom to connect: an ``SSHTarget`` from inventory host vars, ~/.ssh/config and ProxyJump.

Inventory values are checked before anything reads them: the host address,
user, port and every jump hop must be plain names (``gpurig.strict.validate``).
paramiko's ``SSHConfig.lookup`` runs ``Match exec`` lines of the user's
~/.ssh/config through a shell with ``%h`` expanded, so a host name such as
``x;touch /tmp/pwn`` must never reach it (CVE-2023-51385 is the same hole in
OpenSSH). gpurig never runs a ``ProxyCommand``: one in the inventory's ssh
arguments or in ~/.ssh/config for the host is refused by name, as is any ssh
option gpurig cannot honour.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpurig.errors import HostError
from gpurig.inventory import Host
from gpurig.inventory.hostvars import connection_problem
from gpurig.inventory.sshargs import SSHArgsProblem, jump_hops, ssh_args_jump
from gpurig.strict.validate import excerpt, hostname_problem, port_problem, user_problem, whole_number

if TYPE_CHECKING:
    import paramiko

SSH_ARGS_VARS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")
USER_SSH_CONFIG = Path("~/.ssh/config")


class TargetError(HostError):
    """Host vars or ~/.ssh/config that cannot make a safe SSH target (hostile name, unsupported option)."""

    def __init__(self, name: str, problem: str, fix: str) -> None:
        shown = name if name.isprintable() else excerpt(name)  # an inventory name may hold a newline: one line still
        super().__init__(f"{shown}: {problem}", fix)


@dataclass(frozen=True)
class SSHTarget:
    """Where and as whom to connect, after inventory vars and ~/.ssh/config are combined."""

    name: str
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    jumps: tuple[SSHTarget, ...] = ()

    @property
    def known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def load_ssh_config(path: Path | None) -> paramiko.SSHConfig | None:
    """The user's ssh config (None when there is none); a line paramiko cannot parse is a one-line error."""
    if not path or not Path(path).exists():
        return None
    import paramiko  # here, not at the top: connect_early resolves targets and dials before paramiko loads

    try:
        return paramiko.SSHConfig.from_path(str(path))
    except (OSError, paramiko.ssh_exception.ConfigParseError) as err:
        raise HostError(f"cannot parse ssh config {path}: {err}", "fix that line or pass an empty --ssh-config") from None


def resolve_target(host: Host, ssh_config: paramiko.SSHConfig | None) -> SSHTarget:
    """Inventory vars over ~/.ssh/config, as ssh does with options given on its command line.

    Every inventory value is validated before the config is consulted.
    """
    refused = connection_problem(host.connection)  # select_hosts said so for the task's hosts; a host found otherwise too
    if refused:
        raise TargetError(host.name, *refused)
    address_var = _first_set(host, ("ansible_host", "ansible_ssh_host"), "inventory host name")
    address = _checked_host(host.name, address_var, host.address)
    if host.user is not None:
        _check(host.name, _first_set(host, ("ansible_user", "ansible_ssh_user"), "ansible_user"), host.user, user_problem)
    if host.port is not None:
        _check(host.name, _first_set(host, ("ansible_port", "ansible_ssh_port"), "ansible_port"), host.port, port_problem)
    jump, jump_var = None, ""
    for var in SSH_ARGS_VARS:
        found = jump_from_ssh_args(host.name, var, host.var(var))
        if found and jump is None:
            jump, jump_var = found, var
    hops = parse_jumps(host.name, jump_var, jump) if jump else None  # validated before any lookup

    conf = _lookup(ssh_config, address, host.name)
    keys = [host.key_file] if host.key_file else []
    keys += [str(Path(k).expanduser()) for k in conf.get("identityfile", []) if k not in keys]
    if hops is None:
        hops = parse_jumps(host.name, "ProxyJump in the ssh config", conf.get("proxyjump"))
    return SSHTarget(
        name=host.name,
        hostname=conf.get("hostname", address),
        port=host.port or _config_port(host.name, conf),
        user=host.user or conf.get("user") or getpass.getuser(),
        key_files=tuple(keys),
        jumps=_jump_targets(hops, ssh_config, tuple(keys)),
    )


def jump_from_ssh_args(name: str, var: str, args: object) -> str | None:
    """The ProxyJump in ansible_ssh_common_args / _extra_args (the inventory's grammar, gpurig/inventory/sshargs.py)."""
    try:
        return ssh_args_jump(args)
    except SSHArgsProblem as problem:
        separator = ": " if problem.rule.startswith(("-o", "option")) else " "
        raise TargetError(name, f"{var}{separator}{problem.rule}", problem.fix) from None


def parse_jumps(name: str, var: str, spec: str | None) -> list[tuple[str, str, int | None, str]]:
    """(user or '', host, port or None, as written) per hop of a ProxyJump spec, each part validated (sshargs.jump_hops)."""
    try:
        return jump_hops(spec, var)
    except SSHArgsProblem as problem:
        raise TargetError(name, problem.rule, problem.fix) from None


def _jump_targets(hops, ssh_config, inherited_keys: tuple[str, ...]) -> tuple[SSHTarget, ...]:
    """Targets of validated hops; a hop with no IdentityFile of its own offers the target's keys."""
    targets = []
    for user, host, port, written in hops:
        name = f"jump {written}"
        conf = _lookup(ssh_config, host, name)
        targets.append(
            SSHTarget(
                name=name,
                hostname=conf.get("hostname", host),
                port=port or _config_port(name, conf),
                user=user or conf.get("user") or getpass.getuser(),
                key_files=tuple(str(Path(k).expanduser()) for k in conf.get("identityfile", [])) or inherited_keys,
            )
        )
    return tuple(targets)


def _lookup(ssh_config: paramiko.SSHConfig | None, hostname: str, name: str) -> dict:
    """ssh config for an already validated host name; a ProxyCommand there is refused, not ignored."""
    if ssh_config is None:
        return {}
    conf = ssh_config.lookup(hostname)
    if (conf.get("proxycommand") or "none").lower() != "none":  # paramiko reads "ProxyCommand none" as None
        raise TargetError(
            name,
            f"the ssh config gives {hostname} a ProxyCommand, which gpurig never runs",
            "use ProxyJump in the ssh config (gpurig supports it) or exclude this host from that Host/Match block",
        )
    return conf


def _config_port(name: str, conf: dict) -> int:
    return _port(name, "Port in the ssh config", str(conf.get("port", 22)))


def _port(name: str, what: str, text: str) -> int:
    """A port written as text: digits are its number, anything else stays text for port_problem to refuse."""
    number = whole_number(text, 99999)
    port = text if number is None else number
    _check(name, what, port, port_problem)
    assert isinstance(port, int), "port_problem passes only ints"
    return port


def _checked_host(name: str, var: str, value: str) -> str:
    _check(name, var, value, hostname_problem)
    return value[1:-1] if value.startswith("[") else value  # [v6] -> v6


def _check(name: str, what: str, value: object, problem) -> None:
    rule = problem(value)
    if rule:
        raise TargetError(
            name,
            f"{what} {excerpt(value)} {rule}",
            "use a plain host name or address, user name and port; gpurig refuses anything a shell could act on",
        )


def _first_set(host: Host, names: tuple[str, ...], default: str) -> str:
    return next((n for n in names if n in host.vars), default)
