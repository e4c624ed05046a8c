"""What every task module shares: the ``task`` decorator and the project root."""

from __future__ import annotations

import functools
from pathlib import Path

from invoke import Task
from invoke import task as invoke_task
from invoke.exceptions import Exit

from gpurig.config import root_of
from gpurig.errors import GpurigError
from gpurig.report import configure_logging, silence_broken_pipe

# Ansible's short flags, given explicitly: Invoke's automatic ones would make -h mean --host, not help.
SHORT_FLAGS = {"inventory": "i", "limit": "l", "forks": "f", "verbose": "v"}


class GpurigTask(Task):
    """An Invoke task that also knows gpurig's fixed short flags (-i -l -f -v)."""

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        short = SHORT_FLAGS.get(name)
        if short and short not in opts["names"] and short not in taken_names:
            opts["names"] = [*opts["names"], short]
        return opts


def task(*args, **kwargs):
    """``invoke.task`` whose GpurigErrors become one line on stderr and a non-zero exit.

    Used as ``@task`` or ``@task(help={...})``, exactly like Invoke's own
    (positional ``pre`` tasks too). Logging is set up from ``-v`` (paramiko
    stays silent below -vv), and a closed stdout (``| head``) ends quietly.
    """

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(c, *a, **kw):
            configure_logging(kw.get("verbose") or 0)
            try:
                return fn(c, *a, **kw)
            except GpurigError as err:
                raise Exit(f"gpurig: {err}", code=err.exit_code) from None
            except KeyboardInterrupt:
                raise Exit("gpurig: interrupted", code=130) from None
            except BrokenPipeError:
                silence_broken_pipe()
                raise Exit(code=141) from None

        kwargs.setdefault("klass", GpurigTask)
        return invoke_task(wrapper, **kwargs)

    if len(args) == 1 and callable(args[0]) and not isinstance(args[0], Task) and not kwargs:
        return decorate(args[0])
    if args:
        # @task(other_task, ...): positional pre-tasks, as Invoke's own decorator takes them
        kwargs["pre"] = [*args, *kwargs.get("pre", ())]
    return decorate


def project_root(c) -> Path:
    """The project gpurig acts on: the configured root, else found from the working directory upwards."""
    return root_of(c.config) or Path.cwd()
