"""Which container a GPU process runs in: the agent reads it from /proc/PID/cgroup, the monitor checks what it sent.

The cgroup lines are the forms the engines write (Docker under cgroup v2 and v1, containerd's CRI, CRI-O, podman), the
hostile ones made here. The agent must never carry into a record what is not a container id, and a process in no
container must be written as an older agent wrote it (no key at all), so that records of either agent parse.
"""

from __future__ import annotations

import copy
import json

import pytest
from nvml_replay import FIXTURES, T0, FakeNvml, sampler

from gpurig.monitor.samples import gpu_from_record, sample_from_record

CID = "ef733c8a383212275335f60b3e5ba9ccfb12f398651b6bc83491b4ae3d487097"
OTHER = "0123456789abcdef" * 4
NON_MIG = json.loads((FIXTURES / "nvml-h100-a100.json").read_text())
V1 = "\n".join(f"{n}:{c}:/docker/{CID}" for n, c in ((12, "perf_event"), (4, "memory"), (1, "cpu,cpuacct"))) + "\n0::/\n"


@pytest.mark.parametrize(("text", "found"), [
    (f"0::/system.slice/docker-{CID}.scope\n", CID),  # cgroup v2, systemd driver
    (f"0::/docker/{CID}\n", CID),  # cgroup v2, cgroupfs driver
    (V1, CID),  # cgroup v1 (this machine's form): the controllers' lines, the v2 line empty
    (f"9:name=systemd:/system.slice/docker-{CID}.scope\n0::/\n", CID),
    (f"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CID}.scope\n", CID),
    (f"0::/machine.slice/libpod-{CID}.scope/container\n", CID),  # podman (rootful, with its inner cgroup)
    (f"1:name=systemd:/libpod_parent/libpod-{CID}\n", CID),
    (f"0::/system.slice/crio-{CID}.scope\n", CID),
    (f"0::/docker/{OTHER}/docker/{CID}\n", CID),  # a container inside a container: the innermost is the process's own
    (f"4:memory:/docker/{OTHER}\n0::/system.slice/docker-{CID}.scope\n", CID),  # the unified line first
])
def test_a_container_is_read_from_each_engines_cgroup_form(text, found):
    assert sampler.container_of_cgroup(text.encode()) == found


@pytest.mark.parametrize("text", [
    "0::/\n", "0::/init.scope\n", "0::/user.slice/user-1000.slice/session-3.scope\n", "",
    "4:memory:/\n1:cpu:/\n0::/\n",
    f"0::/machine.slice/libpod-conmon-{CID}.scope\n",  # podman's monitor, beside the container, not in it
    f"0::/docker/{CID}x\n", f"0::/docker/{CID}0\n", f"0::/docker/{CID[:-1]}\n",  # not exactly 64 hex digits
    f"0::/docker/{CID.upper()}\n", f"0::/notdocker-{CID}.scope\n", f"0::/system.slice/docker-{CID}.scopex\n",
    f"docker-{CID}.scope\n", f"0:/docker/{CID}\n",  # not a cgroup line
    "\x00\xff\xfe:::\n" * 100, "0::" + "/a" * 40000,
])
def test_a_process_in_no_container_or_hostile_text_is_none(text):
    assert sampler.container_of_cgroup(text.encode("latin-1")) is None


def test_a_gone_pid_or_a_strange_one_is_none_not_an_error():
    assert sampler.process_container(2**31 - 1) is None
    assert sampler.process_container(-1) is None and sampler.process_container("1/../self") is None


def test_the_agent_adds_the_key_only_for_a_process_in_a_container(monkeypatch):
    monkeypatch.setattr(sampler, "process_container", lambda pid: CID if pid == 1 else None)
    source = sampler.NvmlSource(FakeNvml(NON_MIG))
    [proc] = source.sample()[0]["processes"]
    assert proc["container"] == CID
    monkeypatch.setattr(sampler, "process_container", lambda pid: None)
    [proc] = source.sample()[0]["processes"]
    assert set(proc) == {"pid", "user", "name", "used_mib"}  # an older agent's process record, key for key
    source.close()


# --- the monitor's side ----------------------------------------------------------------------------------------------------------


def record(**process):
    return {"index": 0, "util_gpu": 3, "processes": [{"pid": 4242, "user": "alice", "name": "python", "used_mib": 100, **process}]}


def test_the_records_container_is_kept_and_an_older_agents_record_parses():
    assert gpu_from_record(record(container=CID)).processes[0].container == CID
    older = gpu_from_record(record())
    assert older.processes[0].container is None and older.processes[0].user == "alice"
    assert gpu_from_record(record(container=None)).processes[0].container is None


@pytest.mark.parametrize("bad", [CID.upper(), CID[:12], CID + "0", f" {CID}", 42, ["x"], "", "../../etc"])
def test_a_container_that_is_not_an_id_refuses_the_record(bad):
    with pytest.raises((ValueError, TypeError)):
        gpu_from_record(record(container=bad))
    sample = {"type": "sample", "t": T0, "cpu": {"percent": 1.0}, "gpus": [record(container=bad)]}
    with pytest.raises((ValueError, TypeError)):
        sample_from_record("gpu-01", copy.deepcopy(sample))
