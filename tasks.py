"""Invoke entry point: ``invoke --list`` shows gpurig's tasks, ``invoke TASK`` is ``gpurig TASK``. Thin: the tasks live in the gpurig package.

`gpurig init` copies this file into every new project.
"""

import sys
from pathlib import Path

from gpurig.cli import build_collection

ns = build_collection(sys.argv)  # only the modules of the tasks named: `invoke facts` does not import docker-py
# `invoke` finds this file from any subdirectory; the project is where it lies.
ns.configure({"root": str(Path(__file__).resolve().parent)})
