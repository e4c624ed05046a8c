"""How a person reaches a deployed container: Jupyter's URL with its token, the ssh line, a ready ~/.ssh/config block.

The Jupyter token is read from the container's 0600 token file (through the
image's ``gpurig-entrypoint token``), never from its logs. It is only ever
printed for the person at the terminal: the JSON report gets the command that
prints it instead. Every value written into an ssh_config block is checked
against a strict grammar first, so no inventory value can add a directive.
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from gpurig.connect.connection import Connection
from gpurig.connect.engine import Engine, EngineError
from gpurig.connect.engineinfo import ContainerInfo

if TYPE_CHECKING:
    from gpurig.deploy.containers import ContainerSpec

JUPYTER_PORT, SSH_PORT = 8888, 22
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*\Z")  # a host name, IPv4/IPv6 literal or user name; nothing ssh_config would read as syntax
_TOKEN = re.compile(r"[A-Za-z0-9_.~-]{8,256}\Z")
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def endpoint(conn: Connection) -> tuple[str, int, str, tuple]:
    """(address, ssh port, login, jump targets) of the host, as gpurig reaches it."""
    target = conn.ssh_target
    if target is None:
        return "localhost", 22, conn.user or "", ()
    return target.hostname, target.port, target.user, target.jumps


def login_flags(conn: Connection) -> list[str]:
    """ssh's ``-i KEY`` for the key gpurig logs in with (the inventory's ansible_ssh_private_key_file first), if any."""
    target = conn.ssh_target
    keys = target.key_files if target is not None else ()
    return ["-i", keys[0]] if keys else []


def published(container: ContainerInfo, port: int) -> tuple[str, int] | None:
    """(bind address, host port) where the container's ``port`` is published, if it is."""
    for ip, host_port, inner, proto in container.ports:
        if inner == port and proto == "tcp":
            return ip or "0.0.0.0", host_port
    return None


def read_token(engine: Engine, name: str) -> str | None:
    """The Jupyter token from the container's token file; None if it cannot be read or does not look like a token."""
    try:
        code, out = engine.exec_run(name, ["gpurig-entrypoint", "token"])
    except EngineError:
        return None
    if code != 0:
        return None
    token = out.decode(errors="replace").strip()
    return token if _TOKEN.match(token) else None


def lines(engine: Engine, conn: Connection, spec: ContainerSpec, container: ContainerInfo, login: str, show_token: bool = False) -> list[str]:
    """The lines to print for this container: URLs, ssh commands, config blocks.

    The token is in the URL only with ``show_token`` (the person at a terminal,
    or --show-token); else the line says how to print it.
    """
    address, ssh_port, host_login, jumps = endpoint(conn)
    out: list[str] = []
    jupyter = published(container, JUPYTER_PORT)
    if jupyter:
        bind, port = jupyter
        token = read_token(engine, container.name) if show_token else None
        query = f"?token={token}" if token else ""
        if bind in LOOPBACK:
            port_flag = ["-p", str(ssh_port)] if ssh_port != 22 else []
            tunnel = ["ssh", "-N", "-L", f"{port}:127.0.0.1:{port}", *login_flags(conn), *port_flag,
                      f"{host_login}@{address}" if host_login else address]
            if jumps:
                tunnel[1:1] = ["-J", ",".join(f"{j.user}@{j.hostname}:{j.port}" for j in jumps)]
            out.append(f"Jupyter (bound to the host's loopback): first  {shlex.join(tunnel)}")
            out.append(f"  then open  http://127.0.0.1:{port}/lab{query}")
        else:
            out.append(f"Jupyter: http://{_url_host(address if bind in ('0.0.0.0', '::') else bind)}:{port}/lab{query}")
        if not token:
            out.append(f"  token: docker exec {container.name} gpurig-entrypoint token  (on the host; or deploy --show-token)")
    ssh = published(container, SSH_PORT)
    if ssh:
        bind, port = ssh
        via = jumps
        if bind in LOOPBACK and address not in LOOPBACK:
            # only the host itself reaches its loopback: go through the host's own login
            host = "127.0.0.1"
            via = (*jumps, _Hop(address, ssh_port, host_login))
        else:
            host = address if bind in ("0.0.0.0", "::") or bind in LOOPBACK else bind
        jump = ["-J", ",".join(f"{j.user}@{j.hostname}:{j.port}" for j in via)] if via else []
        out.append(f"SSH: {shlex.join(['ssh', *jump, '-p', str(port), f'{login}@{host}'])}")
        block = ssh_config_block(f"{conn.name}-{container.name}", host, port, login, via)
        if block:
            out.append("  ~/.ssh/config (VS Code Remote-SSH):")
            out.extend("    " + line for line in block)
    return out


def ssh_config_block(alias: str, host: str, port: int, login: str, jumps=()) -> list[str]:
    """A Host block for ~/.ssh/config; [] when any value is not plain (it would be ssh_config syntax)."""
    alias = re.sub(r"[^A-Za-z0-9._-]", "-", alias)
    values = [host, login, *(j.hostname for j in jumps), *(j.user for j in jumps)]
    if not all(_SAFE.match(v or "") for v in values):
        return []
    block = [f"Host {alias}", f"    HostName {host}", f"    Port {int(port)}", f"    User {login}"]
    if jumps:
        block.append("    ProxyJump " + ",".join(f"{j.user}@{j.hostname}:{int(j.port)}" for j in jumps))
    return block


class _Hop:
    """A jump host as ssh_config_block reads one (the shape of an SSHTarget's)."""

    def __init__(self, hostname: str, port: int, user: str) -> None:
        self.hostname, self.port, self.user = hostname, port, user


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
