"""The ``ci`` task: build -> deploy -> verify -> run -> collect on one host, stopping at the first stage that fails, with its reason.

What a CI job wires by hand ("pull the image, start a container, push the
script, run it, evaluate") as one task: each stage is the task a person runs
(``build``, ``deploy``, ``verify --container``, ``run --container --wait``),
with the same output, and writes its JSON report (and verify's and run's
JUnit) into ``--reports DIR``. A stage that fails stops the chain: one line
names the stage, its first reason and the stages not run, and the task exits
with the stage's code (the script's own exit code when ``run`` is the one).
A CI runner's cancel (SIGTERM) or Ctrl-C during ``run`` cancels the job
(``run --cancel-on-interrupt``), so no job outlives the pipeline that made it;
``--no-cancel-on-interrupt`` leaves it running instead.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from invoke.exceptions import Exit

from gpurig.cli.base import dry_run, load_project_spec
from gpurig.cli.options import host_task, select_hosts
from gpurig.errors import ConfigError, InventoryError
from gpurig.report import err_console, outside

if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions

__all__ = ["ci"]

STAGES = ("build", "deploy", "verify", "run", "collect")
CI_HELP = {
    "variant": "the variant to build, deploy and run the job in (default slim)",
    "skip": "stages to leave out, comma-separated (build, deploy, verify): e.g. verify on a host with no GPU to verify",
    "level": "verify's level: quick (default) or full",
    "artifacts": "a path in the working directory to collect when the job ends (repeatable)",
    "workdir": "the folder synced to the host for the job (default: .)",
    "timeout": "stop the job when it runs longer: 90, 30m, 2h",
    "env": "NAME=VALUE for the job's environment (repeatable)",
    "reports": "write each stage's JSON report (and verify's and run's JUnit XML) into this folder",
    "spec": "image spec file (default: the one in images/)",
    "cancel_on_interrupt": "when ci is interrupted (Ctrl-C, a runner's SIGTERM) during run, cancel the job (default; "
                           "--no-cancel-on-interrupt leaves it running)",
}


@host_task(help=CI_HELP, iterable=["artifacts", "env"])
def ci(c, opts: HostOptions, variant="slim", skip=None, level="quick", artifacts=None, workdir=None, timeout=None, env=None, reports=None,
       spec=None, cancel_on_interrupt=True):
    """For CI: build -> deploy -> verify -> run (waiting) -> collect on one host; stops at the first failing stage, with its reason."""
    if dry_run(c):
        raise ConfigError("--dry: ci has no check mode", "run its stages with --check: gpurig deploy --check, gpurig run --check")
    skipped = [s.strip() for s in (skip or "").split(",") if s.strip()]
    for s in skipped:
        if s not in STAGES[:3]:
            raise ConfigError(f"--skip {s!r} is not a stage that may be left out", f"use {', '.join(STAGES[:3])}")
    chosen = select_hosts(opts)
    if len(chosen) != 1:
        raise InventoryError(f"ci runs its job on one host; the selection picks {len(chosen)}", "narrow it with -l HOST")
    from gpurig.cli.base import remainder_argv
    from gpurig.jobs.placement import container_for

    if not remainder_argv(c):
        raise ConfigError("no command given", "gpurig ci -l HOST -- python train.py")
    image_spec = load_project_spec(c, spec)
    container = container_for(chosen[0], image_spec, variant, opts.settings.inventory)
    with tempfile.TemporaryDirectory(prefix="gpurig-ci-") as scratch:  # the stages' reports when --reports names no folder
        out = Path(reports) if reports else Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        chain(c, opts, container, out, variant=variant, spec=spec, skipped=skipped, level=level, artifacts=artifacts, workdir=workdir,
              timeout=timeout, env=env, keep_reports=bool(reports), cancel=bool(cancel_on_interrupt))


def chain(c, opts: HostOptions, container, out: Path, *, variant: str, spec, skipped: list[str], level: str, artifacts, workdir, timeout, env,
          keep_reports: bool, cancel: bool = True) -> None:
    from gpurig.cli import deploy as deploy_task
    from gpurig.cli import images, run, verify

    host = host_flags(opts)
    entry = container.entry
    steps = [
        ("build", lambda: images.build(c, variant=variant, torch=entry.torch if entry else None, cuda=entry.cuda if entry else None, spec=spec),
         None),
        ("deploy", lambda: deploy_task.deploy(c, variant=variant, spec=spec, **host, json=str(out / "deploy.json")), out / "deploy.json"),
        ("verify", lambda: verify.verify(c, container=container.name, level=level, junit=str(out / "verify.xml"), **host,
                                         json=str(out / "verify.json")), out / "verify.json"),
        ("run", lambda: run.run(c, container=container.name, wait=True, cancel_on_interrupt=cancel, artifacts=artifacts, workdir=workdir,
                                timeout=timeout, env=env, junit=str(out / "run.xml"), **host, json=str(out / "run.json")), out / "run.json"),
    ]
    for name, stage, report in steps:
        if name in skipped:
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
            raise Exit(code=code)
        err_console.print(f"ci: {name} ok ({took:.0f}s)", highlight=False)
    job = json.loads((out / "run.json").read_text()).get("job") or {}
    collected = job.get("artifacts") or {}
    said = [f"artifacts in {collected['into']}"] if collected else []
    said += [f"reports in {out}"] if keep_reports else []
    err_console.print(f"ci: collect ok{' (' + '; '.join(said) + ')' if said else ''}", highlight=False)


def run_stage(stage) -> int:
    """A stage's exit code: 0, or what the task exited with (its one line already said why, as the task says it alone)."""
    try:
        stage()
    except Exit as stop:
        if stop.message:
            err_console.print(outside(str(stop.message)), highlight=False)
        return 1 if stop.code is None else int(stop.code)
    return 0


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


def host_flags(opts: HostOptions) -> dict:
    """The host flags this run was given, for the stages' tasks (each reads them as its own)."""
    s = opts.settings
    return {"inventory": str(s.inventory), "limit": list(opts.limit), "forks": s.forks, "connect_timeout": s.connect_timeout,
            "host_key_policy": s.host_key_policy, "verbose": opts.verbose}
