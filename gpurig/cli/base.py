"""What every task module shares: the ``task`` decorator and the project root."""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Argument, Task
from invoke import task as invoke_task
from invoke.exceptions import Exit, ParseError

from gpurig.config import PROJECT_MARKERS, root_of
from gpurig.errors import Finished, GpurigError, SpecError
from gpurig.report import configure_logging, silence_broken_pipe
from gpurig.strict.validate import excerpt, printable, whole_number

if TYPE_CHECKING:
    from gpurig.image.spec import ImageSpec

# Ansible's short flags, given explicitly: Invoke's automatic ones would make -h mean --host, not help.
SHORT_FLAGS = {"inventory": "i", "limit": "l", "forks": "f", "verbose": "v"}
# Invoke's parser gives a positional argument still waiting for its value whatever comes next, these too.
HELP_WORDS = ("--help", "-h")


class Count(int):
    """The kind of a counted flag (-v, -vv): Invoke's help writes no value after it, as none is taken (-v INT was refused)."""


class WholeNumberArgument(Argument):
    """An Invoke flag whose default is a number: its value read by gpurig's grammar, a bad one a one-line usage error.

    Invoke casts with int(), which raises on '²' (str.isdigit() is true) or
    '1e999' and so printed a traceback.
    """

    def set_value(self, value, cast: bool = True) -> None:
        if cast and self.kind is int and not self.incrementable and not isinstance(value, int):
            text = str(value)
            number = whole_number(text.removeprefix("-"))
            if number is None:
                flag = f"--{self.name.replace('_', '-')}" if self.name else "a flag"
                raise ParseError(f"gpurig: {flag} {excerpt(text)} is not a whole number; fix: give {flag} a number such as 100")
            value, cast = (-number if text.startswith("-") else number), False
        super().set_value(value, cast=cast)


def whole_number_flags(arguments: list[Argument]) -> list[Argument]:
    """``arguments`` with each numeric flag read by WholeNumberArgument (same state, stricter cast)."""
    for argument in arguments:
        if argument.kind is int and argument.incrementable:
            argument.kind = Count  # counted by the parser (+1 per -v); only its help reads the kind
        elif argument.kind is int and type(argument) is Argument:
            argument.__class__ = WholeNumberArgument
    return arguments


class GpurigTask(Task):
    """An Invoke task that also knows gpurig's fixed short flags (-i -l -f -v), its numeric flags read by gpurig's grammar."""

    def get_arguments(self, *args, **kwargs) -> list[Argument]:
        # Invoke pops each flag's help as it reads it: made twice (a task's own --help), the flags would have none.
        kept = self.__dict__.setdefault("_all_help", dict(self.help))
        self.help = dict(kept)
        return whole_number_flags(super().get_arguments(*args, **kwargs))

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        short = SHORT_FLAGS.get(name)
        if short and short not in opts["names"] and short not in taken_names:
            opts["names"] = [*opts["names"], short]
        return opts


def task(*args, **kwargs):
    """``invoke.task`` whose GpurigErrors become one line on stderr and a non-zero exit.

    Used as ``@task`` or ``@task(help={...})``, exactly like Invoke's own
    (positional ``pre`` tasks too). Logging is set up from ``-v`` (the SSH library
    stays silent below -vv), and a closed stdout (``| head``) ends quietly.
    """

    def decorate(fn):
        made: Any

        @functools.wraps(fn)
        def wrapper(c, *a, **kw):
            if any(kw.get(name) in HELP_WORDS for name in made.positional):
                # `gpurig logs --help`: Invoke handed --help to NAME; help is printed and nothing else is done
                print_task_help(made)
                return None
            configure_logging(kw.get("verbose") or 0)
            try:
                with terminate_as_exception():
                    result = fn(c, *a, **kw)
                sys.stdout.flush()  # inside the try: a reader gone before the buffer was written is a BrokenPipeError here
                return result
            except Finished as end:
                raise Exit(end.message or None, code=end.code) from None
            except GpurigError as err:
                # the line may quote a file, a flag or a host's answer: shown, never obeyed by the terminal
                raise Exit(f"gpurig: {printable(str(err))}", code=err.exit_code) from None
            except KeyboardInterrupt as stop:
                # Terminated, or a fleet run it interrupted, carries SIGTERM's code; Ctrl-C's is 130
                code = getattr(stop, "exit_code", 128 + signal.SIGINT)
                raise Exit("gpurig: terminated (SIGTERM)" if code == Terminated.exit_code else "gpurig: interrupted", code=code) from None
            except BrokenPipeError:
                silence_broken_pipe()
                raise Exit(code=141) from None

        kwargs.setdefault("klass", GpurigTask)
        made = invoke_task(wrapper, **kwargs)  # invoke.task is typed as returning a Callable; it returns the Task
        return made

    if len(args) == 1 and callable(args[0]) and not isinstance(args[0], Task) and not kwargs:
        return decorate(args[0])
    if args:
        # @task(other_task, ...): positional pre-tasks, as Invoke's own decorator takes them
        kwargs["pre"] = [*args, *kwargs.get("pre", ())]
    return decorate


def print_task_help(made: Task) -> None:
    """The task's --help, exactly as Invoke prints it for `gpurig --help TASK` / `invoke --help TASK`."""
    from invoke import Collection, Program
    from invoke.parser import Parser

    name = made.name.replace("_", "-")
    ns = Collection()
    ns.add_task(made, name=name)
    called = os.path.basename(sys.argv[0] if sys.argv else "")
    program = Program(namespace=ns, binary="gpurig" if called == "gpurig" else "inv[oke]")
    program.collection = ns
    program.parser = Parser(contexts=ns.to_contexts())
    program.print_task_help(name)


# The argv the program was run with (GpurigProgram records it; under Invoke's own program, sys.argv is it).
PROGRAM_ARGV: list[str] = []


def remainder_argv(c) -> tuple[str, ...]:
    """The words after ``--`` as the shell gave them: Invoke joins its remainder with spaces, which loses "a b" and ''.

    Taken from the program's own argv when it agrees with Invoke's remainder;
    else (a remainder given some other way) split as a shell would.
    """
    import shlex

    text = c.remainder or ""
    raw = PROGRAM_ARGV or sys.argv
    if "--" in raw:
        words = raw[raw.index("--") + 1:]
        if " ".join(words) == text:
            return tuple(words)
    return tuple(shlex.split(text)) if text.strip() else ()


def project_root(c) -> Path:
    """The project gpurig acts on: the configured root, else found from the working directory upwards."""
    return root_of(c.config) or Path.cwd()



def project_spec_files(c) -> list[Path]:
    """The spec files of the project's images/; outside any project, a SpecError saying to `gpurig init` one first."""
    from gpurig.image.spec import find_specs

    if root_of(c.config) is None:
        *first, last = (m + "/" if m == "images" else m for m in PROJECT_MARKERS)
        markers = f"{', '.join(first)} or {last}"
        raise SpecError(f"not in a gpurig project: {Path.cwd()} and the folders above it have no {markers}",
                        "start one with `gpurig init DIR` and run from DIR, or give an image spec with --spec FILE")
    return find_specs(project_root(c) / "images")


def load_project_spec(c, spec: str | None) -> ImageSpec:
    """--spec FILE, or the one spec in images/."""
    from gpurig.image.spec import load_spec

    if spec:
        return load_spec(spec)
    files = project_spec_files(c)
    if len(files) > 1:
        names = ", ".join(str(f) for f in files)
        raise SpecError(f"several image specs in images/ ({names})", "pick one with --spec FILE")
    return load_spec(files[0])


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a CI runner's cancel), raised where the task is, like Ctrl-C's KeyboardInterrupt.

    So every ``finally`` and ``with`` on the way out runs: a ``docker build``
    child is stopped, temporary folders are removed, half-written files go.
    """

    exit_code = 128 + signal.SIGTERM


@contextmanager
def terminate_as_exception():
    """SIGTERM raises Terminated in the main thread for the duration; a second one waits for the cleanup."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup the first one started must not be cut short
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def dry_run(c) -> bool:
    """Invoke's core --dry flag: --check for tasks that change hosts."""
    return bool(c.config.get("run", {}).get("dry"))


def refuse_dry(c, what: str, fix: str) -> None:
    """A task with no check mode says so under --dry instead of acting."""
    if dry_run(c):
        raise GpurigError(f"--dry: {what} has no check mode and was not run", fix)
