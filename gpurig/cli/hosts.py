"""Invoke tasks that act on hosts from the inventory (hosts, facts, exec): parse flags, call gpurig, present."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from invoke.exceptions import Exit

from gpurig.cli.base import load_project_spec
from gpurig.cli.options import host_task, select_hosts
from gpurig.config import positive_number
from gpurig.errors import GpurigError
from gpurig.files import write_report
from gpurig.report.tables import Column, rows_document
from gpurig.status import STATUS_STYLE, Status

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.facts import Facts
    from gpurig.flows.fleettask import HostOptions
    from gpurig.image.spec import MatrixEntry
    from gpurig.results import FleetReport, Outcome

__all__ = ["hosts", "facts", "exec_"]

FACTS_SCHEMA = "gpurig.facts/1"
EXEC_SCHEMA = "gpurig.exec/1"
HOSTS_SCHEMA = "gpurig.hosts/1"

_STATUS = Column("status", styles=STATUS_STYLE)


@host_task(connect=False)
def hosts(c, opts: HostOptions):
    """List the hosts a selection picks, with their address, user and groups."""
    columns = [Column("host"), Column("address"), Column("user", drop=2), Column("groups", drop=1), Column("connection", drop=3)]
    rows = []
    for h in select_hosts(opts, connects=False):  # listing connects to none: another plugin's hosts are listed too
        port = f":{h.port}" if h.port else ""
        rows.append([h.name, f"{h.address}{port}", h.user or "", ",".join(h.groups), h.connection])
    doc = rows_document(HOSTS_SCHEMA, columns, rows, inventory=str(opts.settings.inventory))
    if opts.json:
        write_report(opts.json, doc)
    opts.show(columns, rows, doc=doc)


@host_task(help={"full": "every fact provision and verify read too: packages, apt, services, host ids, the GPU-host traps "
                         "(without it those probes are not run, and the JSON lists them as unasked)"})
def facts(c, opts: HostOptions, full=False):
    """Gather facts (OS, kernel, GPUs, driver, Docker, toolkit...) from hosts; the verdict: what each lacks for the spec's default image."""
    from gpurig.flows.fleettask import connect_early, exit_for, fleet_document, run_hosts

    chosen = select_hosts(opts)
    early = connect_early(opts, chosen)  # what loads from here on runs while the logins wait on the network
    from gpurig.facts import PROBES, SUMMARY_PROBES, Facts, gather_complete
    from gpurig.facts.readiness import lacks

    probes = PROBES if full else SUMMARY_PROBES
    entry = _default_entry(c)

    def annotate(report: FleetReport) -> dict[str, Any]:
        if entry is None:
            return {}
        return {
            "image": {"torch": entry.torch, "cuda": entry.cuda, "min_driver": entry.min_driver},
            "lacks": {r.host: list(lacks(r.data, entry.cuda)) for r in report.results if isinstance(r.data, Facts)},
        }

    def work(conn: Connection) -> Facts:
        return gather_complete(conn, probes=probes)

    report = run_hosts(opts, chosen, work, label="facts", schema=FACTS_SCHEMA, annotate=annotate, connector=early, spread=True)
    columns, rows = facts_rows(report, entry)
    opts.show(columns, rows, doc=fleet_document(opts, report, FACTS_SCHEMA, **annotate(report)))
    exit_for(report)


def _default_entry(c) -> MatrixEntry | None:
    """The image spec's default (torch, CUDA), to judge hosts by; None where there is no spec."""
    try:
        return load_project_spec(c, None).default
    except GpurigError:
        return None


# Which columns go first when the terminal is narrow (higher drops earlier); host, status, verdict stay.
FACTS_COLUMNS = (
    Column("host"),
    _STATUS,
    Column("verdict", styles={"ready": "green"}),
    Column("gpus", drop=2),
    Column("driver", drop=1),
    Column("docker", drop=3),
    Column("os", drop=4),
    Column("runtime", drop=5),
    Column("toolkit", drop=6),
    Column("kernel", drop=8),
    Column("cpus", drop=9),
    Column("mem", drop=7),
    Column("cgroup", drop=10),
)


def facts_rows(report: FleetReport, entry: MatrixEntry | None) -> tuple[list[Column], list[list[str]]]:
    """One row per host: what it is and what it lacks for ``entry``, or why it could not be asked."""
    from gpurig.facts import Facts
    from gpurig.facts.readiness import lacks

    columns = list(FACTS_COLUMNS)
    rows = []
    for r in report.results:
        f: Facts | None = r.data if isinstance(r.data, Facts) else None
        if f is None:
            cells = {"host": r.host, "status": r.status, "verdict": r.reason}
        else:
            cells = {
                "host": r.host,
                "status": r.status,
                "verdict": ("; ".join(lacks(f, entry.cuda)) or "ready") if entry else "-",
                "gpus": _gpu_summary(f),
                "driver": f.driver_version or "-",
                "docker": f.docker.server_version or ("stopped" if f.docker.installed else "-"),
                "os": f"{f.os.id or '?'} {f.os.version_id or ''}".strip(),
                "runtime": f.docker.default_runtime or "-",
                "toolkit": f.toolkit_version or "-",
                "kernel": f.kernel or "?",
                "cpus": str(f.cpus or "?"),
                "mem": f"{f.mem_total_bytes / 2**30:.0f}G" if f.mem_total_bytes else "?",
                "cgroup": f"v{f.cgroup_version}" if f.cgroup_version else "?",
            }
        rows.append([cells.get(c.name, "") for c in columns])
    return columns, rows


def _gpu_summary(f: Facts) -> str:
    if f.gpus:
        names = sorted({g.name for g in f.gpus})
        return f"{len(f.gpus)}x {', '.join(names)}"
    if f.pci_gpus:
        return f"{len(f.pci_gpus)} on PCI, no driver"
    return "-"


@host_task(
    help={
        "command": "the command to run (or give it after --: gpurig exec -l gpu -- nvidia-smi -L)",
        "become": "run it through sudo even where the inventory's ansible_become does not ask for it (where it does, exec uses sudo anyway)",
        "timeout": "seconds the command may run on each host (default: no limit)",
    },
    changes=True,
    name="exec",
)
def exec_(c, opts: HostOptions, command=None, become=False, timeout=None):
    """Run one shell command on every selected host: a table of each host's exit code and output (like ansible -a)."""
    from gpurig.flows.fleettask import connect_early, exit_for, fleet_document, run_hosts
    from gpurig.results import Outcome

    line = (c.remainder or "").strip() or (command or "").strip()
    if not line:
        raise Exit("gpurig: no command given; fix: gpurig exec -l PATTERN -- COMMAND", code=2)
    limit = positive_number(timeout, "--timeout") if timeout is not None else None

    def work(conn: Connection) -> Outcome:
        if opts.check:
            return Outcome(status=Status.SKIPPED, detail=f"check mode: would run {line!r}")
        run = conn.sudo if become else conn.admin  # admin: through sudo where the inventory sets ansible_become, as ansible -a does
        result = run(line, warn=True, timeout=limit)
        data = {"rc": result.exited, "stdout": result.stdout, "stderr": result.stderr}
        if result.failed:
            return Outcome(status=Status.FAILED, data=data, detail=f"exited {result.exited}")
        return Outcome(data=data)

    chosen = select_hosts(opts)
    early = connect_early(opts, chosen)
    report = run_hosts(opts, chosen, work, label="exec", schema=EXEC_SCHEMA, annotate=lambda _: {"command": line}, connector=early, spread=True)
    columns = [Column("host"), _STATUS, Column("rc"), Column("stdout"), Column("stderr", drop=1)]
    rows = []
    for r in report.results:
        out = r.data if isinstance(r.data, dict) else {}
        rc = out.get("rc")
        text = out.get("stdout", "").rstrip("\n") if out else r.reason
        rows.append([r.host, r.status, "" if rc is None else str(rc), text, out.get("stderr", "").rstrip("\n")])
    opts.show(columns, rows, doc=fleet_document(opts, report, EXEC_SCHEMA, command=line))
    exit_for(report)

