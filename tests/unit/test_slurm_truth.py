"""What gpurig says of a Slurm cluster is what the controller says: drained nodes fail provision, refuse jobs, explain waits.

The controller's answers are recorded from real Slurm 22.05 daemons
(tests/fixtures/slurm: sinfo with both nodes drained by gpurig's health
program, and idle; squeue --json with a job waiting on that partition); the
hosts are stand-ins that answer each command with its recording, and keep
every command they were sent.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpurig.connect.engineinfo import EngineInfo, ImageInfo
from gpurig.deploy.containers import ContainerSpec
from gpurig.errors import ConfigError, GpurigError, HostError, InventoryError
from gpurig.inventory import Host
from gpurig.inventory.profile import SlurmSettings
from gpurig.jobs.request import RunRequest
from gpurig.slurm import cluster as slurm_cluster
from gpurig.slurm import conf, sbatch, scheduler
from gpurig.status import Status
from tests.unit.deploy.test_hoststate import OUTPUT as HOST_STATE

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DRAINED = (FIXTURES / "slurm" / "sinfo-drained.txt").read_text()
IDLE = (FIXTURES / "slurm" / "sinfo-idle.txt").read_text()
NODES = sorted({line.split("|")[0] for line in DRAINED.splitlines() if line})  # the recording's NodeNames


class Conn:
    """A host that answers each command with the recording of the first key found in it, and keeps what it was sent."""

    def __init__(self, name: str, answers: dict[str, str], sent: list[str]) -> None:
        self.name, self.answers, self.sent = name, answers, sent

    def run(self, command, timeout=None, warn=False, streams=None):
        line = command if isinstance(command, str) else " ".join(command)
        self.sent.append(f"{self.name}: {line}")
        out = next((text for key, text in self.answers.items() if key in line), "")
        return SimpleNamespace(stdout=out, stderr="", ok=True, failed=False, exited=0)

    admin = run

    def close(self) -> None:
        pass


def hosts(**node_vars) -> slurm_cluster.ClusterHosts:
    nodes = tuple(Host(n, ("slurm_nodes",), dict(node_vars)) for n in NODES)
    return slurm_cluster.ClusterHosts(Host("ctl", ("slurm_controller",), {}), nodes, {n: ("gpu",) for n in NODES}, SlurmSettings())


def settled(sinfo: str, monkeypatch, **node_vars) -> dict[str, dict[str, object]]:
    """Each node's slurm-daemons and slurm-node results after provision's last phase read ``sinfo`` from the controller."""
    monkeypatch.setattr(slurm_cluster, "REGISTER_S", 0.0)
    run = slurm_cluster.ClusterRun(hosts(**node_vars), connector=None, check=False, diff=False)
    model = conf.SlurmCluster("lab", "ctl", "ctl", tuple(conf.SlurmNode(n, n, ()) for n in NODES))
    run._settle(Conn("ctl", {"sinfo": sinfo}, []), run.state["ctl"], model)
    return {n: {r.step: r for r in run.state[n].results} for n in NODES}


def test_provision_fails_each_drained_node_with_slurms_reason(monkeypatch):
    for name, steps in settled(DRAINED, monkeypatch).items():
        step = steps["slurm-node"]
        assert step.status == Status.FAILED, step
        assert step.reason.startswith(f"Slurm gives {name} no job: drained (gpurig: host.driver: "), step.reason
        assert "gpurig verify" in step.fix and "gpurig_slurm_expect_drained" in step.fix
        assert "slurm-daemons" not in steps  # registered: the daemons did their part


def test_a_node_expected_drained_is_a_warning_not_a_failure(monkeypatch):
    for name, steps in settled(DRAINED, monkeypatch, gpurig_slurm_expect_drained=True).items():
        step = steps["slurm-node"]
        assert step.status == Status.OK and step.details["warning"].startswith(f"{name} is drained (gpurig: host.driver"), step
    for steps in settled(IDLE, monkeypatch).values():
        assert steps["slurm-node"].status == Status.OK and steps["slurm-node"].reason == "Slurm gives it jobs (idle)"


def test_a_node_the_controller_does_not_list_is_unknown_and_fails(monkeypatch):
    results = settled(DRAINED.splitlines()[0] + "\n", monkeypatch)
    missing = results[NODES[1]]["slurm-daemons"]
    assert missing.status == Status.FAILED and "unknown to the controller" in missing.reason


def fleet_of(answers: dict[str, str], sent: list[str]):
    """scheduler.fleet run here: each host a Conn; a GpurigError fails that host as the fleet runner does."""
    def fleet(reach, chosen, work):
        results = []
        for h in chosen:
            try:
                results.append(SimpleNamespace(host=h.name, succeeded=True, data=work(Conn(h.name, answers, sent)).data, reason="", fix=""))
            except GpurigError as err:
                results.append(SimpleNamespace(host=h.name, succeeded=False, data=None, reason=err.problem, fix=err.fix))
        return SimpleNamespace(results=results)
    return fleet


def job_target():
    spec = ContainerSpec(host=NODES[0], name="gpurig-job-slurm", variant="", image="img:1", entry=None)
    request = RunRequest(argv=("python", "train.py"), workdir=Path("."), name="train")
    return SimpleNamespace(container=spec, image_ref="img:1", key="work-01", tree=None, deliver=None, fan_out=None, request=request, image=None,
                           matrix_cudas=(), cuda=False), request


def test_run_refuses_a_partition_with_no_usable_node_naming_each_and_submits_nothing(monkeypatch):
    sent: list[str] = []
    monkeypatch.setattr(scheduler, "fleet", fleet_of({"sinfo": DRAINED, "sbatch": "7\n"}, sent))
    target, request = job_target()
    with pytest.raises(ConfigError) as err:
        scheduler.submit(None, hosts(), target, request, sbatch.SlurmRequest())
    assert err.value.problem.startswith("partition gpu has no node Slurm gives jobs: ")
    for name in NODES:
        assert f"{name} drained (gpurig: host.driver: " in err.value.problem
    assert "gpurig verify" in err.value.fix
    assert [line for line in sent if "sinfo" not in line] == []  # no node prepared, nothing queued


def test_usable_nodes_that_are_none_of_the_inventorys_are_refused_not_left_unprepared(monkeypatch):
    sent: list[str] = []
    strangers = IDLE.replace("gpurig-slurm-", "elsewhere-")
    monkeypatch.setattr(scheduler, "fleet", fleet_of({"sinfo": strangers, "hostname": "not-it"}, sent))
    target, request = job_target()
    with pytest.raises(InventoryError) as err:
        scheduler.submit(None, hosts(), target, request, sbatch.SlurmRequest())
    assert "0 nodes matched the inventory's slurm_nodes" in err.value.problem
    assert not [line for line in sent if "sbatch" in line]


class Engine:
    """The node's engine: the image is there, dockerd's runtimes are runc's."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def info(self):
        return EngineInfo("20.10.24+dfsg1", "1.41", ("io.containerd.runc.v2", "runc"), "runc", "/var/lib/docker", 2, 25276502016)

    def image(self, ref):
        return ImageInfo("sha256:" + "0" * 64, (ref,), {}, 4_000_000)


def test_a_slurm_jobs_nodes_get_the_pre_flight_first_and_a_memlock_refusal_names_run_s_flag(monkeypatch):
    from gpurig.facts import parse_facts

    sent: list[str] = []
    synced: list[str] = []
    facts = parse_facts((FIXTURES / "facts" / "debian12-systemd-docker.txt").read_text())
    monkeypatch.setattr(scheduler, "fleet", fleet_of({"sinfo": IDLE, "sh -c": HOST_STATE, "sbatch": "7\n"}, sent))
    monkeypatch.setattr("gpurig.facts.gather_complete", lambda conn: facts)
    monkeypatch.setattr("gpurig.connect.engineopen.open_engine", lambda conn: Engine())
    monkeypatch.setattr("gpurig.jobs.sync.sync", lambda agent, key, tree: synced.append(key))
    target, request = job_target()  # deploy's default ulimits: memlock unlimited, above the recorded dockerd's 8 MiB
    with pytest.raises(HostError) as err:
        scheduler.submit(None, hosts(), target, request, sbatch.SlurmRequest())
    assert "memlock unlimited is above dockerd's hard limit of 8388608 bytes" in err.value.problem
    assert "--ulimit memlock=8388608" in err.value.fix and "gpurig_containers" not in err.value.fix
    assert synced == [] and not [line for line in sent if "sbatch" in line]  # refused before anything moved or was queued


def test_the_ssh_paths_memlock_fix_names_run_s_flag_too():
    from gpurig.deploy.hoststate import parse_host_state
    from gpurig.facts import parse_facts
    from gpurig.jobs.submit import preflight

    target, _ = job_target()
    facts = parse_facts((FIXTURES / "facts" / "debian12-systemd-docker.txt").read_text())
    [refusal] = preflight(Engine(), target, facts, SimpleNamespace(none=True, all=False, ids=()), parse_host_state(HOST_STATE, []))
    assert "--ulimit memlock=8388608" in refusal.fix and "gpurig_containers" not in refusal.fix


PENDING = (FIXTURES / "slurm" / "squeue-pending.json").read_text()


def pending_job() -> str:
    return str(next(j["job_id"] for j in json.loads(PENDING)["jobs"] if "PENDING" in str(j["job_state"])))


def test_jobs_says_a_pending_job_s_partition_has_no_usable_node():
    [view] = [v for v in scheduler.slurm_jobs(Conn("ctl", {"squeue": PENDING, "sinfo": DRAINED}, [])) if v.id == pending_job()]
    assert view.state == "pending"
    assert "partition gpu has no node Slurm gives jobs: " in view.state_text and all(n in view.state_text for n in NODES)
    [calm] = [v for v in scheduler.slurm_jobs(Conn("ctl", {"squeue": PENDING, "sinfo": IDLE}, [])) if v.id == pending_job()]
    assert "partition" not in calm.state_text  # nodes Slurm gives jobs: the wait is Slurm's own to explain


def test_logs_of_a_job_that_has_not_started_says_so_with_why(monkeypatch):
    sent: list[str] = []
    connector = SimpleNamespace(open=lambda host: Conn(host.name, {"squeue": PENDING, "sinfo": DRAINED}, sent), close=lambda: None)
    reach = scheduler.Reach(lambda: connector, 4)
    monkeypatch.setattr(scheduler, "fleet", fleet_of({"hostname": "elsewhere"}, sent))
    view = scheduler.find(reach, hosts(), pending_job())
    with pytest.raises(ConfigError) as err:
        scheduler.follow(reach, hosts(), view, lambda data: None, follow_it=False)
    assert err.value.problem.startswith(f"job {view.id} has not started (pending: ")
    assert "partition gpu has no node Slurm gives jobs" in err.value.problem
    assert "none of the inventory's nodes" not in str(err.value)


def test_not_responding_is_no_node_slurm_gives_jobs():
    from gpurig.slurm import health

    nodes = health.cluster_nodes(IDLE.replace("|idle|", "|idle*|", 1))
    good, bad = health.partition_nodes(nodes, "gpu")
    assert [n.state.text for n in bad] == ["idle, not responding"] and len(good) == len(NODES) - 1
    assert dataclasses.replace(bad[0].state, responding=True).healthy
