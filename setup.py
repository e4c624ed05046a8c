"""Build hook: the wheel carries the project skeleton as gpurig/skeleton/, so `gpurig init` works from a pip install.

The skeleton is copied from the checkout's top-level images/, templates/,
checks/, inventory/, .hadolint.yaml and tasks.py at build time: git holds them once.
Everything else about the package is in pyproject.toml.
"""

import runpy
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
_skeleton = runpy.run_path(str(HERE / "gpurig" / "skeleton.py"))


class BuildWithSkeleton(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's own folders
        target = Path(self.build_lib) / "gpurig" / "skeleton"
        shutil.rmtree(target, ignore_errors=True)  # a build/ left from an earlier build must not go stale
        _skeleton["copy_tree"](HERE, target)


setup(cmdclass={"build_py": BuildWithSkeleton})
