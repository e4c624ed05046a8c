"""Deploying containers over the fleet as `gpurig deploy` shows it: each container's action, image and bytes moved, the access lines.

The deploy task and the CI chain's deploy stage run the same code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurig.report import outside

if TYPE_CHECKING:
    from gpurig.results import FleetReport
    from gpurig.steps.plan import StepResult

SCHEMA = "gpurig.deploy/1"

def deploy_cells(s: StepResult, check: bool) -> list[str]:
    """action, image, moved, reason of one container."""
    from gpurig.deploy.progress import human_size

    action = s.changes[0].summary if s.changes else "none"
    action = f"would {action}" if check and s.changes else action
    d = s.details
    moved = f"{human_size(d.get('bytes_moved') or 0)} ({d['delivery']})" if d.get("delivery") else ""
    reason = s.reason + (f"\nfix: {s.fix}" if s.fix else "")
    if d.get("delivery_note"):  # why the image took a slower path (e.g. save-load: no docker-registry here)
        reason = f"{reason}\n" if reason else ""
        reason += f"{d['delivery']}: {d['delivery_note']}"
    return [action, d.get("image", ""), moved, reason]

def print_access(report: FleetReport, out) -> None:
    from gpurig.steps.plan import host_results

    for r in report.results:
        for s in host_results(r):
            if s.details.get("access"):
                out.print(f"[bold]{outside(r.host)} {outside(s.step)}[/]")
                for line in s.details["access"]:
                    out.print(outside(line), soft_wrap=True)
