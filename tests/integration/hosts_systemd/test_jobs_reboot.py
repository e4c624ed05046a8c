"""A host that reboots under a running job: the job is `failed (host rebooted)`, never `running` forever.

A fresh Debian 12 systemd host gets Docker and python3 from `gpurig provision`,
a few-MB image made in its own engine, and a job that sleeps; the host is
then killed like a power cut and booted again (its /run starts empty, as a
real boot's does). `gpurig jobs` must then say what happened to the job.
"""

from __future__ import annotations

import json
import time

from deploy.gpuhost import JOB_BINARIES, PROVISION_VARS, gpurig, make_probe_image
from systemd_kit import inventory_for

IMAGE = "gpurig-test-jobs:1"


def test_a_job_whose_host_rebooted_is_failed_with_that_reason(systemd_hosts, provision_cli, tmp_path):
    host = systemd_hosts.make("debian12", storage="volume")
    inventory = inventory_for(tmp_path / "inventory" / "hosts.yaml", host, PROVISION_VARS)
    done = provision_cli(inventory, "--only", "docker,python3")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    make_probe_image(host, IMAGE, JOB_BINARIES)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "long.sh").write_text("echo started; sleep 600\n")
    run = gpurig(tmp_path, "run", "-i", str(inventory), "--image", IMAGE, "--gpus", "none", "--ulimit", "memlock=8388608",
                 "--workdir", str(tmp_path / "work"), "--json", "-", "--", "sh", "long.sh")
    assert run.returncode == 0, run.stderr[-3000:]
    ident = json.loads(run.stdout)["job"]["id"]

    def job() -> dict:
        listed = gpurig(tmp_path, "jobs", "-i", str(inventory), "--json", "-")
        assert listed.returncode == 0, listed.stderr[-2000:]
        [found] = json.loads(listed.stdout)["jobs"]
        assert found["id"] == ident
        return found

    end = time.monotonic() + 120
    while job()["state"] != "running":
        assert time.monotonic() < end, f"the job never started: {job()}"
        time.sleep(0.5)  # polling the host's state with a deadline
    host.docker("kill", host.cid)  # a power cut: nothing on the host gets to write anything
    host = systemd_hosts.restart(host)
    inventory_for(inventory, host, PROVISION_VARS)  # its SSH port may have changed
    after = job()
    assert after["state"] == "failed" and after["reason"] == "host rebooted", after
    table = gpurig(tmp_path, "jobs", "-i", str(inventory))
    assert "failed (host rebooted)" in table.stdout
