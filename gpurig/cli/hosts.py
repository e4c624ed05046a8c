"""Invoke tasks that act on hosts from the inventory (facts, hosts): parse flags, call gpurig."""

from __future__ import annotations

import getpass
import os
from pathlib import Path

from invoke.exceptions import Exit
from rich.table import Table

from gpurig.cli.base import project_root, task
from gpurig.report import console, err_console
from gpurig.connection import HOST_KEY_POLICIES, Connector, SSHSettings
from gpurig.errors import InventoryError
from gpurig.facts import Facts, gather
from gpurig.fleet import FleetReport, print_summary, run_fleet
from gpurig.inventory import Host, load_inventory

__all__ = ["facts", "hosts"]

INVENTORY_ENV = "GPURIG_INVENTORY"

_SELECT_HELP = {
    "host": "hosts to act on: names or patterns, comma-separated (a100-*)",
    "group": "inventory groups to act on, comma-separated",
    "pattern": "an Ansible host pattern such as 'gpu:!a100-01'",
    "inventory": f"inventory file (default: ${INVENTORY_ENV} or inventory/hosts.yaml)",
}
_CONNECT_HELP = {
    "forks": "how many hosts at once (default 64)",
    "host_key_policy": "strict | accept-new (default) | off: what to do with unknown host keys",
    "connect_timeout": "seconds to wait for a host to answer (default 10)",
    "ask_sudo_password": "prompt once for the sudo password (else $GPURIG_SUDO_PASSWORD)",
}


def inventory_path(c, inventory: str | None) -> Path:
    """The inventory named by --inventory, else $GPURIG_INVENTORY, else inventory/hosts.yaml."""
    return Path(inventory or os.environ.get(INVENTORY_ENV) or project_root(c) / "inventory" / "hosts.yaml")


def select_hosts(c, host: str | None, group: str | None, pattern: str | None, inventory: str | None) -> list[Host]:
    """The hosts every given selection matches (each is an Ansible pattern and narrows); an empty result is an error."""
    path = inventory_path(c, inventory)
    chosen = load_inventory(path).select(host, group, pattern)
    if not chosen:
        raise InventoryError(f"the selection matches no host in {path}", "check --host/--group/--pattern with 'invoke hosts'")
    return chosen


def make_connector(policy: str, connect_timeout: float, ask_sudo_password: bool, inventory: Path) -> Connector:
    """Connection settings from the flags; the project's known_hosts sits beside the inventory."""
    if policy not in HOST_KEY_POLICIES:
        raise InventoryError(f"unknown --host-key-policy {policy!r}", f"use one of: {', '.join(HOST_KEY_POLICIES)}")
    if policy == "off":
        err_console.print(
            "[bold red]WARNING: host key checking is OFF. Any machine that answers for these hosts "
            "will be trusted; use this only on a network you control.[/]"
        )
    settings = SSHSettings(
        connect_timeout=connect_timeout,
        host_key_policy=policy,
        project_known_hosts=inventory.parent / "known_hosts",
    )
    password = (lambda: getpass.getpass("sudo password: ")) if ask_sudo_password else None
    return Connector(settings, sudo_password=password)


# Long flags only: Invoke would give --host the short flag -h, which users read as help.
@task(
    help={**_SELECT_HELP, **_CONNECT_HELP, "json": "also write the facts as a JSON report to this file"},
    auto_shortflags=False,
)
def facts(
    c,
    host=None,
    group=None,
    pattern=None,
    inventory=None,
    json=None,
    forks=0,
    host_key_policy="accept-new",
    connect_timeout=10,
    ask_sudo_password=False,
):
    """Gather facts (OS, kernel, GPUs, driver, Docker, toolkit...) from hosts and print a table."""
    chosen = select_hosts(c, host, group, pattern, inventory)
    connector = make_connector(host_key_policy, float(connect_timeout), ask_sudo_password, inventory_path(c, inventory))
    try:
        report = run_fleet(chosen, gather, connector=connector, forks=int(forks) or None, report_path=json, label="facts")
    finally:
        connector.close()
    console.print(facts_table(report))
    print_summary(report, err_console)
    if report.exit_code:
        raise Exit(code=report.exit_code)


@task(help=_SELECT_HELP, auto_shortflags=False)
def hosts(c, host=None, group=None, pattern=None, inventory=None):
    """List the hosts a selection picks, with their address, user and groups."""
    header = ("host", "address", "user", "groups", "connection")
    rows = [
        (h.name, f"{h.address}:{h.port}" if h.port else h.address, h.user or "", ",".join(h.groups), h.connection)
        for h in select_hosts(c, host, group, pattern, inventory)
    ]
    if len(rows) > PLAIN_ROWS:
        console.file.write(plain_columns(header, rows))
        return
    table = Table(*header)
    for row in rows:
        table.add_row(*row)
    console.print(table)


# rich spends ~0.25 ms a row measuring cells: 20,000 hosts would take 5 s to draw, so long listings are plain columns.
PLAIN_ROWS = 1000


def plain_columns(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Left-aligned columns, two spaces apart, a header line first: what `ls -l`-style tools print."""
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    return "\n".join(fmt.format(*r).rstrip() for r in (header, *rows)) + "\n"


def facts_table(report: FleetReport) -> Table:
    """One row per host: what it is, or why it could not be asked."""
    table = Table("host", "status", "os", "kernel", "cpus", "mem", "gpus", "driver", "docker", "runtime", "toolkit", "cgroup")
    for r in report.results:
        f: Facts | None = r.data if isinstance(r.data, Facts) else None
        if f is None:
            table.add_row(r.host, f"[red]{r.status}[/]", r.reason[:60], *[""] * 9)
            continue
        gpus = _gpu_summary(f)
        docker = f.docker.server_version or ("stopped" if f.docker.installed else "-")
        table.add_row(
            r.host,
            f"[green]{r.status}[/]",
            f"{f.os.id or '?'} {f.os.version_id or ''}".strip(),
            f.kernel or "?",
            str(f.cpus or "?"),
            f"{f.mem_total_bytes / 2**30:.0f}G" if f.mem_total_bytes else "?",
            gpus,
            f.driver_version or "-",
            docker,
            f.docker.default_runtime or "-",
            f.toolkit_version or "-",
            f"v{f.cgroup_version}" if f.cgroup_version else "?",
        )
    return table


def _gpu_summary(f: Facts) -> str:
    if f.gpus:
        names = sorted({g.name for g in f.gpus})
        return f"{len(f.gpus)}x {', '.join(names)}"
    if f.pci_gpus:
        return f"{len(f.pci_gpus)} on PCI, no driver"
    return "-"
