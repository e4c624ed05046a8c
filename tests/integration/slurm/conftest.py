"""The Slurm tests' hosts: a fresh controller and two GPU nodes per test module; the pieces live in tests/integration/slurm_kit.py.

``slurm_hosts`` is module-scoped: booting three hosts costs seconds (the
session's systemd image is built once, by ``systemd_images``), provisioning
them costs a minute or more, so the tests of one module share one cluster and
provision it in the order they need (a module's first test sees fresh hosts),
while modules never see each other's changes and no more than three host
containers run at once. Nothing of Slurm, munge or Docker is on them:
``slurm_hosts.write(path, extra_vars)`` gives `gpurig provision` its inventory
(groups slurm_controller and slurm_nodes), ``make_job_image`` a job image once
Docker is there, ``replay_probe(node, dmesg=...)`` recorded outputs for the
health probe that Slurm runs (checks/slurm_health.py). A test that needs a cluster of its own asks ``slurm_kit.make()``
(and ``slurm_kit.remove(cluster)`` when done: it adds three containers). ``torch_image`` is verify's CPU torch image
(tests/integration/verify/conftest.py), for the fabric level through Slurm.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_kit import SlurmKit

from tests.integration.verify.conftest import torch_image  # noqa: F401  (the CPU torch image verify --level fabric runs, once a session)


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def slurm_kit(docker_engine, container_kit, systemd_images, host_key, tmp_path_factory):
    """slurm_kit.SlurmKit: makes clusters of three fresh hosts; every one it made is removed at the session's end."""
    kit = SlurmKit(docker_engine, container_kit, systemd_images, host_key, tmp_path_factory.mktemp("slurm-hosts"))
    try:
        yield kit
    finally:
        kit.remove()


@pytest.fixture(scope="module")
def slurm_hosts(slurm_kit):
    """slurm_kit.SlurmHosts: Debian 12 controller + two nodes with stand-in GPUs, on their own network; removed after the module."""
    cluster = slurm_kit.make("debian12")
    try:
        yield cluster
    finally:
        slurm_kit.remove(cluster)
