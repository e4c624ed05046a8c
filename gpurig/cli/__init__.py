"""The Invoke collection behind ``invoke`` (tasks.py) and the ``gpurig`` console script.

Each module here is thin: parse flags, call the library, present. The
``task`` decorator they share lives in ``gpurig.cli.base`` and the host
flags in ``gpurig.cli.options``, so that no library module and no task
module imports this package (no import cycle).
"""

from __future__ import annotations

import os
import sys

from invoke import Collection, Program

from gpurig import __version__
from gpurig.cli.base import whole_number_flags
from gpurig.config import GpurigConfig, find_project_root
from gpurig.report import configure_logging, flush_stdout, silence_broken_pipe


def build_collection() -> Collection:
    """All of gpurig's tasks in one flat namespace (``invoke render``, ``invoke facts``...)."""
    from gpurig.cli import ci, deploy, hosts, images, inventory, jobqueue, monitor, project, provision, rollout, run, updates, verify

    ns = Collection()
    for module in (project, images, updates, hosts, inventory, provision, deploy, verify, rollout, monitor, run, jobqueue, ci):
        for name in module.__all__:
            ns.add_task(getattr(module, name))
    return ns


class GpurigProgram(Program):
    """Invoke's Program reading gpurig.yaml files and GPURIG_* variables, from any directory of a project."""

    def run(self, argv=None, exit: bool = True) -> None:
        from gpurig.cli import base

        base.PROGRAM_ARGV[:] = argv.split() if isinstance(argv, str) else list(argv if argv is not None else sys.argv)
        super().run(argv, exit)

    def core_args(self):
        args = whole_number_flags(super().core_args())
        for arg in args:
            if arg.name == "dry":
                # gpurig runs no local commands through Invoke; --dry means what --check means
                arg.help = "Same as --check: changing tasks only say what they would change."
        return args

    def create_config(self) -> None:
        super().create_config()
        # The project's gpurig.yaml: from $GPURIG_ROOT, else the nearest project directory upwards.
        root = os.environ.get("GPURIG_ROOT") or find_project_root()
        if root:
            self.config.set_project_location(str(root))
            self.config.load_project()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``gpurig`` console script."""
    configure_logging(0)
    program = GpurigProgram(
        namespace=build_collection(), name="gpurig", binary="gpurig", version=__version__, config_class=GpurigConfig
    )
    try:
        program.run(argv if argv is not None else sys.argv)
    except BrokenPipeError:
        silence_broken_pipe()
        sys.exit(141)
    finally:
        flush_stdout()  # --help and small outputs are still buffered when the reader has gone
