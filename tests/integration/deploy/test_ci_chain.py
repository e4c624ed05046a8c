"""`gpurig ci`: build -> deploy -> verify -> run -> collect on the session's loopback host, as a CI job runs it.

The host has stand-in GPUs but no real one and the image's torch is the CPU
build: the chain's stages are the real tasks, so a stage that cannot pass here
(verify, on an image labelled for CUDA) stops the chain with its reason, and
the chain without it runs the job to the end and collects its artifacts.
"""

from __future__ import annotations

import json

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
