"""Invoke entry point: ``invoke --list`` shows gpurig's tasks, ``invoke TASK`` is ``gpurig TASK``. Thin: the tasks live in the gpurig package.

`gpurig init` copies this file into every new project.
"""

from pathlib import Path

from gpurig.cli import build_collection

ns = build_collection()
# `invoke` finds this file from any subdirectory; the project is where it lies.
ns.configure({"root": str(Path(__file__).resolve().parent)})
