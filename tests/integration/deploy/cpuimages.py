"""The CPU images deploy tests and bench/bench_deploy.py move around, built through `gpurig build` as users build them.

The spec, the torch version and the wheelhouse lookup are those of
tests/integration/images/conftest.py, loaded from that file (not copied).
A project here links this checkout's templates and copies checks/, so a
test can edit a probe and rebuild: only the checks layer changes.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .gpuhost import REPO, gpurig


def _load_images_conftest():
    path = Path(__file__).resolve().parents[1] / "images" / "conftest.py"
    spec = importlib.util.spec_from_file_location("gpurig_tests_images_conftest", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


images_kit = _load_images_conftest()


@dataclass
class CpuImages:
    """The CPU images of a test spec, each built once through `gpurig build` when first asked for: images["slim"] -> ref."""

    project: Path
    spec_name: str
    label: str
    refs: dict = field(default_factory=dict)
    built: list = field(default_factory=list)  # every tag made, removed at the end
    base: str = ""  # the Debian base image the spec builds on
    wheels: str = ""  # the wheelhouse holding the CPU torch wheel
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __getitem__(self, variant: str) -> str:
        with self._lock:
            if variant not in self.refs:
                self.refs[variant] = self.build(self.project, variant)
            return self.refs[variant]

    def build(self, project: Path, variant: str, cuda: str = "cpu") -> str:
        """`gpurig build` of ``variant`` in ``project``; its ref. ``cuda`` other than cpu builds the spec's CUDA entry."""
        proc = gpurig(project, "build", "--variant", variant, "--cuda", cuda, "--label", self.label, timeout=3600)
        assert proc.returncode == 0, f"gpurig build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
        spec = (project / "images" / "pytorch.yaml").read_text().split("\n", 1)[0].split(":", 1)[1].strip()
        if cuda == "cpu":
            torch, cuda_tag = images_kit.CPU_TORCH, "cpu"
        else:
            torch, cuda_tag = images_kit.CUDA_TORCH, "cu" + cuda.replace(".", "")
        ref = f"{spec}:{torch}-{cuda_tag}-{variant}"
        self.built += [ref, f"{spec}:{variant}-{cuda_tag}"]
        return ref

    def copy_project(self, dest: Path, spec_name: str) -> Path:
        """A copy of the project under another spec name, checks/ copied (editable), templates shared."""
        return make_project(dest, spec_name, self.base, self.wheels)


def make_project(root: Path, spec_name: str, base: str, wheels: str) -> Path:
    """A project: this checkout's templates (linked), a copy of checks/, images/pytorch.yaml with the CPU test spec."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("templates", ".hadolint.yaml"):
        (root / name).symlink_to(REPO / name)
    shutil.copytree(REPO / "checks", root / "checks", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "images").mkdir()
    k = images_kit
    (root / "images" / "pytorch.yaml").write_text(k.SPEC.format(
        name=spec_name, registry="", cpu_torch=k.CPU_TORCH, cuda_torch=k.CUDA_TORCH, cuda=k.CUDA, base=base,
        bootstrap='  bootstrap: {suite: bookworm, mirror: "http://deb.debian.org/debian"}', slim="", wheels=wheels))
    return root


