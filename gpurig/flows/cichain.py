"""The CI chain: build -> deploy -> verify -> run -> collect on one host, stopping at the first stage that fails, with its reason.

Each stage is the library's own work for the task a person runs (``build``,
``deploy``, ``verify --container``, ``run --container --wait``), with the
same output, and writes its JSON report (and verify's and run's JUnit) into
the reports folder. A stage that fails stops the chain: one line names the
stage, its first reason and the stages not run, and the chain ends with the
stage's exit code (the script's own when ``run`` is the one). An interrupt
during ``run`` cancels the job when ``cancel`` says so (``gpurig ci``'s
default), so no job outlives the pipeline that made it.

``gpurig ci`` checks its flags, picks the host and its container, and calls
``run_chain``; Python drives it the same way, with a ``CiRun``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpurig.errors import ConfigError, Finished, GpurigError
from gpurig.flows.fleettask import HostOptions
from gpurig.report import err_console, outside, silence_broken_pipe
from gpurig.strict.validate import printable

if TYPE_CHECKING:
    from gpurig.deploy.containers import ContainerSpec
    from gpurig.image.spec import ImageSpec
    from gpurig.inventory import Host

STAGES = ("build", "deploy", "verify", "run", "collect")
SKIPPABLE = STAGES[:3]


def skipped_stages(skip: str | None) -> list[str]:
    """The stages ``--skip`` leaves out (comma-separated); only build, deploy and verify may be."""
    skipped = [s.strip() for s in (skip or "").split(",") if s.strip()]
    for s in skipped:
        if s not in SKIPPABLE:
            raise ConfigError(f"--skip {s!r} is not a stage that may be left out", f"use {', '.join(SKIPPABLE)}")
    return skipped


@dataclass(frozen=True)
class CiRun:
    """One chain's inputs, checked: the host flags, the host, the project's image spec and root, the job's command and container."""

    opts: HostOptions
    host: Host
    image_spec: ImageSpec
    root: Path  # the project: its build-contexts/ and reports/
    argv: tuple[str, ...]  # the job's command
    container: ContainerSpec  # the deployed container the job runs in (gpurig.jobs.placement.container_for)
    variant: str = "slim"
    skipped: Sequence[str] = ()
    level: str = "quick"  # verify's
    artifacts: Sequence[str] | None = None
    workdir: str | None = None
    timeout: str | None = None
    env: Sequence[str] | None = None
    cancel: bool = True  # an interrupt during run cancels the job


Stage = tuple[str, Callable[[], None], "Path | None"]


def stages(run: CiRun, out: Path) -> list[Stage]:
    """(name, the stage's work, its JSON report) for build, deploy, verify and run, each writing its reports into ``out``."""
    from gpurig.flows.fleetdeploy import deploy_fleet
    from gpurig.flows.fleetverify import verify_fleet
    from gpurig.flows.imagebuild import build_images
    from gpurig.flows.jobrun import run_job
    from gpurig.jobs.request import run_request
    from gpurig.verify.gate import make_plan

    entry = run.container.entry
    name = run.container.name

    def opts(report: str) -> HostOptions:
        # each stage as its task runs with only the host flags: its own --json, a table, no check, diff or sudo prompt
        return dataclasses.replace(run.opts, check=False, diff=False, json=str(out / report), format="table", ask_sudo_password=False)

    def verify() -> None:
        verify_fleet(opts("verify.json"), [run.host], make_plan(name, None, run.level), junit=str(out / "verify.xml"))

    def job() -> None:
        request, _ = run_request(run.argv, container=name, artifacts=run.artifacts, workdir=run.workdir, timeout=run.timeout, env=run.env,
                                 wait=True, junit=str(out / "run.xml"), cancel_on_interrupt=run.cancel)
        run_job(opts("run.json"), run.host, request, load_spec=lambda: run.image_spec, wait=True, junit=str(out / "run.xml"), into=None,
                cancel=run.cancel)

    return [
        ("build", lambda: build_images(run.image_spec, run.root, variant=run.variant, torch=entry.torch if entry else None,
                                       cuda=entry.cuda if entry else None), None),
        ("deploy", lambda: deploy_fleet(opts("deploy.json"), [run.host], run.image_spec, variant=run.variant), out / "deploy.json"),
        ("verify", verify, out / "verify.json"),
        ("run", job, out / "run.json"),
    ]


def run_chain(run: CiRun, out: Path, *, keep_reports: bool) -> None:
    """Each stage not skipped in turn, its start, end and time on stderr; at the first that fails, the line that says where and why,
    and Finished with its code; else the collect line (the job's artifacts, the reports when ``keep_reports``)."""
    for name, stage, report in stages(run, out):
        if name in run.skipped:
            err_console.print(f"ci: {name} skipped (--skip)", highlight=False)
            continue
        started = time.monotonic()
        err_console.print(f"ci: {name} ...", highlight=False)
        code = run_stage(stage)
        took = time.monotonic() - started
        if code:
            rest = STAGES[STAGES.index(name) + 1:]
            why = first_reason(report) if report else ""
            err_console.print(f"[bold red]ci: stopped at {name} (exit {code}{f': {outside(why)}' if why else ''}); not run: {', '.join(rest)}[/]",
                              highlight=False)
            raise Finished(code)
        err_console.print(f"ci: {name} ok ({took:.0f}s)", highlight=False)
    job = json.loads((out / "run.json").read_text()).get("job") or {}
    collected = job.get("artifacts") or {}
    said = [f"artifacts in {collected['into']}"] if collected else []
    said += [f"reports in {out}"] if keep_reports else []
    err_console.print(f"ci: collect ok{' (' + '; '.join(said) + ')' if said else ''}", highlight=False)


def run_stage(stage: Callable[[], None]) -> int:
    """A stage's exit code: 0, or what it ended with, after the one line it ends with as its task alone would (gpurig's error
    line, the interrupt's, what became of the job)."""
    try:
        stage()
        sys.stdout.flush()
    except Finished as stop:
        said, code = stop.message, stop.code
    except GpurigError as err:
        said, code = f"gpurig: {printable(str(err))}", err.exit_code
    except KeyboardInterrupt as stop:  # Terminated (a runner's SIGTERM) carries its code; Ctrl-C's is 130
        code = int(getattr(stop, "exit_code", 130))
        said = "gpurig: terminated (SIGTERM)" if code == 143 else "gpurig: interrupted"
    except BrokenPipeError:
        silence_broken_pipe()
        said, code = None, 141
    else:
        return 0
    if said:
        err_console.print(outside(str(said)), highlight=False)
    return code


def first_reason(report: Path) -> str:
    """The first failing host's (or container's) reason in a stage's JSON report; run's job's own words when it ended badly."""
    try:
        doc = json.loads(report.read_text())
    except (OSError, ValueError):
        return ""
    job = doc.get("job") or {}
    if job.get("state") in ("failed", "cancelled"):
        return f"job {job.get('id')} {job['state']}" + (f" ({job['reason']})" if job.get("reason") else "")
    for h in doc.get("hosts") or ():
        for c in h.get("containers") or ():
            if c.get("status") == "failed" and c.get("reason"):
                return f"{h.get('host')}: {c.get('name')}: {c['reason']}"
        if h.get("status") not in ("ok", "changed") and h.get("reason"):
            return f"{h.get('host')}: {h['reason']}"
    if job.get("state") and job.get("state") != "succeeded":
        return f"job {job.get('id')} {job.get('state')}" + (f" ({job['reason']})" if job.get("reason") else "")
    return ""
