"""A job as the host's agent describes it (``JobView``), the words a person reads for its state, and finding a job by id.

The agent's document is the truth; this module only types it and says it:
``pending (2nd in the queue: waiting for 1 GPU ...)``, ``failed (host
rebooted)``, ``failed (exited 3)``. ``exit_status`` is what ``run --wait``
and ``attach`` exit with: the script's code, 128+N for a signal (the
engine's own convention), 1 when no code is known.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpurig.errors import ConfigError, counted
from gpurig.strict import validate

_ID = re.compile(r"[a-z0-9][a-z0-9-]{2,63}")
STATES = ("pending", "running", "succeeded", "failed", "cancelled")
FINAL = ("succeeded", "failed", "cancelled")


class NoSuchJob(ConfigError):
    """No job has the id asked for on the hosts searched (a reader that answers "not found", as the dashboard's 404, tells it apart)."""


@dataclass(frozen=True)
class JobView:
    host: str
    id: str
    name: str
    state: str
    reason: str = ""
    argv: tuple[str, ...] = ()
    image: str = ""
    mode: str = "container"
    container: str | None = None
    request: Any = None  # the GPU request: {"count": 1} | {"ids": [...]} | {"all": true} | {}
    gpus: tuple[str, ...] = ()  # the device ids it got (the agent's "devices")
    submitted_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    attempt: int = 0
    attempts: tuple[dict, ...] = ()
    queue_position: int | None = None
    artifacts: tuple[str, ...] = ()
    workdir: str = ""
    user: str = ""  # who submitted it: the job agent's meta (the submitting shell's $USER, as the client said it), Slurm's user_name
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {**self.raw, "host": self.host}

    @property
    def ended(self) -> bool:
        return self.state in FINAL

    @property
    def runtime_s(self) -> float | None:
        """Seconds it has run (to its end, or now); None before it started."""
        if self.started_at is None:
            return None
        return max(0.0, (self.ended_at or time.time()) - self.started_at)

    @property
    def state_text(self) -> str:
        if self.state == "pending" and self.queue_position:
            place = f"{ordinal(self.queue_position)} in the queue"
            return f"pending ({place}: {self.reason})" if self.reason else f"pending ({place})"
        if self.state == "succeeded" or self.reason in ("", self.state):
            return self.state
        return f"{self.state} ({self.reason})"

    @property
    def gpu_text(self) -> str:
        if self.gpus:
            return ",".join(self.gpus)
        r = self.request or {}
        if self.mode == "exec":
            return f"{self.container}'s"
        return "all" if r.get("all") else str(r["count"]) if r.get("count") else ",".join(r.get("ids") or ()) or "-"

    @property
    def exit_status(self) -> int:
        if self.state == "succeeded":
            return 0
        if self.exit_code is not None:
            return int(self.exit_code) or 1
        return 1


def job_view(host: str, doc: dict) -> JobView:
    def number(key: str) -> float | None:
        value = doc.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    code = doc.get("exit_code")
    slurm = doc.get("slurm")
    user = doc.get("user") or (slurm.get("user") if isinstance(slurm, dict) else None)
    return JobView(
        host=host, id=str(doc.get("id", "")), name=str(doc.get("name") or ""), state=str(doc.get("state") or "?"),
        reason=str(doc.get("reason") or ""), argv=tuple(str(a) for a in doc.get("argv") or ()), image=str(doc.get("image") or ""),
        mode=str(doc.get("mode") or "container"), container=doc.get("container"), request=doc.get("gpus") if isinstance(doc.get("gpus"), dict) else None,
        gpus=tuple(str(g) for g in doc.get("devices") or ()),
        submitted_at=number("submitted_at"), started_at=number("started_at"), ended_at=number("ended_at"),
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None, attempt=int(doc.get("attempt") or 0),
        attempts=tuple(a for a in doc.get("attempts") or () if isinstance(a, dict)), queue_position=doc.get("queue_position"),
        artifacts=tuple(str(a) for a in doc.get("artifacts") or ()), workdir=str(doc.get("workdir") or ""),
        user=user if isinstance(user, str) else "", raw=doc,
    )


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"


def check_job_id(text: str | None) -> str:
    """A job id (or a prefix of one, at least 3 characters) as `gpurig run` printed it."""
    value = (text or "").strip()
    if value.isdecimal() and value.isascii() and len(value) <= 12:
        return value  # a Slurm job's id (gpurig's own ids are never all digits)
    if not validate.matches(_ID, value):
        raise ConfigError(f"{validate.excerpt(text)} is not a job id" if value else "the job id is empty",
                          "give the id `gpurig run` printed, or at least its first 3 characters (`gpurig jobs` lists them)")
    return value


def pick(found: list[JobView], wanted: str, searched: int) -> JobView:
    """The one job whose id is ``wanted`` or starts with it; none or several is one line naming what was found."""
    exact = [j for j in found if j.id == wanted]
    matches = exact or [j for j in found if j.id.startswith(wanted)]
    if not matches:
        raise NoSuchJob(f"no job {wanted} on the {counted(searched, 'host')} searched",
                          "see the jobs with `gpurig jobs` (and select the host with -l if it is not in the inventory's default)")
    if len(matches) > 1:
        listed = ", ".join(f"{j.id} ({j.host})" for j in matches[:6])
        raise ConfigError(f"{wanted} is the start of several jobs: {listed}", "give more of the id")
    return matches[0]


def job_junit(views: Iterable[JobView]) -> str:
    """Jobs as JUnit XML: one testcase per job, a failure when it did not succeed (with its exit code and why)."""
    import xml.etree.ElementTree as ET

    from gpurig.verify.junit import xml_text

    views = list(views)
    root = ET.Element("testsuites", name="gpurig run")
    suite = ET.SubElement(root, "testsuite", name="gpurig run", tests=str(len(views)),
                          failures=str(sum(v.state != "succeeded" for v in views)), errors="0", skipped="0")
    for v in views:
        case = ET.SubElement(suite, "testcase", classname=xml_text(f"{v.host}.run"), name=xml_text(f"{v.name} ({v.id})"),
                             time=f"{v.runtime_s or 0:.3f}")
        text = f"command: {' '.join(v.argv)}\nstate: {v.state_text}\nexit code: {v.exit_status}\nattempts: {len(v.attempts)}"
        if v.state == "succeeded":
            ET.SubElement(case, "system-out").text = xml_text(text)
        else:
            failure = ET.SubElement(case, "failure", message=xml_text(v.state_text), type=v.state)
            failure.text = xml_text(text + f"\nlogs: gpurig logs --job {v.id}")
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
