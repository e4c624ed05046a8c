"""The Invoke collection behind ``invoke`` (tasks.py) and the ``gpurig`` console script.

Each module here is thin: parse flags, call the library, present. The
``task`` decorator they share lives in ``gpurig.cli.base`` so that no
library module and no task module imports this package (no import cycle).
"""

from __future__ import annotations

import sys

from invoke import Collection, Program

from gpurig import __version__


def build_collection() -> Collection:
    """All of gpurig's tasks in one flat namespace (``invoke render``, ``invoke facts``...)."""
    from gpurig.cli import hosts, images, monitor

    ns = Collection()
    for module in (images, hosts, monitor):
        for name in module.__all__:
            ns.add_task(getattr(module, name))
    ns.configure({"gpurig": {"root": "."}})
    return ns


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``gpurig`` console script."""
    program = Program(namespace=build_collection(), name="gpurig", binary="gpurig", version=__version__)
    program.run(argv if argv is not None else sys.argv)
