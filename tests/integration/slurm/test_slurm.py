"""A real Slurm cluster made by `gpurig provision` from three fresh hosts, then jobs, cancel and health through it, as a user runs them.

One module, one cluster (tests/integration/slurm/conftest.py): the tests run
in order, each on what the ones before made (the first provisions). The
nodes' GPUs are stand-in device files (/dev/nvidia0-1, char 195:N) and a
stand-in nvidia-smi; what Slurm and the containers did is read back through
the test's own SSH and docker exec, not through gpurig.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from deploy.fanoutkit import OPEN_TO_PEERS, address, listening, settle
from deploy.gpuhost import IMAGE_SCRIPT, JOB_BINARIES, gpurig

IMAGE = "gpurig-test-jobs:1"
# Debian 12's cluster submits through slurmrestd (JWT); Debian 13's (test_slurm_debian13.py) through sbatch over SSH
VARS = {"gpurig_docker": {"users": ["gpurig"]}, "gpurig_slurm": {"cluster": "lab", "health_interval": 2, "rest": True}}


@pytest.fixture(scope="module")
def cluster(slurm_hosts, tmp_path_factory):
    """(hosts, inventory, work dir) for the module: the inventory of the three hosts, a folder to run gpurig from."""
    work = tmp_path_factory.mktemp("slurm-cluster")
    return slurm_hosts, slurm_hosts.write(work / "inventory" / "hosts.yaml", VARS), work


class NodeImages:
    """The CPU torch image going into both nodes' engines in the background (1 GB: a minute or more on a busy machine), started
    once provision has put Docker there, so the job tests in between hide it; the fabric tests wait for it."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self, hosts, docker_engine, image: str) -> None:
        def put() -> None:
            try:
                put_image(hosts, docker_engine, image)
            except BaseException as err:  # said by wait(), in the test that needs the image
                self.error = err

        self.thread = threading.Thread(target=put, daemon=True, name="torch-image-to-nodes")
        self.thread.start()

    def wait(self, hosts, docker_engine, image: str) -> None:
        if self.thread is None:  # the fabric tests run alone (-k): nothing started it
            self.start(hosts, docker_engine, image)
        assert self.thread is not None
        self.thread.join(900)
        assert not self.thread.is_alive(), "the torch image took over 15 minutes to reach the nodes"
        if self.error is not None:
            raise self.error


@pytest.fixture(scope="module")
def node_images() -> NodeImages:
    return NodeImages()


def steps_of(doc: dict) -> dict[str, dict[str, str]]:
    return {h["host"]: {s["step"]: s["status"] for s in h["steps"]} for h in doc["hosts"]}


def test_provision_makes_a_working_cluster_and_a_second_run_changes_nothing(cluster, node_images, docker_engine, request):
    hosts, inv, work = cluster
    for node in hosts.nodes:  # gpurig's host probe cannot meet a GPU here: its health program replays recorded outputs
        hosts.replay_probe(node)
    first = gpurig(work, "provision", "-i", str(inv), "--only", "docker,python3,slurm", "--json", "-", timeout=1200)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-3000:]
    done = steps_of(json.loads(first.stdout))
    for name in hosts.names:
        assert {"slurm-packages", "slurm-munge", "slurm-config", "slurm-daemons"} <= set(done[name]), done[name]
        assert done[name]["slurm-config"] == "changed"
    assert done[hosts.controller.name]["slurm-rest"] == "changed"
    info = hosts.ssh(hosts.controller, "sinfo -h -N -o '%N %T %G'").stdout.split("\n")
    assert sorted(line.split()[0] for line in info if line) == sorted(n.name for n in hosts.nodes)
    why = hosts.ssh(hosts.controller, "sinfo -R").stdout
    assert all(line.split()[1] == "idle" and line.split()[2] == "gpu:a100:2" for line in info if line), why
    keys = {h.name: hosts.ssh(h, "sudo sha256sum /etc/munge/munge.key").stdout.split()[0] for h in hosts.hosts}
    assert len(set(keys.values())) == 1, keys  # one key for the cluster
    assert hosts.ssh(hosts.nodes[0], "sudo stat -c '%a %U' /etc/munge/munge.key").stdout.split() == ["400", "munge"]
    key = hosts.ssh(hosts.controller, "sudo cat /etc/munge/munge.key").stdout.strip()
    assert key not in first.stdout + first.stderr  # never in a report or a line a person reads
    second = gpurig(work, "provision", "-i", str(inv), "--only", "docker,python3,slurm", "--json", "-", timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    again = steps_of(json.loads(second.stdout))
    assert all(status == "ok" for steps in again.values() for status in steps.values()), again
    hosts.make_job_image(IMAGE)
    try:  # the fabric tests' torch image, on its way to the nodes while the job tests run
        node_images.start(hosts, docker_engine, request.getfixturevalue("torch_image"))
    except pytest.skip.Exception:
        pass  # no CPU torch wheel here: the fabric tests skip too


def run_job(work: Path, inv: Path, *flags: str, timeout: float = 300, image: str = IMAGE):
    (work / "job").mkdir(exist_ok=True)
    (work / "job" / "show.sh").write_text('for f in /dev/nvidia*; do printf "%s " "${f#/dev/}"; done; echo\n'
                                          'echo "rank $NODE_RANK of $NNODES at $MASTER_ADDR"\nexit ${CODE:-0}\n')
    return gpurig(work, "run", "-i", str(inv), "--scheduler", "slurm", "--image", image, "--ulimit", "memlock=8388608",
                  "--workdir", str(work / "job"), *flags, timeout=timeout)


def test_a_one_gpu_job_sees_only_its_device_and_its_exit_code_comes_back(cluster):
    hosts, inv, work = cluster
    proc = run_job(work, inv, "--gpus", "1", "--env", "CODE=3", "--wait", "--", "sh", "show.sh")
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-3000:]
    first = proc.stdout.splitlines()[0].split()
    devices = [d for d in first if d.startswith("nvidia") and d[6:].isdigit()]
    assert len(devices) == 1, first  # one GPU of the two: the one Slurm gave the job
    assert "rank 0 of 1 at " in proc.stdout and "exit code 3" in proc.stderr
    assert "(through slurmrestd)" in proc.stderr  # gpurig_slurm.rest: the REST daemon with the user's JWT, reached through SSH
    listening = [line.split()[1] for line in hosts.ssh(hosts.controller, "cat /proc/net/tcp").stdout.splitlines()[1:] if line.split()[3] == "0A"]
    assert [a for a in listening if a.endswith(":1AA4")] == ["0100007F:1AA4"]  # slurmrestd on 127.0.0.1:6820 only, never the network


def test_a_memlock_dockerd_cannot_raise_is_refused_before_submitting_naming_the_flag(cluster):
    hosts, inv, work = cluster
    queued = hosts.ssh(hosts.controller, "squeue -h -o %i").stdout
    (work / "job").mkdir(exist_ok=True)
    # the hosts' dockerd runs without CAP_SYS_RESOURCE under a finite memlock: deploy's default (memlock unlimited) cannot start
    proc = gpurig(work, "run", "-i", str(inv), "--scheduler", "slurm", "--image", IMAGE, "--workdir", str(work / "job"), "--", "true")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "memlock unlimited is above dockerd's hard limit" in proc.stderr and "--ulimit memlock=" in proc.stderr, proc.stderr[-2000:]
    assert "gpurig_containers" not in proc.stderr  # run reads no gpurig_containers ulimits: the flag is the fix
    assert hosts.ssh(hosts.controller, "squeue -h -o %i").stdout == queued  # nothing submitted


def test_a_two_node_job_runs_on_both_with_the_rendezvous_from_slurm(cluster):
    hosts, inv, work = cluster
    proc = run_job(work, inv, "--nodes", "2", "--gpus", "1", "--launcher", "none", "--wait", "--", "sh", "show.sh")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    ranks = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    master = sorted(n.name for n in hosts.nodes)[0]
    assert ranks == [f"rank 0 of 2 at {master}", f"rank 1 of 2 at {master}"], proc.stdout


def test_a_jobs_image_built_here_leaves_this_machine_once_and_the_second_node_gets_it_from_the_first(cluster, docker_engine):
    """Issue 37: a Slurm job's nodes pass the image built here on to each other as a deploy's hosts do, each saying from where."""
    hosts, inv, work = cluster
    ref = f"gpurig-slurm-fan-{uuid.uuid4().hex[:8]}:1"
    env = {**os.environ, "PATH": f"{Path(docker_engine.path).parent}:{os.environ.get('PATH', '')}"}
    subprocess.run(["sh", "-s", "--", ref, *JOB_BINARIES], input=IMAGE_SCRIPT, text=True, env=env, check=True, capture_output=True)
    doc = yaml.safe_load(inv.read_text())
    for node in hosts.nodes:  # each reaches the other's sshd on the cluster's network (its ansible_port is published here)
        doc["all"]["children"]["slurm_nodes"]["hosts"][node.name]["gpurig_delivery"] = {"address": address(docker_engine, node.cid), "port": 22}
        node.sh(OPEN_TO_PEERS)
    fan_inv = inv.with_name("fan-out.yaml")
    fan_inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    pairs = [(node, None) for node in hosts.nodes]
    baseline = {node.name: listening(node) for node in hosts.nodes}
    try:
        checked = run_job(work, fan_inv, "--nodes", "2", "--launcher", "none", "--check", "--", "sh", "show.sh", image=ref)
        assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-3000:]
        plan = checked.stderr[checked.stderr.index(f"fan-out of {ref}:"):]  # the plan, as deploy --check shows it; nothing moved
        named = [n.name for n in hosts.nodes if f"\n  {n.name} <- the build machine: sends " in plan]
        assert len(named) == 1 and f" <- {named[0]}: serves " in plan and "for 2 hosts (the image is " in plan, checked.stderr
        assert not [n for n in hosts.nodes if n.sh(f"docker image inspect {ref}", check=False).returncode == 0]
        proc = run_job(work, fan_inv, "--nodes", "2", "--launcher", "none", "--json", str(work / "fan-out.json"), "--wait", "--",
                       "sh", "show.sh", image=ref)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert len([line for line in proc.stdout.splitlines() if line.startswith("rank ")]) == 2, proc.stdout
        [fan] = json.loads((work / "fan-out.json").read_text())["job"]["fan_out"]
        sources = {h: d["source"] for h, d in fan["hosts"].items()}
        first = next(h for h, src in sources.items() if src == "the build machine")
        assert sorted(sources.values()) == sorted(["the build machine", first]), proc.stderr  # the other node pulled from the first
        assert fan["sent"] < 1.1 * fan["size"], fan  # the image left this machine once, not once per node
        assert f"fan-out of {ref}: " in proc.stderr and "out of the build machine for 2 hosts" in proc.stderr, proc.stderr
        assert f"by fan-out from {first}" in proc.stderr, proc.stderr
        assert settle(pairs, baseline) == ({}, {})  # no one-time key, cache, tunnel or listener left on a node
    finally:
        docker_engine("image", "rm", "-f", ref, check=False)
        for node in hosts.nodes:
            node.sh(f"docker image rm -f {ref}", check=False)


def put_image(hosts, docker_engine, image: str) -> None:
    """``image`` into both nodes' own engines at once, as `gpurig deploy` would have put it there: one `docker save` here, its
    stream fed to a `docker load` in each node (a save per node would read the 1 GB image twice)."""
    save = subprocess.Popen([docker_engine.path, "save", image], stdout=subprocess.PIPE)
    loads = [subprocess.Popen([docker_engine.path, "exec", "-i", node.cid, "docker", "load", "-q"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for node in hosts.nodes]
    assert save.stdout is not None
    for chunk in iter(lambda: save.stdout.read(1 << 20), b""):  # type: ignore[union-attr]
        for load in loads:
            load.stdin.write(chunk)  # type: ignore[union-attr]
    assert save.wait() == 0
    for node, load in zip(hosts.nodes, loads):
        said = load.communicate(timeout=600)[0]
        assert load.returncode == 0, f"{node.name}: {said.decode(errors='replace')[-1000:]}"


def fabric_of(report: Path) -> tuple[dict, dict[str, dict]]:
    doc = json.loads(report.read_text())
    [entry] = doc["hosts"]
    return doc, {r["id"]: r for r in entry["data"]["records"]}


def test_the_fabric_level_through_slurm_all_reduces_across_the_nodes_in_one_job(cluster, torch_image, docker_engine, node_images):
    """Issue 38: verify --level fabric --scheduler slurm, a real gloo all-reduce in the CPU torch image, one rank a node."""
    hosts, inv, work = cluster
    node_images.wait(hosts, docker_engine, torch_image)
    report, junit = work / "fabric.json", work / "fabric.xml"
    proc = gpurig(work, "verify", "-i", str(inv), "--level", "fabric", "--image", torch_image, "--scheduler", "slurm",
                  "--json", str(report), "--junit", str(junit), timeout=900)
    doc, got = fabric_of(report)
    nodes = sorted(n.name for n in hosts.nodes)
    assert got["fabric.slurm"]["status"] == "pass", proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"ran on {', '.join(nodes)}; " in got["fabric.slurm"]["detail"] and f"rendezvous {nodes[0]}:29500" in got["fabric.slurm"]["detail"]
    assert doc["ranked"] == nodes and doc["excluded"] == {}
    sized = [r for rid, r in got.items() if rid.startswith("fabric.allreduce.") and rid != "fabric.allreduce.correct"]
    assert len(sized) == 9 and all(r["measured"] > 0 and r["unit"] == "GB/s" for r in sized), sized  # 4 kB .. 256 MB
    assert got["fabric.latency"]["measured"] > 0
    # the facts came through the job: the route to the rendezvous, as the other node resolved the first one's name
    assert got["fabric.rendezvous"]["status"] == "pass" and doc["master"] == hosts.nodes[1].sh(
        f"getent ahostsv4 {nodes[0]} | awk 'NR == 1 {{print $1}}'").stdout.strip()
    assert got["fabric.mtu"]["status"] == "pass" and got["fabric.speed"]["status"] == "pass"
    # these nodes are containers: their eth0 is a veth (10 Gb/s, a container host's own data interface, as over SSH);
    # gloo reduces on the CPU and rarely fills a 10 Gb/s promise, which warns, and then each pair runs as a job of its own
    assert got["fabric.interface"]["status"] == "pass", got["fabric.interface"]
    assert got["fabric.busbw"]["status"] in ("pass", "warn") and ("fabric.culprit" in got) == (got["fabric.busbw"]["status"] == "warn")
    assert not [r for r in got.values() if r["status"] == "fail"], proc.stdout[-3000:]
    assert proc.returncode == 0 and doc["passed"] is True
    assert 'name="fabric (2 hosts)"' in junit.read_text()
    kept = [json.loads(line) for line in (work / ".gpurig" / "history" / "verify.jsonl").read_text().splitlines()]
    assert (kept[-1]["host"], kept[-1]["hosts"], kept[-1]["level"]) == ("*fabric*", nodes, "fabric")
    for node in hosts.nodes:  # nothing left behind: no rank container, no output file
        assert node.sh("docker ps -aq --filter label=io.gpurig.fabric").stdout.strip() == ""
        assert node.sh("ls -A /home/gpurig/.cache/gpurig 2>/dev/null", check=False).stdout.strip() == ""


def test_the_fabric_level_through_slurm_fails_saying_why_when_its_job_cannot_run(cluster, torch_image):
    hosts, inv, work = cluster
    names = ",".join(n.name for n in hosts.nodes)
    report = work / "stuck.json"
    verify = ("verify", "-i", str(inv), "--level", "fabric", "--image", torch_image, "--scheduler", "slurm", "--json", str(report))
    # both nodes held by another job: ours waits (Resources), is cancelled at the bound and the level fails with Slurm's reason
    hold = hosts.ssh(hosts.controller, f"sbatch --parsable --exclusive -N2 -w {names} --wrap 'sleep 300'").stdout.strip()
    try:
        proc = gpurig(work, *verify, "--pending-timeout", "3")
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        doc, got = fabric_of(report)
        said = got["fabric.slurm"]
        assert said["status"] == "fail" and re.fullmatch(r"slurm job \d+ stayed pending for \d+ s \(Resources\) and was cancelled: "
                                                         r"nothing was measured", said["detail"]), said
        assert "--pending-timeout" in said["fix"] and doc["passed"] is False and "is pending: Resources" in proc.stderr
        assert hosts.ssh(hosts.controller, "squeue -h -o %i").stdout.split() == [hold]  # ours is gone, cancelled
    finally:
        hosts.ssh(hosts.controller, f"scancel {hold}")
    # a drained node: no job is queued for the one left, and the drained one is named with the admin's reason
    drained = hosts.nodes[1].name
    hosts.ssh(hosts.controller, f"sudo scontrol update nodename={drained} state=drain reason=fabric-cabling")
    try:
        proc = gpurig(work, *verify)
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        _, got = fabric_of(report)
        assert got["fabric.slurm"]["status"] == "fail" and got["fabric.slurm"]["detail"] == (
            f"partition gpu has 1 of the selected nodes Slurm gives jobs ({hosts.nodes[0].name}): no job was queued")
        assert got["fabric.slurm"]["fix"].startswith("resume the nodes")
        assert got["fabric.slurm.nodes"]["status"] == "warn" and \
            f"{drained}: Slurm gives it no job: drained (fabric-cabling)" in got["fabric.slurm.nodes"]["detail"]
        assert f"{drained} is left out of the fabric job" in proc.stderr
    finally:
        hosts.ssh(hosts.controller, f"sudo scontrol update nodename={drained} state=resume")



def test_a_job_user_outside_the_docker_group_gets_the_rendezvous_and_rank_0s_exit_code_then_provision_regroups_it(cluster):
    """Issue 35: through `sudo -n docker` the rendezvous came empty, a failing rank 0's code came back as the 143 of the rank
    srun stopped, and gpurig_docker.users put the user back in the docker group without slurmd seeing it."""
    hosts, inv, work = cluster

    def job_groups() -> str:  # what Slurm gives the user's jobs (slurmctld looks the groups up on the controller and sends them)
        return hosts.ssh(hosts.controller, "srun -N1 id -Gn").stdout

    for host in hosts.hosts:  # as where the job user never was in the group: the daemons restarted, their cached groups gone
        host.sh("gpasswd -d gpurig docker >/dev/null && systemctl restart slurmctld slurmd 2>/dev/null; true")
    assert "docker" not in job_groups().split()
    (work / "job").mkdir(exist_ok=True)
    (work / "job" / "rank.sh").write_text('echo "rank $NODE_RANK at $MASTER_ADDR:$MASTER_PORT with $TOKEN"\n'
                                          '[ "$NODE_RANK" = 0 ] && exit 4\nexec sleep 120\n')
    proc = run_job(work, inv, "--nodes", "2", "--gpus", "1", "--launcher", "none", "--env", "TOKEN=s p", "--wait", "--", "sh", "rank.sh")
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-3000:]  # rank 0's own code, not rank 1's SIGTERM (143)
    master = sorted(n.name for n in hosts.nodes)[0]
    said = [line for line in proc.stdout.splitlines() if line.startswith("rank 0 ")]
    assert len(said) == 1 and re.fullmatch(rf"rank 0 at {re.escape(master)}:\d+ with s p", said[0]), proc.stdout
    job = re.search(r"slurm job (\d+)", proc.stderr).group(1)  # type: ignore[union-attr]
    listed = json.loads(gpurig(work, "jobs", "-i", str(inv), "--job", job, "--json", "-").stdout)["jobs"][0]
    assert (listed["state"], listed["exit_code"]) == ("failed", 4), listed
    for node in hosts.nodes:
        assert node.sh(f"ls /srv/gpurig/sync/gpurig/*/runs/{job}/ | grep -c '[.]env$'", check=False).stdout.strip() == "0"  # removed
    again = gpurig(work, "provision", "-i", str(inv), "--only", "docker,slurm", "--json", "-", timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    steps = {h["host"]: {s["step"]: s for s in h["steps"]} for h in json.loads(again.stdout)["hosts"]}
    assert "restart slurmctld" in steps[hosts.controller.name]["slurm-daemons"]["reason"], steps[hosts.controller.name]
    for node in hosts.nodes:
        assert "restart slurmd" in steps[node.name]["slurm-daemons"]["reason"], steps[node.name]
    assert "docker" in job_groups().split()  # at once, not after Slurm's GroupUpdateTime (10 minutes)

def test_cancel_ends_a_running_job_and_its_containers_go(cluster):
    hosts, inv, work = cluster
    proc = run_job(work, inv, "--gpus", "1", "--", "sleep", "300")
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = next(w for w in proc.stderr.split() if w.isdigit())
    end = time.monotonic() + 120
    while json.loads(gpurig(work, "jobs", "-i", str(inv), "--job", job, "--json", "-").stdout)["jobs"][0]["state"] != "running":
        assert time.monotonic() < end, "the job never started"
        time.sleep(0.5)  # polling Slurm's state with a deadline
    cancelled = gpurig(work, "cancel", "-i", str(inv), job)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout, cancelled.stderr[-2000:]
    for node in hosts.nodes:
        assert node.sh(f"docker ps -aq --filter label=io.gpurig.slurm.job={job}").stdout.strip() == ""  # the Epilog removed it


def test_a_failing_health_probe_drains_its_node_and_a_passing_one_resumes_it(cluster):
    hosts, inv, work = cluster
    node = hosts.nodes[0]

    def state() -> tuple[str, str]:
        line = hosts.ssh(hosts.controller, f"sinfo -h -n {node.name} -o '%T|%E'").stdout.strip()
        return tuple(line.split("|", 1))  # type: ignore[return-value]

    def until(pred, what):
        end = time.monotonic() + 90
        while not pred(state()):
            assert time.monotonic() < end, f"{what}: {state()}"
            time.sleep(0.5)  # the health program runs every 2 s (gpurig_slurm.health_interval)

    hosts.replay_probe(node, dmesg="dmesg-xid.txt")
    until(lambda s: s[0].startswith("drain") and s[1].startswith("gpurig: "), "never drained")
    verified = gpurig(work, "verify", "-i", str(inv), "-l", node.name, "-v", "--json", "-")
    record = next(r for h in json.loads(verified.stdout)["hosts"] for r in h["data"]["records"] if r["id"] == "slurm.node")
    assert record["status"] == "fail" and "gpurig: " in record["detail"], record
    status = gpurig(work, "status", "-i", str(inv), "-l", node.name)
    assert "(slurm node)" in status.stdout and "drain" in status.stdout
    hosts.replay_probe(node)
    until(lambda s: s[0] in ("idle", "mixed", "allocated"), "never resumed")


def test_a_fully_drained_cluster_fails_provision_and_refuses_jobs_saying_why(cluster):
    hosts, inv, work = cluster
    queued = hosts.ssh(hosts.controller, "squeue -h -o %i").stdout

    def states() -> dict[str, tuple[str, str]]:
        lines = hosts.ssh(hosts.controller, "sinfo -h -N -o '%N|%T|%E'").stdout.splitlines()
        return {n: (s, r) for n, s, r in (line.split("|", 2) for line in lines if line)}

    def until(pred, what):
        end = time.monotonic() + 90
        while not all(pred(*states()[n.name]) for n in hosts.nodes):
            assert time.monotonic() < end, f"{what}: {states()}"
            time.sleep(0.5)  # the health program runs every 2 s (gpurig_slurm.health_interval)

    for node in hosts.nodes:  # no NVIDIA driver answers: host.driver fails and the health program drains the node
        hosts.replay_probe(node, smi="nvidia-smi-no-driver.txt")
    until(lambda s, r: s.startswith("drain") and r.startswith("gpurig: host.driver"), "never drained")
    try:
        done = gpurig(work, "provision", "-i", str(inv), "--only", "slurm", "--json", "-", timeout=600)
        assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
        steps = {h["host"]: {s["step"]: s for s in h["steps"]} for h in json.loads(done.stdout)["hosts"]}
        for node in hosts.nodes:
            step = steps[node.name]["slurm-node"]
            assert step["status"] == "failed" and f"{node.name} no job: drained (gpurig: host.driver" in step["reason"], step
        expected = hosts.write(work / "inventory" / "drained.yaml", {**VARS, "gpurig_slurm_expect_drained": True})
        warned = gpurig(work, "provision", "-i", str(expected), "--only", "slurm", timeout=600)
        assert warned.returncode == 0, warned.stdout[-3000:] + warned.stderr[-3000:]
        assert all(f"warning: {n.name} is drained (gpurig: host.driver" in warned.stderr for n in hosts.nodes), warned.stderr[-2000:]
        refused = run_job(work, inv, "--gpus", "1", "--", "sh", "show.sh")
        assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-3000:]
        line = refused.stderr.strip().splitlines()[-1]
        assert "partition gpu has no node Slurm gives jobs" in line and "fix:" in line, refused.stderr[-2000:]
        assert all(f"{n.name} drained (gpurig: host.driver" in line for n in hosts.nodes), line
        assert hosts.ssh(hosts.controller, "squeue -h -o %i").stdout == queued  # nothing submitted
        # a job queued past gpurig (sbatch by hand) waits: jobs and logs say why
        job = hosts.ssh(hosts.controller, "sbatch --parsable -p gpu --comment='gpurig:by-hand true' --wrap true").stdout.strip()
        try:
            listed = json.loads(gpurig(work, "jobs", "-i", str(inv), "--job", job, "--json", "-").stdout)["jobs"][0]
            assert listed["state"] == "pending" and "partition gpu has no node Slurm gives jobs" in listed["reason"], listed
            logs = gpurig(work, "logs", "-i", str(inv), "--job", job)
            assert logs.returncode == 2 and f"job {job} has not started (pending: " in logs.stderr, logs.stderr[-2000:]
            assert "none of the inventory's nodes" not in logs.stderr
        finally:
            hosts.ssh(hosts.controller, f"scancel {job}")
    finally:
        for node in hosts.nodes:
            hosts.replay_probe(node)
        until(lambda s, r: s in ("idle", "mixed", "allocated"), "never resumed")


def test_a_setting_change_is_shown_first_then_applied_live_with_a_reconfigure(cluster):
    hosts, _, work = cluster
    inv = hosts.write(work / "inventory" / "hosts.yaml", {**VARS, "gpurig_slurm": {**VARS["gpurig_slurm"], "min_job_age": 600}})
    pid = hosts.ssh(hosts.controller, "systemctl show -p MainPID --value slurmctld").stdout.strip()
    plan = gpurig(work, "provision", "-i", str(inv), "--only", "slurm", "--check", "--diff", timeout=600)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "-MinJobAge=300" in plan.stdout and "+MinJobAge=600" in plan.stdout
    assert "MinJobAge=300" in hosts.ssh(hosts.controller, "cat /etc/slurm/slurm.conf").stdout  # check mode changed nothing
    done = gpurig(work, "provision", "-i", str(inv), "--only", "slurm", "--json", "-", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = {h["host"]: {s["step"]: s for s in h["steps"]} for h in json.loads(done.stdout)["hosts"]}
    daemons = steps[hosts.controller.name]["slurm-daemons"]
    assert [c["summary"] for c in daemons["changes"]] == ["scontrol reconfigure"], daemons
    assert hosts.ssh(hosts.controller, "systemctl show -p MainPID --value slurmctld").stdout.strip() == pid  # not restarted
    assert re.search(r"MinJobAge\s*=\s*600\b", hosts.ssh(hosts.controller, "scontrol show config").stdout)
