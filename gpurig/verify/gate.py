"""What a verification proves, as the fleet, rollouts and CI read it: the plan from the user's choices, a host's verdict as its outcome, the fleet's pass.

A host is ``ok`` only when proven: a failure, or a verification that
checked nothing, is ``failed`` with one line. Library code, so a rollout's
verify gate is this plan and this outcome, not the verify task.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gpurig.config import choice
from gpurig.errors import ConfigError
from gpurig.results import Outcome
from gpurig.status import Status
from gpurig.strict import validate

FABRIC_LEVEL = "fabric"  # gpurig/flows/fabricverify.py: the hosts together, after each one's quick verify

if TYPE_CHECKING:
    from gpurig.results import FleetReport
    from gpurig.verify.records import HostVerdict
    from gpurig.verify.runner import VerifyPlan


def verdict_outcome(verdict: HostVerdict) -> Outcome:
    """``ok`` only for a proven host: a failure, or a verification that checked nothing, is ``failed`` with one line."""
    failed = verdict.failures
    if failed:
        return Outcome(status=Status.FAILED, data=verdict, detail=f"{failed[0].id}: {failed[0].detail}", fix=failed[0].fix)
    if not verdict.passed:  # every host record skipped: records.unchecked adds a failure for it, this is the backstop
        return Outcome(status=Status.FAILED, data=verdict, detail="nothing was checked on the host: every host record was skipped")
    return Outcome(data=verdict)


def fleet_passed(report: FleetReport) -> bool:
    """The JSON's ``passed``: at least one host, every one verified and proven (not unreachable, not skipped, not unchecked)."""
    verdicts = [verdict_of(r.data) for r in report.results]
    return report.exit_code == 0 and bool(verdicts) and all(v is not None and v.passed for v in verdicts)


def make_plan(container: str | None, image: str | None, level: str | None) -> VerifyPlan:
    """The run's plan from the flags; conflicting or empty values are one clear usage error."""
    from gpurig.verify.runner import LEVELS, VerifyPlan

    if container and image:
        raise ConfigError("--container and --image both given", "verify either a deployed container (--container NAME) or an image (--image TAG)")
    # Docker's own grammars, checked before any host is contacted (a bad tag used to fail on every host, one by one)
    checks = (("--container", container, validate.container_name_problem, "the container's name, e.g. alice-jupyter"),
              ("--image", image, validate.image_ref_problem, "an image reference, e.g. registry.example.com/ml/pytorch:2.9.1-cu128-slim"))
    for flag, value, problem, fix in checks:
        rule = problem(value) if value is not None else None
        if rule:
            raise ConfigError(f"{flag} {validate.excerpt(value)} {rule}", f"give {flag} {fix}")
    chosen = choice(level or "quick", (*LEVELS, FABRIC_LEVEL), "--level")
    if chosen == FABRIC_LEVEL:  # the ranks run in the image the hosts train in; its quick verify comes first
        if not image:
            raise ConfigError("--level fabric needs --image", "give the image the hosts train in: --image TAG (gpurig deploy puts it there)")
        return dataclasses.replace(VerifyPlan.from_checks("quick", None, image), level=FABRIC_LEVEL)
    return VerifyPlan.from_checks(chosen, container, image)


def verdict_of(data) -> HostVerdict | None:
    from gpurig.verify.records import HostVerdict

    return data if isinstance(data, HostVerdict) else None
