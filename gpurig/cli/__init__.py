"""The Invoke collection behind ``invoke`` (tasks.py) and the ``gpurig`` console script.

A task module parses flags, calls the library and presents what it
returns; some present a good deal (tables, diffs, access lines, progress).
What several tasks share sits in two modules beside them, the only ones a
task module imports of this package: the ``task`` decorator and the
project's spec in ``gpurig.cli.base``, the host flags in
``gpurig.cli.options``. The run over the fleet (gpurig.flows.fleettask),
the work of build, deploy, verify and run and the CI chain of them
(gpurig.flows), a run's job target (gpurig.jobs.placement), Slurm's side
of run and jobs (gpurig.slurm.scheduler), a rollout's verify gate
(gpurig.verify.gate) are library code. No library module imports this
package (no import cycle).

Start-up is what a person pays on every command they type: only the task
modules a command line names are imported (``TASK_MODULES``), and a task
module imports gpurig's library inside its task bodies, not at its top
(names it needs for annotations only under ``TYPE_CHECKING``). Reading a
task's flags, ``--help`` included, then costs Invoke and little more;
tests/unit/test_startup.py holds every task module to that.
"""

from __future__ import annotations

import os
import re
import sys

from invoke import Collection, Program

from gpurig import __version__
from gpurig.cli.base import whole_number_flags
from gpurig.config import GpurigConfig, find_project_root
from gpurig.report import configure_logging, flush_stdout, silence_broken_pipe

# Which module of this package holds each task. Only the tasks a command line names are imported (`gpurig facts`
# loads gpurig.cli.hosts, not docker-py for deploy's sake); tests/unit/test_startup.py keeps this map whole.
TASK_MODULES = {
    "init": "project",
    "matrix": "images", "render": "images", "lint": "images", "build": "images", "images": "images",
    "outdated": "updates", "promote": "updates",
    "hosts": "hosts", "facts": "hosts", "exec": "hosts",
    "inventory": "inventory",
    "provision": "provision",
    "deploy": "deploy", "status": "deploy", "logs": "jobqueue", "stop": "deploy", "rm": "deploy",
    "verify": "verify",
    "rollout": "rollout",
    "monitor": "monitor", "dashboard": "dashboard",
    "run": "run", "jobs": "jobqueue", "attach": "jobqueue", "cancel": "jobqueue", "fetch": "jobqueue",
    "ci": "ci",
    "usage": "usage",
}
# Words people type for something that is not a task of its own, and where it lives.
ELSEWHERE = {
    "sync": "syncing is part of `gpurig run HOST -- CMD`: it syncs --workdir (default .) to the host before the job starts",
}
# Invoke's ways to ask about every task (listing, completion): they get the whole collection.
_WHOLE = ("--list", "--complete", "--print-completion-script")


def task_modules(argv: list[str] | None) -> list[str]:
    """The task modules a command line needs: those of the tasks it names, else all (a listing, an unknown word)."""
    everything = list(dict.fromkeys(TASK_MODULES.values()))
    words = list(argv or ())[1:]
    if any(word in _WHOLE or word.startswith("--list=") for word in words):
        return everything
    # A flag's value that happens to be a task's name only costs that module's import.
    named = [TASK_MODULES[word] for word in words if word in TASK_MODULES]
    if not named:
        return [] if words and all(word in ("--version", "-V") for word in words) else everything
    return list(dict.fromkeys(named))


def build_collection(argv: list[str] | None = None) -> Collection:
    """gpurig's tasks in one flat namespace (``invoke render``, ``invoke facts``...): all of them, or those ``argv`` needs."""
    import importlib

    ns = Collection()
    for name in task_modules(argv):
        module = importlib.import_module(f"gpurig.cli.{name}")
        for task_name in module.__all__:
            ns.add_task(getattr(module, task_name))
    return ns


def unknown_word_hint(word: str, tasks) -> str:
    """Where a word with a home elsewhere lives, or the task it is close to, or nothing."""
    from gpurig.errors import did_you_mean

    return f" ({ELSEWHERE[word]})" if word in ELSEWHERE else did_you_mean(word, tasks)


class GpurigProgram(Program):
    """Invoke's Program reading gpurig.yaml files and GPURIG_* variables, from any directory of a project."""

    def run(self, argv=None, exit: bool = True) -> None:
        from gpurig.cli import base

        base.PROGRAM_ARGV[:] = argv.split() if isinstance(argv, str) else list(argv if argv is not None else sys.argv)
        super().run(argv, exit)

    def parse_tasks(self) -> None:
        """Invoke's parse; a word that is no task also hears the task it resembles, or where what it names lives."""
        from invoke.exceptions import ParseError

        try:
            super().parse_tasks()
        except ParseError as e:
            found = re.fullmatch(r"No idea what '(.*)' is!", str(e))
            if not found:
                raise
            raise ParseError(f"{e}{unknown_word_hint(found.group(1), self.collection.task_names)}") from None

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
    argv = argv if argv is not None else sys.argv
    program = GpurigProgram(
        namespace=build_collection(argv), name="gpurig", binary="gpurig", version=__version__, config_class=GpurigConfig
    )
    try:
        program.run(argv)
    except BrokenPipeError:
        silence_broken_pipe()
        sys.exit(141)
    finally:
        flush_stdout()  # --help and small outputs are still buffered when the reader has gone
