"""Changes as a person sees them, for provision and deploy alike: one row per step (or container), the diffs, the JSON hosts.

A host's work returns ``StepResult``s (a provision step, a deployed
container); ``outcome`` rolls them up for the fleet, ``result_rows`` makes
the per-host table, ``print_diffs`` shows what each change alters (--diff,
table format only) and ``host_documents`` the JSON report's hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console

from gpurig.report import outside
from gpurig.results import FleetReport
from gpurig.steps.plan import StepResult, host_results

Cells = Callable[[StepResult], Sequence[str]]


def result_rows(report: FleetReport, cells: Cells, blank: int) -> list[list[str]]:
    """[host, step, status, *cells(result)] per result; a host with none gets one row with its own status and reason.

    ``blank`` is how many cells ``cells`` gives: the host row fills them with
    '-' first, then its reason last.
    """
    rows = []
    for r in report.results:
        results = host_results(r)
        if not results:
            rows.append([r.host, "-", r.status, *(["-"] + [""] * (blank - 2))[: blank - 1], r.reason])
        for s in results:
            rows.append([r.host, s.step, s.status, *cells(s)])
    return rows


def reason_text(s: StepResult) -> str:
    """The reason, the fix on a line of its own, then each change's line."""
    lines = [s.reason] + ([f"fix: {s.fix}"] if s.fix else []) + [f"- {c.summary}" for c in s.changes]
    return "\n".join(lines)


def host_documents(report: FleetReport, key: str, doc: Callable[[StepResult], dict[str, Any]], **extra: Any) -> list[dict]:
    """The JSON report's hosts: host, status, reason, fix, then its results under ``key``."""
    return [
        {"host": r.host, "status": r.status, "reason": r.reason, "fix": r.fix,
         **({"duration_s": round(r.duration_s, 3)} if extra.get("durations") else {}),
         key: [doc(s) for s in host_results(r)]}
        for r in report.results
    ]


def print_diffs(report: FleetReport, out: Console) -> None:
    """Each change's diff under a 'host step: change' line; + lines green, - lines red.

    A file several steps write (daemon.json: the toolkit's runtime, then
    gpurig_daemon's keys) is one diff, from the file as it is to the file as
    it will be (the last step's diff is that one: gpurig.steps.converge), under
    one line naming every step and change that writes it.
    """
    for r in report.results:
        shown: dict[str, tuple[list[str], str]] = {}  # a file, or a change that writes none -> (headings, diff)
        for s in host_results(r):
            for i, change in enumerate(s.changes):
                if change.diff:
                    headings, _ = shown.get(change.path or f"{s.step}#{i}", ([], ""))
                    shown[change.path or f"{s.step}#{i}"] = ([*headings, f"{s.step}: {change.summary}"], change.diff)
        for headings, diff in shown.values():
            out.print(f"[bold]{outside(r.host)} {outside('; '.join(headings))}[/]")
            for line in diff.splitlines():
                style = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
                out.print(f"[{style}]{outside(line)}[/]" if style else outside(line), soft_wrap=True)
