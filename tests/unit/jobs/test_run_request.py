"""`gpurig run`'s flags read into a RunRequest, the job's container made from deploy's, and what is synced (the plan and its tar).

Every bad value is one ConfigError line naming the flag and the fix, before
any host is contacted; hostile values (a newline, a quote, $(...), a leading
-, a NUL, a 5,000-digit number) never reach a shell.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from gpurig.deploy.containers import ContainerSpec
from gpurig.deploy.fields import ALL_GPUS, NO_GPUS, Gpus, Volume
from gpurig.errors import ConfigError
from gpurig.jobs import request as jobspec
from gpurig.jobs.sync import plan_sync, sync_key, tar_feed
from gpurig.jobs.tree import scan

HOSTILE = ["1\n2", "'", "$(touch /tmp/pwned)", "-1", "a\0b", "9" * 5000]


def test_gpus_flag_reads_deploys_grammar():
    assert jobspec.gpus_flag(None) is None
    assert jobspec.gpus_flag("2") == Gpus(count=2)
    assert jobspec.gpus_flag("all") == ALL_GPUS and jobspec.gpus_flag("none") == NO_GPUS and jobspec.gpus_flag("0") == NO_GPUS
    assert jobspec.gpus_flag("0,1") == Gpus(ids=("0", "1")) == jobspec.gpus_flag("device=0,1")
    assert jobspec.gpus_flag("device=0") == Gpus(ids=("0",))
    assert jobspec.gpus_flag("GPU-4f6a1c2e-8b3d-4e5f-9a0b-1c2d3e4f5a6b").ids == ("GPU-4f6a1c2e-8b3d-4e5f-9a0b-1c2d3e4f5a6b",)


@pytest.mark.parametrize("value", [*HOSTILE, "0,0", "two", "1,x"])
def test_a_bad_gpus_flag_is_one_line(value):
    with pytest.raises(ConfigError) as err:
        jobspec.gpus_flag(value)
    assert "\n" not in str(err.value) and "--gpus" in str(err.value)


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_of_every_flag_are_refused_in_one_line(value):
    for check in (lambda: jobspec.env_flags([value]), lambda: jobspec.duration(value, "--timeout"),
                  lambda: jobspec.whole(value, "--retry", 0, 100, "2"), lambda: jobspec.check_name(value)):
        with pytest.raises(ConfigError) as err:
            check()
        assert "\n" not in str(err.value).replace("\\n", "")


def test_env_values_are_kept_byte_for_byte():
    assert jobspec.env_flags(["A=x y", "B=$(id)", "C=", "D=a=b", "E=line1\nline2"]) == (
        ("A", "x y"), ("B", "$(id)"), ("C", ""), ("D", "a=b"), ("E", "line1\nline2"))


@pytest.mark.parametrize("value", ["/etc", "../up", "a/../../b", "", "x\ny"])
def test_artifacts_stay_inside_the_working_directory(value):
    with pytest.raises(ConfigError, match="--artifacts"):
        jobspec.artifact_flags([value])


def test_ulimit_and_shm_flags_follow_docker_run():
    assert [(u.name, u.soft, u.hard) for u in jobspec.ulimit_flags(["memlock=-1", "nofile=1024:65536"])] == [
        ("memlock", -1, -1), ("nofile", 1024, 65536)]
    assert jobspec.shm_flag("16g") == 16 << 30 and jobspec.shm_flag(None) is None
    for bad in ("memlok=1", "nofile=9:1", "nofile", "nofile=x"):
        with pytest.raises(ConfigError, match="--ulimit"):
            jobspec.ulimit_flags([bad])
    with pytest.raises(ConfigError, match="below Docker's 64m"):
        jobspec.shm_flag("1m")


def test_artifacts_and_durations_as_written():
    assert jobspec.artifact_flags(["checkpoints/", "out/r.json", "checkpoints"]) == ("checkpoints", "out/r.json")
    assert [jobspec.duration(v, "--timeout") for v in ("90", "90s", "30m", "2h", "1d")] == [90, 90, 1800, 7200, 86400]


def test_the_job_is_named_after_its_script():
    assert jobspec.job_name(("python", "-u", "train.py", "--epochs", "3"), None) == "train"
    assert jobspec.job_name(("bash", "scripts/eval.sh"), None) == "eval"
    assert jobspec.job_name(("nvidia-smi",), None) == "nvidia-smi"
    assert jobspec.job_name(("x",), "my-run.2") == "my-run.2"


def test_the_jobs_container_is_deploys_without_ports_restart_or_workspace():
    from gpurig.deploy.fields import Port

    template = ContainerSpec(host="h", name="gpurig-slim", variant="slim", image="pytorch:slim", entry=None, ports=(Port(2222, 22, "127.0.0.1"),),
                             volumes=(Volume("/srv/gpurig/gpurig-slim/workspace", "/workspace", False, create=True),
                                      Volume("/data/imagenet", "/datasets/imagenet", True)),
                             env=(("HF_TOKEN", "hf_secret"),), shm_size=8 << 30)
    request = jobspec.RunRequest(argv=("python", "a b.py", "$(x)"), workdir=Path("."), ulimits=jobspec.ulimit_flags(["memlock=8388608"]),
                                 env=(("EXTRA", "1"),))
    job = jobspec.job_container(template, "abcd1234", request)
    body = jobspec.create_body(job, "pytorch:slim", "abcd1234", "/srv/gpurig/jobs/abcd1234/work", share=False)
    host = body["HostConfig"]
    assert body["Cmd"] == ["python", "a b.py", "$(x)"] and body["WorkingDir"] == "/workspace"
    assert host["PortBindings"] == {} and host["RestartPolicy"]["Name"] == "no" and host["ShmSize"] == 8 << 30
    assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in host["Mounts"]] == [
        ("/data/imagenet", "/datasets/imagenet", True), ("/srv/gpurig/jobs/abcd1234/work", "/workspace", False)]
    assert "DeviceRequests" not in host  # the host's agent picks the GPUs when the job's turn comes
    assert body["Labels"] == {"io.gpurig.job.id": "abcd1234", "io.gpurig.job.share": "false"}  # never deploy's: deploy must not adopt it
    assert "HF_TOKEN=hf_secret" in body["Env"] and "EXTRA=1" in body["Env"]
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]} == {"memlock": (8388608, 8388608), "stack": (67108864, 67108864)}


def make_tree(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "model.py").write_text("layers = 3\n")
    (root / "train.py").write_text("print('hi')\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return root


def manifest_of(tree) -> dict:
    return {e.path: ([e.kind, e.size, e.mtime, e.mode] if e.kind != "link" else ["link", 0, 0, 0, e.target]) for e in tree.entries}


def test_the_plan_sends_what_differs_and_deletes_what_is_gone(tmp_path):
    root = make_tree(tmp_path / "w")
    tree = scan(root)
    remote = manifest_of(tree)
    assert plan_sync(tree, remote).send == () and plan_sync(tree, remote).unchanged == len(tree.entries)
    remote["train.py"] = ["file", 12, remote["train.py"][2] - 5, 0o444]  # another mtime
    remote["run.sh"] = [*remote["run.sh"][:3], 0o444]  # lost its exec bits
    remote["old"] = ["dir", 0, 0, 0o755]
    remote["old/x.py"] = ["file", 1, 1, 0o444]
    plan = plan_sync(tree, remote)
    assert sorted(e.path for e in plan.send) == ["run.sh", "train.py"] and plan.delete == ("old",)


def test_the_tar_carries_the_control_document_the_bundle_and_the_changes(tmp_path):
    root = make_tree(tmp_path / "w")
    tree = scan(root)
    plan = plan_sync(tree, {})
    chunks: list[bytes] = []
    tar_feed(tree, plan, "abcd1234", {"job.json": b"{}"})(chunks.append)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:") as tar:
        names = tar.getnames()
        control = json.loads(tar.extractfile("gpurig-sync.json").read())
        assert tar.getmember("code/run.sh").mode & 0o111 and tar.extractfile("code/train.py").read() == b"print('hi')\n"
    assert names[:2] == ["gpurig-sync.json", "job/job.json"] and control == {"delete": [], "job": "abcd1234"}
    assert {"code/src", "code/src/model.py", "code/train.py", "code/run.sh"} <= set(names)


def test_a_file_that_changes_while_it_is_sent_stops_the_sync(tmp_path):
    root = make_tree(tmp_path / "w")
    tree = scan(root)
    (root / "train.py").write_text("print('changed meanwhile')\n")
    with pytest.raises(Exception, match="changed while it was being sent"):
        tar_feed(tree, plan_sync(tree, {}))(lambda data: None)


def test_a_file_swapped_for_a_fifo_or_a_link_since_the_scan_stops_the_sync_at_once(tmp_path):
    import os
    import threading

    root = make_tree(tmp_path / "w")
    tree = scan(root)
    (root / "train.py").unlink()
    os.mkfifo(root / "train.py")  # nobody writes to it: a blocking open would wait for ever
    outcome: list[str] = []

    def send() -> None:
        try:
            tar_feed(tree, plan_sync(tree, {}))(lambda data: None)
        except Exception as err:  # noqa: BLE001 - the test reads what was raised
            outcome.append(str(err))

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sender.join(10)
    assert not sender.is_alive(), "the sync hung on a FIFO"
    assert "train.py changed while it was being sent" in outcome[0]
    (root / "train.py").unlink()
    (tmp_path / "secret").write_text("print('not in the tree')\n")
    (root / "train.py").symlink_to(tmp_path / "secret")
    with pytest.raises(Exception, match="train.py"):  # never the file the link points to
        tar_feed(tree, plan_sync(tree, {}))(lambda data: None)


def test_the_sync_folder_is_named_by_the_directory_and_where_it_is(tmp_path):
    a, b = tmp_path / "a" / "proj", tmp_path / "b" / "proj"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    assert sync_key(a) == sync_key(a) and sync_key(a) != sync_key(b) and sync_key(a).startswith("proj-")
    odd = tmp_path / "we ird$(x)"
    odd.mkdir()
    assert all(c.isalnum() or c in "._-" for c in sync_key(odd))
