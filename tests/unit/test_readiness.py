"""The facts verdict: what a recorded host lacks for an image's CUDA, from the fixtures alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpurig.facts import parse_facts
from gpurig.facts.readiness import NO_PYTHON3, lacks, verdict

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def facts(name: str):
    return parse_facts((FIXTURES / f"{name}.txt").read_text())


@pytest.mark.parametrize(
    "fixture,expected",
    [
        # driver 535 is older than CUDA 13.0's 580.65.06; Docker with the nvidia runtime is fine
        ("h100-driver535-docker-nvidia", ("driver 535.161.08 < 580.65.06 (CUDA 13.0)",)),
        ("a100-fresh-nouveau", ("nouveau loaded", "no NVIDIA driver (CUDA 13.0 needs >= 580.65.06)", "no Docker")),
        # daemon.json names the nvidia runtime, so a stopped daemon is the only Docker problem
        ("a100-driver550-open-docker-stopped", ("driver 550.54.15 < 580.65.06 (CUDA 13.0)", "Docker stopped")),
        ("debian12-root", ("no NVIDIA GPU",)),
        ("debian12-docker-down", ("no NVIDIA GPU", "Docker stopped")),
        ("debian12-nobody", ("no NVIDIA GPU", "no access to the Docker socket")),
    ],
)
def test_what_each_recorded_host_lacks_for_cuda_13(fixture, expected):
    assert lacks(facts(fixture), "13.0") == expected


def test_a_new_enough_driver_is_ready_and_an_old_one_is_not_for_a_newer_cuda():
    h100 = facts("h100-driver535-docker-nvidia")
    assert verdict(h100, "12.2") == "ready"  # 535.161.08 >= 535.54.03
    assert verdict(h100, "12.4").startswith("driver 535.161.08 < 550.54.14")


def test_a_cpu_image_needs_only_docker():
    assert verdict(facts("debian12-root"), "cpu") == "ready"
    assert lacks(facts("a100-fresh-nouveau"), "cpu") == ("no Docker",)


def test_a_gpu_host_without_the_nvidia_runtime_lacks_it():
    h100 = facts("h100-driver535-docker-nvidia")
    plain = dataclasses.replace(h100, docker=dataclasses.replace(h100.docker, runtimes=("runc",), default_runtime="runc"))
    assert "no nvidia runtime" in lacks(plain, "12.2")


def test_facts_cut_short_are_said_and_not_judged_as_missing_docker():
    found = lacks(facts("h100-cut-short"), "13.0")
    assert found[0].startswith("facts cut short (") and "docker_info" in found[0]
    assert "no Docker" not in found


def test_a_host_without_python3_is_named_whatever_else_it_lacks():
    # provision once called such a host converged, then verify said "no python3 on the host" and monitor failed it
    assert lacks(facts("debian12-systemd-fresh"), "cpu") == ("no Docker", NO_PYTHON3)
    assert verdict(facts("debian13-systemd-docker"), "cpu") == NO_PYTHON3
    assert NO_PYTHON3 in lacks(facts("debian12-container-fresh"), "13.0")
    assert verdict(facts("debian12-root"), "cpu") == "ready"  # python3 3.11.2 there
    assert NO_PYTHON3 not in lacks(facts("h100-cut-short"), "13.0")  # its section never arrived: not judged
