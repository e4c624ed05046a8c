"""The Invoke collection behind ``invoke`` (tasks.py) and the ``gpurig`` console script."""

from __future__ import annotations

import functools
import sys

from invoke import Collection, Program
from invoke import task as invoke_task
from invoke.exceptions import Exit

from gpurig import __version__
from gpurig.errors import GpurigError


def task(*args, **kwargs):
    """``invoke.task`` whose GpurigErrors become one line on stderr and a non-zero exit.

    Used as ``@task`` or ``@task(help={...})``, exactly like Invoke's own.
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

        return invoke_task(wrapper, **kwargs)

    if len(args) == 1 and callable(args[0]) and not kwargs:
        return decorate(args[0])
    return decorate


def build_collection() -> Collection:
    """All of gpurig's tasks in one flat namespace (``invoke render``, ``invoke facts``...)."""
    from gpurig import host_tasks, image_tasks

    ns = Collection()
    for module in (image_tasks, host_tasks):
        for name in module.__all__:
            ns.add_task(getattr(module, name))
    ns.configure({"gpurig": {"root": "."}})
    return ns


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``gpurig`` console script."""
    program = Program(namespace=build_collection(), name="gpurig", binary="gpurig", version=__version__)
    program.run(argv if argv is not None else sys.argv)
