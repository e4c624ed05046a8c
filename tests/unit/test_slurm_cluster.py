"""The Slurm cluster gpurig writes (slurm.conf, gres.conf, the Prolog and Epilog), the plans of its steps, and Slurm's jobs as gpurig reads them.

slurmd -C and squeue --json are replayed from recordings of real Slurm 22.05
and 24.11 daemons (tests/fixtures/slurm); the cluster itself runs in
tests/integration/slurm.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import types
from pathlib import Path

import pytest

from gpurig.deploy.containers import ContainerSpec
from gpurig.image.spec import MatrixEntry
from gpurig.inventory import Host
from gpurig.inventory.profile import SlurmSettings
from gpurig.jobs.request import RunRequest
from gpurig.slurm import conf, hoststeps, sbatch
from gpurig.slurm.cluster import ClusterHosts, ClusterRun
from gpurig.status import Status
from gpurig.steps.plan import StepResult

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
HARDWARE = conf.parse_slurmd_c((FIXTURES / "slurmd-C.txt").read_text())


def cluster(**settings) -> conf.SlurmCluster:
    nodes = (conf.SlurmNode("n1", "slurm-n1", HARDWARE, (0, 1), "a100", ("a100",)),
             conf.SlurmNode("n2", "slurm-n2", HARDWARE, (0,), None, ("a100", "debug")))
    return conf.SlurmCluster("lab", "slurm-ctl", "ctl", nodes, SlurmSettings(**settings))


def test_slurmd_c_is_read_as_slurm_prints_it():
    assert dict(HARDWARE) == {"CPUs": 2, "Boards": 1, "SocketsPerBoard": 1, "CoresPerSocket": 2, "ThreadsPerCore": 1, "RealMemory": 24105}
    assert conf.parse_slurmd_c("slurmd: error: something\n") is None
    assert conf.parse_slurmd_c("NodeName=x CPUs=two Boards=1\n") is None


def test_the_gres_type_comes_from_the_model():
    assert conf.gpu_type("NVIDIA A100-SXM4-80GB") == "a100"
    assert conf.gpu_type("NVIDIA H100 80GB HBM3") == "h100"
    assert conf.gpu_type("NVIDIA GeForce RTX 4090") == "4090" or conf.gpu_type("NVIDIA GeForce RTX 4090") is None
    assert conf.gpu_type(None) is None


def test_slurm_conf_describes_every_node_and_partition():
    text = conf.slurm_conf(cluster(def_mem_per_cpu=2048, health_interval=30))
    lines = text.splitlines()
    assert "SlurmctldHost=slurm-ctl" in lines and "ClusterName=lab" in lines and "DefMemPerCPU=2048" in lines
    assert "HealthCheckProgram=/usr/local/libexec/gpurig/slurm_health.py" in lines and "HealthCheckInterval=30" in lines
    assert ("NodeName=slurm-n1 CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=23381 Gres=gpu:a100:2 "
            "State=UNKNOWN") in lines
    assert "NodeName=slurm-n2 CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=23381 Gres=gpu:1 State=UNKNOWN" in lines
    assert "PartitionName=a100 Nodes=slurm-n1,slurm-n2 Default=YES MaxTime=INFINITE State=UP" in lines
    assert "PartitionName=debug Nodes=slurm-n2 Default=NO MaxTime=INFINITE State=UP" in lines
    assert conf.gres_conf(cluster()).splitlines()[1:] == ["NodeName=slurm-n1 Name=gpu Type=a100 File=/dev/nvidia0",
                                                           "NodeName=slurm-n1 Name=gpu Type=a100 File=/dev/nvidia1",
                                                           "NodeName=slurm-n2 Name=gpu File=/dev/nvidia0"]


def test_the_controller_gets_the_configs_and_the_nodes_the_scripts_too():
    assert set(conf.files_for(cluster(), "ctl")) == {conf.SLURM_CONF, conf.GRES_CONF, conf.CGROUP_CONF}
    assert set(conf.files_for(cluster(), "n1")) == {conf.SLURM_CONF, conf.GRES_CONF, conf.CGROUP_CONF, conf.PROLOG, conf.EPILOG,
                                                     conf.HEALTH_SETTINGS}
    assert json.loads(conf.files_for(cluster(), "n1")[conf.HEALTH_SETTINGS][0]) == {"expect_gpus": 2}


def test_prolog_and_epilog_keep_the_gpu_to_job_mapping(tmp_path):
    root = tmp_path / "run"
    prolog = conf.PROLOG_SCRIPT.replace("/run/gpurig", str(root))
    epilog = conf.EPILOG_SCRIPT.replace("/run/gpurig", str(root)).replace("command -v docker", "false")
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1001", "SLURM_JOB_GPUS": "0,1"}
    subprocess.run(["sh", "-c", prolog], env=env, check=True)
    subprocess.run(["sh", "-c", prolog], env={**env, "SLURM_JOB_ID": "43", "SLURM_JOB_GPUS": "1"}, check=True)
    assert (root / "slurm-gpus" / "0").read_text() == "42\n" and (root / "slurm-gpus" / "1").read_text() == "42\n43\n"
    assert (root / "slurm-jobs" / "42").read_text() == "user=alice\nuid=1001\n"
    subprocess.run(["sh", "-c", epilog], env=env, check=True)
    assert not (root / "slurm-gpus" / "0").exists() and (root / "slurm-gpus" / "1").read_text() == "43\n"
    assert not (root / "slurm-jobs" / "42").exists()
    subprocess.run(["sh", "-c", prolog], env={**env, "SLURM_JOB_ID": "$(touch x)"}, check=True, cwd=tmp_path)
    assert not (tmp_path / "x").exists() and not (root / "slurm-jobs" / "$(touch x)").exists()


def facts(**over) -> hoststeps.SlurmFacts:
    return hoststeps.SlurmFacts(**{"host": "n1", "hostname": "slurm-n1", **over})


def test_packages_munge_and_files_plan_from_the_facts():
    assert hoststeps.plan_packages(facts(), controller=True).status == Status.CHANGED
    done = {p: "22.05.8" for p in hoststeps.NODE_PACKAGES}
    assert hoststeps.plan_packages(facts(packages=done), controller=False).status == Status.OK
    assert hoststeps.plan_controller_key(facts(munge_key="a" * 64, munge_mark="a" * 64)).status == Status.OK
    assert hoststeps.plan_controller_key(facts(munge_key="a" * 64)).changes[0].summary == "make the cluster's munge key"
    key = "ab" * 128 + "\n"
    plan = hoststeps.plan_node_key(facts(munge_key="c" * 64), hoststeps.key_sha(key), key)
    upload = plan.changes[0].commands[0]
    assert upload.remote == hoststeps.KEY_STAGE and upload.mode == 0o400 and upload.backup is False
    assert key not in json.dumps([c.for_report(True).to_dict(True) for c in plan.changes])  # the key never reaches a report
    assert hoststeps.plan_node_key(facts(munge_key=hoststeps.key_sha(key)), hoststeps.key_sha(key), key).status == Status.OK
    wanted = conf.files_for(cluster(), "n1")
    first = hoststeps.plan_files(facts(), wanted)
    assert first.status == Status.CHANGED and len(first.changes) == len(wanted) and "+ClusterName=lab" in first.changes[0].diff
    assert hoststeps.plan_files(facts(files={p: t for p, (t, _) in wanted.items()}), wanted).status == Status.OK


def test_a_node_or_gres_change_restarts_and_any_other_change_reconfigures():
    wanted = conf.files_for(cluster(), "n1")
    same = {p: t for p, (t, _) in wanted.items()}
    assert not hoststeps.needs_restart(facts(files=same), wanted)
    other_interval = conf.files_for(cluster(health_interval=5), "n1")
    assert not hoststeps.needs_restart(facts(files=same), other_interval)
    bigger = conf.SlurmCluster("lab", "slurm-ctl", "ctl", (conf.SlurmNode("n1", "slurm-n1", HARDWARE, (0, 1, 2), "a100"),), SlurmSettings())
    assert hoststeps.needs_restart(facts(files=same), conf.files_for(bigger, "n1"))
    running = {"munge": (True, True), "slurmctld": (True, True)}
    assert hoststeps.plan_daemons(facts(units=running), True, restart=False, changed=False).status == Status.OK
    assert [str(c) for c in hoststeps.plan_daemons(facts(units=running), True, restart=False, changed=True).changes[0].commands] == ["scontrol reconfigure"]
    assert [str(c) for c in hoststeps.plan_daemons(facts(units=running), True, restart=True, changed=True).changes[0].commands] == [
        "systemctl restart slurmctld"]
    fresh = hoststeps.plan_daemons(facts(), False, restart=False, changed=True)
    assert [str(c) for c in fresh.changes[0].commands] == ["systemctl enable munge", "systemctl start munge", "systemctl enable slurmd",
                                                           "systemctl start slurmd"]


def test_the_cluster_comes_from_the_inventorys_groups(tmp_path):
    from gpurig.errors import InventoryError
    from gpurig.inventory import load_inventory
    from gpurig.slurm.cluster import cluster_hosts

    inv = tmp_path / "hosts.yaml"
    inv.write_text("all:\n  children:\n    slurm_controller:\n      hosts: {ctl: {gpurig_slurm: {cluster: lab}}}\n"
                   "    slurm_nodes:\n      hosts: {n3: {}}\n      children:\n        a100: {hosts: {n1: {}, n2: {}}}\n")
    found = cluster_hosts(load_inventory(inv), inv)
    assert found.controller.name == "ctl" and [h.name for h in found.nodes] == ["n3", "n1", "n2"] or {h.name for h in found.nodes} == {"n1", "n2", "n3"}
    assert found.partitions["n1"] == ("a100",) and found.partitions["n3"] == (conf.DEFAULT_PARTITION,) and found.settings.cluster == "lab"
    inv.write_text("all:\n  children:\n    slurm_nodes:\n      hosts: {n1: {}}\n")
    with pytest.raises(InventoryError, match="slurm_controller holds 0 hosts, a Slurm cluster has one controller"):
        cluster_hosts(load_inventory(inv), inv)
    inv.write_text("all:\n  children:\n    slurm_controller:\n      hosts: {a: {}}\n    slurm_nodes:\n      hosts: {a: {}}\n")
    with pytest.raises(InventoryError, match="both the controller and a node"):
        cluster_hosts(load_inventory(inv), inv)
    inv.write_text("all:\n  hosts: {x: {}}\n")
    assert cluster_hosts(load_inventory(inv), inv) is None
    assert Host  # the type the groups hold


def squeue(name: str, comments: dict[int, str]) -> str:
    doc = json.loads((FIXTURES / name).read_text())
    for job in doc["jobs"]:
        if job["job_id"] in comments:
            job["comment"] = comments[job["job_id"]]
    return json.dumps(doc)


def test_slurms_states_and_exit_codes_as_gpurig_says_them():
    marks = {j: f"gpurig:work-0123456789 python train.py --run {j}" for j in (2, 9, 13, 14, 15)}
    views = {v.id: v for v in sbatch.gpurig_jobs(squeue("squeue-22.05.json", marks), "ctl")}
    assert (views["2"].state, views["2"].exit_status) == ("succeeded", 0)
    assert (views["13"].state, views["13"].exit_code, views["13"].reason) == ("failed", 3, "failed")
    assert (views["14"].state, views["14"].exit_code) == ("failed", 137)  # killed by SIGKILL: 128 + 9
    assert (views["15"].state, views["15"].exit_code) == ("cancelled", 143)
    assert views["15"].state_text == "cancelled"  # Slurm's state_reason "None" is no reason, not "cancelled (None)"
    assert views["9"].state == "failed" and views["9"].reason == "out_of_memory"
    assert views["13"].argv == ("python", "train.py", "--run", "13") and views["13"].raw["batch_host"] == "slurm-n1"
    assert sbatch.gpurig_jobs(squeue("squeue-22.05.json", {}), "ctl") == []  # no comment: not gpurig's
    [new] = sbatch.gpurig_jobs(squeue("squeue-24.11.json", {3: "gpurig:k x"}), "ctl")
    assert (new.state, new.exit_code, new.started_at) == ("failed", 3, 1796162885.0)


def test_the_batch_script_passes_the_command_word_for_word_and_only_the_jobs_gpus():
    spec = ContainerSpec(host="n1", name="gpurig-job-slurm", variant="", image="img:1", entry=None, env=(("TOKEN", "s p$(x)"),))
    request = RunRequest(argv=("python", "train.py", "a b", "$(touch /tmp/pwned)"), workdir=Path("."), name="train")
    script = sbatch.batch_script(request, sbatch.SlurmRequest(nodes=2, gpus_per_node=1), spec, "img:1", "gpurig", "work-01")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gres=gpu:1" in script and "#SBATCH --output=/srv/gpurig/sync/gpurig/work-01/runs/%j.log" in script
    node = shlex.split(script[script.index("\nsrun "):].split("\nran=")[0])[-1]  # srun ... sh -c NODE_SCRIPT
    last = node.splitlines()[-2]  # docker run's line; then the node records its exit code
    assert last.endswith("'img:1' python train.py 'a b' '$(touch /tmp/pwned)'") or last.endswith("img:1 python train.py 'a b' '$(touch /tmp/pwned)'")
    assert "TOKEN" not in last and '--env-file "$envs"' in last and "--label io.gpurig.slurm.job=$SLURM_JOB_ID" in last
    assert "<<'GPURIG_ENV_END'\nTOKEN=s p$(x)\nGPURIG_ENV_END\n)" in script and "TOKEN" not in node  # in srun's environment, never an argv
    with pytest.raises(Exception, match="line break"):
        sbatch.batch_script(request, sbatch.SlurmRequest(), dataclasses.replace(spec, env=(("A", "1\n2"),)), "img:1", "gpurig", "k")
    torch = sbatch.batch_script(request, sbatch.SlurmRequest(nodes=2, launcher="torchrun"), spec, "img:1", "gpurig", "work-01")
    launched = shlex.split(torch[torch.index("\nsrun "):].split("\nran=")[0])[-1].splitlines()[-2]
    assert 'torchrun --nnodes="$SLURM_NNODES" --node_rank="$SLURM_NODEID"' in launched and launched.endswith("train.py 'a b' '$(touch /tmp/pwned)'")
    assert "python train.py" not in launched


def test_gpurigs_images_run_without_a_second_init_and_an_explicit_image_gets_dockers():
    """gpurig's images run tini as PID 1; docker's --init beside it printed a tini warning into every Slurm job's log."""
    request = RunRequest(argv=("python", "train.py"), workdir=Path("."), name="train")
    ours = ContainerSpec(host="n1", name="", variant="slim", image="img:1", entry=MatrixEntry("2.14.1", "13.0"))
    explicit = dataclasses.replace(ours, variant="", entry=None)

    def docker_run(spec: ContainerSpec) -> list[str]:
        script = sbatch.batch_script(request, sbatch.SlurmRequest(), spec, "img:1", "gpurig", "k")
        node = shlex.split(script[script.index("\nsrun "):].split("\nran=")[0])[-1]
        return shlex.split(node.splitlines()[-2].replace("$", ""))

    assert "--init" not in docker_run(ours)
    assert "--init" in docker_run(explicit)


def test_with_rest_the_controller_gets_slurmrestd_behind_jwt_on_its_loopback():
    rest = conf.SlurmCluster("lab", "slurm-ctl", "ctl", cluster().nodes, SlurmSettings(rest=True), (22, 5))
    lines = conf.slurm_conf(rest).splitlines()
    assert "AuthAltTypes=auth/jwt" in lines and f"AuthAltParameters=jwt_key={conf.JWT_KEY}" in lines
    assert "AuthAltTypes=auth/jwt" not in conf.slurm_conf(cluster())
    dropin = conf.files_for(rest, "ctl")[conf.REST_DROPIN][0]
    assert "User=slurmrestd" in dropin and "-s openapi/v0.0.38 " in dropin and "127.0.0.1:6820" in dropin and "0.0.0.0" not in dropin
    assert conf.REST_DROPIN not in conf.files_for(rest, "n1")
    assert "-s openapi/slurmctld " in conf.rest_dropin((24, 11))  # 23.11 renamed the plugins
    assert [conf.rest_api(v) for v in ((22, 5), (23, 11), (24, 11))] == ["v0.0.38", "v0.0.40", "v0.0.42"]
    assert hoststeps.plan_rest(facts()).changes[0].summary == "make slurmctld's JWT key, add the slurmrestd user"
    assert hoststeps.plan_rest(facts(rest=("key", "user"))).status == Status.OK
    installed = {p: "22.05.8" for p in hoststeps.CONTROLLER_PACKAGES}
    assert "slurmrestd slurm-wlm-jwt-plugin" in hoststeps.plan_packages(facts(packages=installed), True, rest=True).changes[0].summary
    assert facts(packages={"slurmctld": "22.05.8-4+deb12u3"}).version == (22, 5)


class Recorded:
    """A RestClient whose requests are kept, not sent."""

    def __init__(self, api):
        from gpurig.slurm.rest import RestClient

        self.client = RestClient(conn=None, user="gpurig", token="t", api=api)
        self.sent = []
        self.client.request = lambda method, path, body=None: self.sent.append((method, path, body)) or {"job_id": 42}


def test_a_rest_submission_says_the_jobs_options_in_its_api_versions_words():
    old, new = Recorded("v0.0.38"), Recorded("v0.0.42")
    for r in (old, new):
        assert r.client.submit("#!/bin/sh\n", name="train", workdir="/w", output="/w/%j.log", nodes=2, gpus_per_node=1, partition="a100",
                               comment="gpurig:k x", minutes=5) == "42"
    [(_, path, body)] = old.sent
    assert path == "/job/submit" and body["script"] == "#!/bin/sh\n"
    assert body["job"]["nodes"] == [2, 2] and body["job"]["tasks"] == 2 and body["job"]["gres"] == "gpu:1"
    assert body["job"]["environment"]["PATH"].startswith("/usr/sbin")
    job = new.sent[0][2]["job"]
    assert job["nodes"] == "2" and job["tres_per_node"] == "gres/gpu:1" and job["time_limit"] == {"set": True, "number": 5}
    assert job["environment"][0].startswith("PATH=") and job["partition"] == "a100" and job["comment"] == "gpurig:k x"


def test_a_cluster_whose_hosts_log_in_as_different_users_names_the_file_each_user_and_its_hosts(tmp_path):
    from gpurig.errors import InventoryError
    from gpurig.slurm.scheduler import the_cluster

    inv = tmp_path / "hosts.yaml"
    inv.write_text("all:\n  children:\n    slurm_controller:\n      hosts: {ctl: {ansible_user: ops}}\n"
                   "    slurm_nodes:\n      hosts: {n1: {ansible_user: alice}, n2: {ansible_user: alice}}\n")
    with pytest.raises(InventoryError) as err:
        the_cluster(inv)
    assert str(inv) in err.value.problem and "alice: n1, n2; ops: ctl" in err.value.problem
    assert "ansible_user" in err.value.fix


def test_a_long_partition_is_cut_in_its_error_line(tmp_path):
    from tests.unit.test_cli import assert_one_line_error, gpurig

    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "hosts.yaml").write_text(
        "all:\n  children:\n    slurm_controller:\n      hosts: {ctl: {}}\n    slurm_nodes:\n      hosts: {n1: {}}\n")
    proc = gpurig(tmp_path, "run", "--scheduler", "slurm", "--partition", "9" * 5000, "--", "true")
    assert_one_line_error(proc, "--partition", "is not a partition name")
    assert len(proc.stderr) < 400, len(proc.stderr)


def cluster_hosts_of_three() -> ClusterHosts:
    hosts = [Host(n, (g,), {}, user="gpurig") for n, g in (("ctl", "slurm_controller"), ("n1", "slurm_nodes"), ("n2", "slurm_nodes"))]
    return ClusterHosts(hosts[0], tuple(hosts[1:]), {"n1": ("gpu",), "n2": ("gpu",)}, SlurmSettings())


def docker_step_adding(user: str) -> StepResult:
    """The docker step's result on a recorded Debian 12 host where ``user`` is not in the docker group (gpurig is)."""
    from gpurig.facts import parse_facts
    from gpurig.inventory.profile import host_profile
    from gpurig.steps.docker import DockerStep

    recorded = parse_facts((FIXTURES.parent / "facts" / "debian12-systemd-docker.txt").read_text())
    plan = DockerStep().plan(recorded, host_profile(Host("n1", ("slurm_nodes",), {"gpurig_docker": {"users": [user]}}), "hosts.yaml"))
    assert [c.summary for c in plan.changes] == [f"add {user} to the docker group"]
    return StepResult("docker", plan.status, plan.reason, plan.changes, 0.2)


def test_a_user_joining_the_docker_group_restarts_the_slurm_daemon_of_that_host():
    running = {"munge": (True, True), "slurmd": (True, True), "slurmctld": (True, True)}
    run = ClusterRun(cluster_hosts_of_three(), None, check=True, diff=False, regrouped=frozenset({"ctl", "n1"}))  # type: ignore[arg-type]
    model = conf.SlurmCluster("lab", "slurm-ctl", "ctl", (conf.SlurmNode("n1", "slurm-n1", HARDWARE, (0,), None, ("gpu",)),
                                                          conf.SlurmNode("n2", "slurm-n2", HARDWARE, (0,), None, ("gpu",))), SlurmSettings())
    said = {}
    for name in ("ctl", "n1", "n2"):
        run.state[name].facts = facts(host=name, units=running)
        run._daemons(None, run.state[name], model)  # type: ignore[arg-type]
        said[name] = [str(c) for ch in run.state[name].results[-1].changes for c in ch.commands]
    assert said == {"ctl": ["systemctl restart slurmctld"], "n1": ["systemctl restart slurmd"], "n2": []}
    assert "docker group" in run.state["n1"].results[-1].reason
    assert hoststeps.plan_daemons(facts(units=running), False, restart=False, changed=False).status == Status.OK  # no join: nothing


def test_the_provision_recap_times_the_whole_run_and_the_cluster_run_learns_who_joined_the_docker_group(monkeypatch):
    from rich.console import Console

    from gpurig.report.fleetrun import print_recap
    from gpurig.results import FleetReport, HostResult
    from gpurig.slurm import cluster as cluster_module

    seen = {}

    class TimedRun:  # the cluster's phases took 30 s (the clock below), each host's slurm-daemons 2 s of it
        def __init__(self, found, connector, *, regrouped=frozenset(), **_):
            seen["regrouped"] = regrouped

        def run(self):
            return {n: [StepResult("slurm-daemons", Status.OK, "running", duration_s=2.0)] for n in ("ctl", "n1", "n2")}

    clock = iter([100.0, 130.0])
    monkeypatch.setattr(cluster_module, "ClusterRun", TimedRun)
    monkeypatch.setattr(cluster_module, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    own = {"ctl": (), "n1": (docker_step_adding("alice"),), "n2": ()}
    report = FleetReport(tuple(HostResult(n, Status.CHANGED if steps else Status.OK, data=steps, duration_s=0.2) for n, steps in own.items()),
                         "2026-12-04T22:00:00Z", 0.6, summary={s: 0 for s in Status})
    done = cluster_module.with_cluster(report, cluster_hosts_of_three(), connect=lambda: types.SimpleNamespace(close=lambda: None),
                                       check=False, diff=False, forks=4)
    assert done.duration_s == pytest.approx(30.6) and [r.duration_s for r in done.results] == pytest.approx([2.2, 2.2, 2.2])
    console = Console(record=True, width=120)
    print_recap(done, console)
    assert "3 hosts in 30.6s" in console.export_text()
    assert seen["regrouped"] == frozenset({"n1"})  # n1's docker step added alice: the cluster run restarts its slurmd
