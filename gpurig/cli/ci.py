"""The ``ci`` task: build -> deploy -> verify -> run -> collect on one host, stopping at the first stage that fails, with its reason.

What a CI job wires by hand ("pull the image, start a container, push the
script, run it, evaluate") as one task. Thin: check the flags, pick the one
host and the container the job runs in, then ``gpurig.flows.cichain``
runs the stages, each the library's work for the task a person runs
(``build``, ``deploy``, ``verify --container``, ``run --container --wait``)
with the same output, and writes their JSON reports (and verify's and run's
JUnit) into ``--reports DIR``. A stage that fails stops the chain: one line
names the stage, its first reason and the stages not run, and the task exits
with the stage's code (the script's own exit code when ``run`` is the one).
A CI runner's cancel (SIGTERM) or Ctrl-C during ``run`` cancels the job
(``run --cancel-on-interrupt``), so no job outlives the pipeline that made it;
``--no-cancel-on-interrupt`` leaves it running instead.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from gpurig.cli.base import dry_run, load_project_spec, project_root, remainder_argv
from gpurig.cli.options import host_task, select_hosts
from gpurig.errors import ConfigError, InventoryError

if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions

__all__ = ["ci"]

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
    from gpurig.flows.cichain import CiRun, run_chain, skipped_stages
    from gpurig.jobs.placement import container_for

    if dry_run(c):
        raise ConfigError("--dry: ci has no check mode", "run its stages with --check: gpurig deploy --check, gpurig run --check")
    skipped = skipped_stages(skip)
    chosen = select_hosts(opts)
    if len(chosen) != 1:
        raise InventoryError(f"ci runs its job on one host; the selection picks {len(chosen)}", "narrow it with -l HOST")
    argv = remainder_argv(c)
    if not argv:
        raise ConfigError("no command given", "gpurig ci -l HOST -- python train.py")
    image_spec = load_project_spec(c, spec)
    container = container_for(chosen[0], image_spec, variant, opts.settings.inventory)
    run = CiRun(opts, chosen[0], image_spec, project_root(c), argv, container, variant=variant, skipped=skipped, level=level,
                artifacts=artifacts, workdir=workdir, timeout=timeout, env=env, cancel=bool(cancel_on_interrupt))
    with tempfile.TemporaryDirectory(prefix="gpurig-ci-") as scratch:  # the stages' reports when --reports names no folder
        out = Path(reports) if reports else Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        run_chain(run, out, keep_reports=bool(reports))
