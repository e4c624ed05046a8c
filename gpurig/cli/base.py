"""What every task module shares: the ``task`` decorator and the project root."""

from __future__ import annotations

import functools
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

from invoke import task as invoke_task
from invoke.exceptions import Exit

from gpurig.errors import GpurigError


def task(*args, **kwargs):
    """``invoke.task`` whose GpurigErrors become one line on stderr and a non-zero exit.

    Used as ``@task`` or ``@task(help={...})``, exactly like Invoke's own.
    """

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(c, *a, **kw):
            try:
                with terminate_as_exception():
                    return fn(c, *a, **kw)
            except GpurigError as err:
                raise Exit(f"gpurig: {err}", code=err.exit_code) from None
            except Terminated:
                raise Exit("gpurig: terminated (SIGTERM)", code=128 + signal.SIGTERM) from None
            except KeyboardInterrupt:
                raise Exit("gpurig: interrupted", code=130) from None

        return invoke_task(wrapper, **kwargs)

    if len(args) == 1 and callable(args[0]) and not kwargs:
        return decorate(args[0])
    return decorate


def project_root(c) -> Path:
    """The project gpurig acts on (where tasks.py lies, or the configured root)."""
    return Path(c.config.get("gpurig", {}).get("root", ".")).resolve()


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a CI runner's cancel), raised where the task is, like Ctrl-C's KeyboardInterrupt.

    So every ``finally`` and ``with`` on the way out runs: a ``docker build``
    child is stopped, temporary folders are removed, half-written files go.
    """


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
