"""`gpurig ci`: build -> deploy -> verify -> run -> collect on the session's loopback host, as a CI job runs it.

The host has stand-in GPUs but no real one and the image's torch is the CPU
build: the chain's stages are the real tasks, so a stage that cannot pass here
(verify, on an image labelled for CUDA) stops the chain with its reason, and
the chain without it runs the job to the end and collects its artifacts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

from .gpuhost import REPO, gpurig
from .test_deploy import HOST_ULIMITS

SCRIPT = "mkdir -p out; echo \"ran on $(cat /etc/hostname 2>/dev/null || echo ?)\" > out/result.txt; echo trained; exit ${1:-0}\n"


def chain(gpurig_cli, cpu_images, inv, tmp_path, *flags, check_rc=0, code="0"):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "train.sh").write_text(SCRIPT)
    proc = gpurig_cli("ci", "-i", str(inv), "--variant", "slim", "--workdir", str(work), "--artifacts", "out", "--reports", str(tmp_path / "reports"),
                      *flags, "--", "sh", "train.sh", code, env={"GPURIG_ROOT": str(cpu_images.project)})
    assert proc.returncode == check_rc, f"gpurig ci exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_the_chain_runs_to_the_end_and_collects(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images, tmp_path):
    cpu_images["slim"]
    inv = deploy_inventory({"gpurig_containers": [{"variant": "slim", "cuda": "cpu", "ulimits": HOST_ULIMITS, "shm_size": "2g"}]})
    proc = chain(gpurig_cli, cpu_images, inv, tmp_path, "--skip", "verify")
    err = proc.stderr
    for line in ("ci: build ok", "ci: deploy ok", "ci: verify skipped (--skip)", "ci: run ok", "ci: collect ok"):
        assert line in err, err[-3000:]
    assert proc.stdout.rstrip().endswith("trained") or "trained\n" in proc.stdout
    job = json.loads((tmp_path / "reports" / "run.json").read_text())["job"]
    assert job["state"] == "succeeded" and job["exit_status"] == 0
    result = tmp_path / "work" / "gpurig-runs" / job["id"] / "out" / "result.txt"
    assert result.read_text().startswith("ran on ")
    assert {p.name for p in (tmp_path / "reports").iterdir()} >= {"deploy.json", "run.json", "run.xml"}
    assert clean_deploy_host.inspect("gpurig-slim")["State"]["Running"]  # the deployed container the job ran in stays up


def test_the_chain_stops_at_the_first_broken_stage_with_its_reason(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images, tmp_path):
    cpu_images["slim"]
    inv = deploy_inventory({"gpurig_containers": [{"variant": "slim", "cuda": "cpu", "ulimits": HOST_ULIMITS, "shm_size": "2g"}]})
    failed = chain(gpurig_cli, cpu_images, inv, tmp_path, "--skip", "verify", check_rc=4, code="4")
    assert "ci: stopped at run (exit 4: job " in failed.stderr and "failed (exited 4)); not run: collect" in failed.stderr
    missing = {"source": "/nonexistent/data", "target": "/data", "read_only": True}
    broken = deploy_inventory({"gpurig_containers": [{"variant": "slim", "cuda": "cpu", "shm_size": "2g", "volumes": [missing],
                                                      "ulimits": HOST_ULIMITS}]})
    stopped = chain(gpurig_cli, cpu_images, broken, tmp_path, check_rc=1)
    assert "ci: build ok" in stopped.stderr and "ci: stopped at deploy (exit 1: " in stopped.stderr, stopped.stderr[-3000:]
    assert "/nonexistent/data" in stopped.stderr and "not run: verify, run, collect" in stopped.stderr


def test_a_runners_sigterm_during_the_run_stage_cancels_the_job(deploy_inventory, clean_deploy_host, cpu_images, tmp_path):
    cpu_images["slim"]
    inv = deploy_inventory({"gpurig_containers": [{"variant": "slim", "cuda": "cpu", "ulimits": HOST_ULIMITS, "shm_size": "2g"}]})
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.sh").write_text("echo started; while [ ! -e release ]; do sleep 0.1; done\n")
    env = {**os.environ, "HOME": str(tmp_path), "COLUMNS": "200", "PYTHONPATH": str(REPO), "GPURIG_ROOT": str(cpu_images.project)}
    env.pop("SSH_AUTH_SOCK", None)
    code = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
    ci = subprocess.Popen([sys.executable, "-c", code, "ci", "-i", str(inv), "--variant", "slim", "--skip", "verify", "--workdir", str(work),
                           "--", "sh", "train.sh"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in ci.stdout:  # build and deploy first; the job's log comes on stdout once run follows it
            if line == "started\n":
                break
        else:
            raise AssertionError(f"the job never started: {ci.communicate(timeout=60)[1][-3000:]}")
        ci.send_signal(signal.SIGTERM)  # what a CI runner sends when the pipeline is cancelled
        _, err = ci.communicate(timeout=180)
        assert ci.returncode == 143, err[-3000:]
        found = re.search(r"cancelled job ([a-f0-9]{8}) \(cancelled\)", err)
        assert found and "goes on" not in err and "run again" not in err, err[-3000:]
        assert f"ci: stopped at run (exit 143: job {found.group(1)} cancelled" in err, err[-3000:]
        listed = gpurig(tmp_path, "jobs", "-i", str(inv), "--job", found.group(1), "--json", "-")
        assert [j["state"] for j in json.loads(listed.stdout)["jobs"]] == ["cancelled"], listed.stderr[-2000:]
    finally:
        if ci.poll() is None:
            ci.kill()
            ci.wait()
        clean_deploy_host.sh("systemctl stop 'gpurig-job-*' 2>/dev/null; pkill -f '[j]ob_agent.py supervise' 2>/dev/null; "
                             "rm -rf /srv/gpurig/jobs; true", check=False)
