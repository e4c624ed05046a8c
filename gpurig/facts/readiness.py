"""What a host lacks to run an image, read from its facts: the rules behind the facts table's verdict.

Pure: facts and the image's CUDA in, a tuple of short reasons out (empty
when the host is ready). The driver minimum comes from gpurig/image/compat.py.
"""

from __future__ import annotations

from gpurig.connect.engineinfo import has_nvidia_runtime
from gpurig.facts import Facts
from gpurig.image import compat

# gpurig's own probes (verify's host probe, monitor's sampler) run with the host's python3; provision's python3 step installs it.
NO_PYTHON3 = "no python3 (verify and monitor need it; provision installs it)"


def lacks(facts: Facts, cuda: str) -> tuple[str, ...]:
    """Why a host with ``facts`` cannot run containers of an image built on ``cuda`` ('X.Y' or 'cpu'); () if it can."""
    found: list[str] = []
    if facts.missing:
        # the host went away mid-script: say so rather than judge what never arrived
        found.append(f"facts cut short ({', '.join(facts.missing)} missing)")
    if cuda != compat.CPU:
        found += _gpu_lacks(facts, cuda)
    if "docker_info" in facts.missing:
        return tuple(found)  # cut short there: python3's section, later in the script, never arrived either
    docker = facts.docker
    if not docker.installed:
        found.append("no Docker")
    elif not docker.running:
        found.append("no access to the Docker socket" if docker.denied else "Docker stopped")
    if cuda != compat.CPU and (facts.gpus or facts.pci_gpus) and docker.installed and not has_nvidia_runtime(docker.runtimes):
        found.append("no nvidia runtime")
    if facts.system.python3 is None and "python3" not in facts.missing:
        found.append(NO_PYTHON3)
    return tuple(found)


def _gpu_lacks(facts: Facts, cuda: str) -> list[str]:
    if not facts.gpus and not facts.pci_gpus:
        return ["no NVIDIA GPU"]
    found = []
    if facts.nouveau_loaded:
        found.append("nouveau loaded")
    minimum = compat.min_driver(cuda)
    if not facts.driver_version:
        found.append(f"no NVIDIA driver (CUDA {cuda} needs >= {minimum})")
    elif not compat.driver_supports(facts.driver_version, cuda):
        found.append(f"driver {facts.driver_version} < {minimum} (CUDA {cuda})")
    return found


def verdict(facts: Facts, cuda: str) -> str:
    """'ready', or what the host lacks, joined by '; '."""
    return "; ".join(lacks(facts, cuda)) or "ready"
