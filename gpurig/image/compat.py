"""The version facts (torch x CUDA wheels, CUDA x driver, Python x torch and base) and the rules over them.

Each table is data, one row per release, so that supporting a new torch or CUDA
release is a one-line change. Sources are named per table; the rows come from
../shared/reference/gpu-facts.md unless marked otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpurig.errors import CompatError

CPU = "cpu"


@dataclass(frozen=True)
class TorchRelease:
    """The wheels one torch minor release ships on pip."""

    minor: str
    stable_cuda: tuple[str, ...]
    experimental_cuda: tuple[str, ...]
    pypi_cuda: str  # the CUDA build that plain `pip install torch` gets from PyPI
    python_min: str
    python_max: str

    @property
    def cuda(self) -> tuple[str, ...]:
        return self.stable_cuda + self.experimental_cuda


# Source: pytorch/pytorch RELEASE.md "Release Compatibility Matrix" (rows up to
# 2.14) and pytorch.org "previous versions". pypi_cuda is the build PyPI serves;
# for 2.14 it was read from the wheel's own metadata (cuda-toolkit==13.0.3).
TORCH_RELEASES: tuple[TorchRelease, ...] = (
    TorchRelease("2.4", ("11.8", "12.1"), ("12.4",), "12.1", "3.8", "3.12"),
    TorchRelease("2.5", ("11.8", "12.1", "12.4"), (), "12.4", "3.9", "3.12"),
    TorchRelease("2.6", ("11.8", "12.4"), ("12.6",), "12.4", "3.9", "3.13"),
    TorchRelease("2.7", ("11.8", "12.6"), ("12.8",), "12.6", "3.9", "3.13"),
    TorchRelease("2.8", ("12.6", "12.8"), ("12.9",), "12.8", "3.9", "3.13"),
    TorchRelease("2.9", ("12.6", "12.8"), ("13.0",), "12.8", "3.10", "3.14"),
    TorchRelease("2.10", ("12.6", "12.8"), ("13.0",), "12.8", "3.10", "3.14"),
    TorchRelease("2.11", ("12.6", "12.8", "13.0"), (), "13.0", "3.10", "3.14"),
    TorchRelease("2.12", ("12.6", "13.0"), ("13.2",), "13.0", "3.10", "3.14"),
    TorchRelease("2.13", ("12.6", "13.0"), ("13.2",), "13.0", "3.10", "3.15"),
    TorchRelease("2.14", ("12.6", "13.0", "13.2"), (), "13.0", "3.10", "3.15"),
)


@dataclass(frozen=True)
class CudaRelease:
    """The driver a CUDA toolkit release needs."""

    cuda: str
    min_driver: str  # full feature set (what NVIDIA_REQUIRE_CUDA enforces)
    compat_driver: str  # minor-version compatibility floor of its major release


# Source: NVIDIA CUDA Toolkit Release Notes, "CUDA Toolkit and Corresponding
# Driver Versions" (GA rows); minor-version compatibility floors from the same page.
# CUDA 13.2 (torch 2.12+) has no row yet: an image for it is refused until its
# driver minimum is added from those release notes.
CUDA_RELEASES: tuple[CudaRelease, ...] = (
    CudaRelease("11.8", "520.61.05", "450.80.02"),
    CudaRelease("12.0", "525.60.13", "525.60.13"),
    CudaRelease("12.1", "530.30.02", "525.60.13"),
    CudaRelease("12.2", "535.54.03", "525.60.13"),
    CudaRelease("12.4", "550.54.14", "525.60.13"),
    CudaRelease("12.6", "560.28.03", "525.60.13"),
    CudaRelease("12.8", "570.26", "525.60.13"),
    CudaRelease("12.9", "575.51.03", "525.60.13"),
    CudaRelease("13.0", "580.65.06", "580.65.06"),
)


# The Python that a base image's own package manager installs (python3).
# Source: Debian and Ubuntu package archives.
DISTRO_PYTHON: dict[str, str] = {
    "debian:bullseye": "3.9",
    "debian:bookworm": "3.11",
    "debian:trixie": "3.13",
    "ubuntu:20.04": "3.8",
    "ubuntu:22.04": "3.10",
    "ubuntu:24.04": "3.12",
}


def version_key(version: str) -> tuple[int, ...]:
    """'570.124.06' -> (570, 124, 6), for comparing dotted versions numerically."""
    return tuple(int(part) for part in version.split("."))


def torch_minor(torch_version: str) -> str:
    return ".".join(torch_version.split(".")[:2])


def torch_release(torch_version: str) -> TorchRelease:
    minor = torch_minor(torch_version)
    for row in TORCH_RELEASES:
        if row.minor == minor:
            return row
    known = ", ".join(row.minor for row in TORCH_RELEASES)
    raise CompatError(
        f"torch {torch_version} is not in gpurig's compatibility table",
        f"use one of torch {known}, or add its row to gpurig/image/compat.py TORCH_RELEASES",
    )


def cuda_release(cuda: str) -> CudaRelease:
    for row in CUDA_RELEASES:
        if row.cuda == cuda:
            return row
    known = ", ".join(row.cuda for row in CUDA_RELEASES)
    raise CompatError(
        f"CUDA {cuda} is not in gpurig's driver table",
        f"use one of CUDA {known}, or add its row to gpurig/image/compat.py CUDA_RELEASES",
    )


def check_torch_cuda(torch_version: str, cuda: str) -> TorchRelease:
    """The torch release, if a wheel exists for this CUDA (or CPU); CompatError naming the valid CUDAs if not."""
    release = torch_release(torch_version)
    if cuda != CPU and cuda not in release.cuda:
        raise CompatError(
            f"torch {torch_version} has no wheel for CUDA {cuda}",
            f"torch {release.minor} ships CUDA {', '.join(release.cuda)} (or cpu)",
        )
    if cuda != CPU:
        cuda_release(cuda)
    return release


def check_python(torch_version: str, python: str) -> None:
    release = torch_release(torch_version)
    if not version_key(release.python_min) <= version_key(python) <= version_key(release.python_max):
        raise CompatError(
            f"torch {torch_version} has no wheel for Python {python}",
            f"torch {release.minor} supports Python {release.python_min} to {release.python_max}",
        )


def base_python(base_image: str) -> str | None:
    """The python3 a known base image installs, or None for a base gpurig does not know."""
    repo, _, tag = base_image.rpartition("/")[2].partition(":")
    # debian:bookworm-slim and debian:bookworm-20240101 are still bookworm
    codename = tag.split("-")[0] if tag else ""
    return DISTRO_PYTHON.get(f"{repo}:{codename}")


def min_driver(cuda: str) -> str | None:
    """The minimum Linux driver for an image built on this CUDA; None for a CPU image."""
    return None if cuda == CPU else cuda_release(cuda).min_driver


def require_cuda(cuda: str) -> str | None:
    """The NVIDIA_REQUIRE_CUDA constraint the container toolkit enforces at `docker run`."""
    return None if cuda == CPU else f"cuda>={cuda}"


def driver_key(version: str) -> tuple[int, ...]:
    """The numbers of a driver version as the kernel module, nvidia-smi or a package gives it:
    '570.133.20' -> (570, 133, 20), '1:535.247.01-1~deb12u1' -> (535, 247, 1); () when it has none."""
    # ASCII digits only (re's \d takes any script's) and at most nine a part: int() of a 5,000-digit part raised ValueError
    m = re.match(r"(?:[0-9]{1,9}:)?([0-9]{1,9}(?:\.[0-9]{1,9})*)(?![0-9.])", version.strip())
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def driver_at_least(driver: str, minimum: str) -> bool:
    """The one comparison of a host driver with a minimum (the table's, or an image's io.gpurig.min-driver label)."""
    return driver_key(driver) >= driver_key(minimum)


def driver_supports(driver: str, cuda: str) -> bool:
    """Whether a host driver runs images of this CUDA with their full feature set."""
    floor = min_driver(cuda)
    return floor is None or driver_at_least(driver, floor)


def cuda_tag(cuda: str) -> str:
    """'12.8' -> 'cu128', 'cpu' -> 'cpu': the tag PyTorch's wheel indexes use."""
    return CPU if cuda == CPU else "cu" + cuda.replace(".", "")
