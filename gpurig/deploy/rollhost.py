"""One host of a rollout: deliver the new image and recreate its containers (deploy's own ``deploy_host``), verify, roll back.

``roll_host(conn, job)`` is what the fleet runs per host. It records the
image ids the host's containers run before anything changes (the state file
keeps them, so that a host caught mid-change by Ctrl-C or a crash is rolled
back to them on a re-run, not to the unverified new image), deploys the
new image as ``gpurig deploy`` does, then verifies each container (the
``verify`` callable: the CLI's ``gpurig verify --container`` plan). A
container that fails either is put back on the image id it ran before: the
old image is still on the host (nothing removes it while the rollout runs),
so the rollback moves nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpurig.connect.connection import Connection
from gpurig.connect.engine import Engine
from gpurig.connect.engineopen import open_engine
from gpurig.deploy.apply import DeployJob, Target, deploy_host
from gpurig.deploy.compare import IMAGE_LABEL
from gpurig.deploy.delivery import Delivery, DeliveryError
from gpurig.deploy.rollplan import DONE, FAILED, ROLLED_BACK, STARTED, RolloutState
from gpurig.errors import counted
from gpurig.results import Outcome
from gpurig.status import Status
from gpurig.steps.plan import StepResult

# (connection, container name) -> (passed, why not: the first failing record, its fix)
Verify = Callable[[Connection, str], "tuple[bool, str, str]"]


@dataclass(frozen=True)
class RolloutJob:
    deploy: DeployJob  # its targets: each host's containers on the new image
    verify: Verify
    state: RolloutState
    image_ref: str  # the target, as --to named it
    image_id: str  # its id on this machine ("" where only the registry has it)
    level: str = "quick"


def roll_host(conn: Connection, job: RolloutJob) -> Outcome:
    """Deploy, verify, and on a failure roll back: ``changed`` on the new image, ``failed`` (with why) otherwise."""
    targets = job.deploy.targets[conn.name]
    previous = job.state.previous(conn.name) or running(conn, targets)
    job.state.record(conn.name, state=STARTED, image_ref=job.image_ref, image_id=job.image_id, previous=previous, verify="not run",
                     level=job.level)
    results = deploy_host(conn, job.deploy)
    moved = delivered(results)
    bad = [r for r in results if r.status == Status.FAILED]
    if bad:
        why = "deploy failed: " + "; ".join(f"{r.step}: {r.reason}" for r in bad)
        return back(conn, job, previous, FAILED, why, next((r.fix for r in bad if r.fix), ""), verify="not run", moved=moved)
    for t in targets:
        passed, why, fix = job.verify(conn, t.spec.name)
        if not passed:
            return back(conn, job, previous, ROLLED_BACK, f"{t.spec.name}: {why}" if len(targets) > 1 else why, fix, verify="failed",
                        moved=moved)
    now = running(conn, targets)
    ids = sorted({p["image_id"] for p in now.values() if p.get("image_id")})
    job.state.record(conn.name, state=DONE, image_ref=job.image_ref, image_id=ids[0] if len(ids) == 1 else job.image_id,
                     previous=previous, verify="passed", level=job.level, reason="")
    return Outcome(changed=True, detail="new image, verify passed", data=moved)


def delivered(results: Sequence[StepResult]) -> dict[str, Any]:
    """How the new image came to the host (the first of its containers' deliveries): method, source, bytes, note; {} for none."""
    for r in results:
        if r.details.get("delivery"):
            return {k: r.details.get(k) for k in ("delivery", "delivery_source", "bytes_moved", "delivery_note")}
    return {}


def back(conn: Connection, job: RolloutJob, previous: dict, state: str, why: str, fix: str, *, verify: str,
         moved: dict[str, Any] | None = None) -> Outcome:
    """Put every container back on the image id it ran before; record where the host is now and why (``moved``: how the new
    image came, the outcome's data)."""
    failed = roll_back(conn, job, previous)
    olds = [p for p in previous.values() if p.get("image_id")]
    if failed:
        state, why = FAILED, f"{why}; the rollback failed too: {failed}"
    job.state.record(conn.name, state=state, image_ref=olds[0].get("image_ref", "") if olds else "",
                     image_id=olds[0]["image_id"] if olds else "", previous=previous, verify=verify, level=job.level, reason=why,
                     tried=job.image_ref)
    return Outcome(status=Status.FAILED, detail=f"rolled back: {why}" if state == ROLLED_BACK else why, fix=fix, data=moved or {})


def running(conn: Connection, targets: list[Target]) -> dict[str, dict[str, Any]]:
    """container -> the image (id, and the reference deploy asked for) it runs now; None values where it does not exist."""
    out: dict[str, dict[str, Any]] = {}
    with open_engine(conn) as engine:
        for t in targets:
            found = engine.container(t.spec.name)
            out[t.spec.name] = {"image_id": found.image_id if found else None,
                                "image_ref": (found.labels.get(IMAGE_LABEL) or found.image) if found else None}
    return out


def roll_back(conn: Connection, job: RolloutJob, previous: dict[str, dict[str, Any]]) -> str:
    """Recreate each container on its old image id (one that did not exist before is removed); "" or why it could not be done."""
    olds: list[Target] = []
    with open_engine(conn) as engine:
        for t in job.deploy.targets[conn.name]:
            old_id = (previous.get(t.spec.name) or {}).get("image_id")
            if not old_id:
                if engine.container(t.spec.name) is not None:
                    engine.remove(t.spec.name)  # it ran nothing before the rollout: it goes
                continue
            image = engine.image(old_id)
            if image is None:
                return f"{t.spec.name}: its old image {old_id[:19]} is no longer on the host"
            olds.append(dataclasses.replace(t, spec=dataclasses.replace(t.spec, image=old_id), image_ref=old_id, image=image))
    if not olds:
        return ""
    rollback = dataclasses.replace(job.deploy, targets={**job.deploy.targets, conn.name: olds}, deliver=present)
    bad = [r for r in deploy_host(conn, rollback) if r.status == Status.FAILED]
    return "; ".join(f"{r.step}: {r.reason}" for r in bad)


def prune_host(conn: Connection, keep: str, olds: list[str]) -> Outcome:
    """After the whole rollout: the old images gone from the host, each unless a container (running or not) still uses it."""
    gone = []
    with open_engine(conn) as engine:
        used = {c.image_id for c in engine.containers()}
        for old in dict.fromkeys(olds):
            image = engine.image(old)
            if image is None or old == keep or image.id in used:
                continue
            for ref in (*image.tags, image.id):  # by name first: an image id with several names is refused without --force
                engine.untag(ref)
            gone.append(old)
    return Outcome(changed=bool(gone), data=tuple(gone), detail=f"removed {counted(len(gone), 'old image')}" if gone else "")


def present(engine: Engine, conn: Connection, t: Target, say: Callable[[str], None]) -> Delivery:
    """A rollback's delivery: the old image is on the host already (by its id), so nothing moves."""
    found = engine.image(t.image_ref)
    if found is None:
        raise DeliveryError(f"the old image {t.image_ref[:19]} is no longer on {conn.name}",
                            "deploy the old image again by its tag (gpurig deploy)", host=conn.name)
    say(f"rolling back to {t.image_ref[:19]}, still on the host")
    return Delivery("present", 0, found.id)


__all__ = ["RolloutJob", "prune_host", "roll_back", "roll_host", "running"]
