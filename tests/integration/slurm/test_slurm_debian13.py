"""Debian 13's Slurm (24.11) as the second version: the same `gpurig provision` makes its cluster, a job's exit code comes back.

24.11 differs where gpurig reads it: squeue --json's job_state is a list and
exit_code an object, and slurmd starts at install time without a config
(gpurig holds service starts back while it installs).
"""

from __future__ import annotations

import json

import pytest
from deploy.gpuhost import gpurig

from .test_slurm import IMAGE, VARS, run_job, steps_of

SBATCH = {**VARS, "gpurig_slurm": {**VARS["gpurig_slurm"], "rest": False}}  # this cluster submits through sbatch over SSH


@pytest.fixture(scope="module")
def trixie(slurm_kit, tmp_path_factory):
    cluster = slurm_kit.make("debian13")
    try:
        work = tmp_path_factory.mktemp("slurm-debian13")
        yield cluster, cluster.write(work / "inventory" / "hosts.yaml", SBATCH), work
    finally:
        slurm_kit.remove(cluster)


def test_debian13s_slurm_is_provisioned_and_runs_a_job(trixie):
    hosts, inv, work = trixie
    for node in hosts.nodes:
        hosts.replay_probe(node)
    first = gpurig(work, "provision", "-i", str(inv), "--only", "docker,python3,slurm", "--json", "-", timeout=1200)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-3000:]
    assert hosts.ssh(hosts.nodes[0], "/usr/sbin/slurmd -V").stdout.split()[-1].startswith("24.")
    again = steps_of(json.loads(gpurig(work, "provision", "-i", str(inv), "--only", "docker,python3,slurm", "--json", "-", timeout=900).stdout))
    assert all(status == "ok" for steps in again.values() for status in steps.values()), again
    hosts.make_job_image(IMAGE)
    proc = run_job(work, inv, "--gpus", "1", "--env", "CODE=4", "--wait", "--", "sh", "show.sh")
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "rank 0 of 1" in proc.stdout and "(through sbatch)" in proc.stderr
