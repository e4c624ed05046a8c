"""What every task module shares: the ``task`` decorator and the project root."""

from __future__ import annotations

import functools
from pathlib import Path

from invoke import Task
from invoke import task as invoke_task
from invoke.exceptions import Exit

from gpurig.errors import GpurigError


def task(*args, **kwargs):
    """``invoke.task`` whose GpurigErrors become one line on stderr and a non-zero exit.

    Used as ``@task``, ``@task(help={...})`` or ``@task(other_task, ...)``
    (positional arguments are ``pre`` tasks), exactly like Invoke's own.
    """

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(c, *a, **kw):
            try:
                return fn(c, *a, **kw)
            except GpurigError as err:
                raise Exit(f"gpurig: {err}", code=err.exit_code) from None
            except KeyboardInterrupt:
                raise Exit("gpurig: interrupted", code=130) from None

        return invoke_task(*args, **kwargs)(wrapper) if args else invoke_task(wrapper, **kwargs)

    if len(args) == 1 and callable(args[0]) and not isinstance(args[0], Task) and not kwargs:
        fn, args = args[0], ()
        return decorate(fn)
    return decorate


def project_root(c) -> Path:
    """The project gpurig acts on (where tasks.py lies, or the configured root)."""
    return Path(c.config.get("gpurig", {}).get("root", ".")).resolve()
