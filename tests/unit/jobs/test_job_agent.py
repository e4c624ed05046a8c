"""The job agent's host side without a Docker engine: the sync folder's manifest and upload, the queue's rules, a job's true state.

checks/job_agent.py runs as a subprocess where a host would run it (the
verbs read stdin and print JSON), and its pure parts are imported from the
file. What needs an engine (starting, waiting, cancelling) is in
tests/integration/jobs and tests/integration/deploy/test_jobs.py.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[3] / "checks" / "job_agent.py"


def load_agent():
    spec = importlib.util.spec_from_file_location("job_agent_under_test", AGENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


agent = load_agent()


def call(tmp_path: Path, *args: str, stdin: bytes | None = None) -> tuple[int, dict | None, str]:
    proc = subprocess.run([sys.executable, str(AGENT), *args, "--sync-root", str(tmp_path / "sync")], input=stdin,
                          capture_output=True, timeout=60)
    out = proc.stdout.decode().strip()
    doc = json.loads(out.splitlines()[-1]) if out else None
    if doc and "z" in doc:  # the manifest's listing travels compressed
        doc["entries"] = json.loads(zlib.decompress(base64.b64decode(doc.pop("z"))))
    return proc.returncode, doc, proc.stderr.decode()


def upload(members: list[tuple[str, bytes | None, int, str | None]], control: dict) -> bytes:
    """A tar as gpurig's sync sends it: (name, data or None for a folder, mode, link target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        data = json.dumps(control).encode()
        info = tarfile.TarInfo("gpurig-sync.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for name, body, mode, link in members:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 1_700_000_000
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif body is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def test_manifest_makes_the_folder_and_an_upload_lands_read_only(tmp_path):
    rc, doc, err = call(tmp_path, "manifest", "--cache", "proj-1")
    assert rc == 0, err
    assert doc["entries"] == {} and Path(doc["cache"]).is_dir()
    tar = upload([("code/run.sh", b"echo hi\n", 0o755, None), ("code/src", None, 0o755, None), ("code/src/a.py", b"x = 1\n", 0o644, None),
                  ("code/latest", None, 0o777, "src/a.py")], {"delete": [], "job": None})
    rc, said, err = call(tmp_path, "apply", "--cache", "proj-1", stdin=tar)
    assert rc == 0, err
    assert said["files"] == 3 and said["bytes"] == len(b"echo hi\n") + len(b"x = 1\n")
    rc, doc, _ = call(tmp_path, "manifest", "--cache", "proj-1")
    entries = doc["entries"]
    assert entries["run.sh"][:3] == ["file", 8, 1_700_000_000] and entries["run.sh"][3] == 0o555  # no write bit, exec kept
    assert entries["src/a.py"][3] == 0o444
    assert entries["latest"] == ["link", 0, 0, 0, "src/a.py"]


def test_a_second_upload_replaces_and_deletes_only_what_it_names(tmp_path):
    call(tmp_path, "manifest", "--cache", "p")
    call(tmp_path, "apply", "--cache", "p", stdin=upload([("code/a", b"1", 0o644, None), ("code/d", None, 0o755, None),
                                                          ("code/d/b", b"2", 0o644, None)], {"delete": []}))
    rc, said, err = call(tmp_path, "apply", "--cache", "p", stdin=upload([("code/a", b"new", 0o644, None)], {"delete": ["d"]}))
    assert rc == 0, err and said["deleted"] == 1
    entries = call(tmp_path, "manifest", "--cache", "p")[1]["entries"]
    assert sorted(entries) == ["a"] and entries["a"][1] == 3


@pytest.mark.parametrize("name, link", [("code/../escape", None), ("/etc/passwd", None), ("other/x", None), ("code/l", "../../outside")])
def test_an_upload_that_would_leave_the_folder_is_refused_and_nothing_lands(tmp_path, name, link):
    call(tmp_path, "manifest", "--cache", "p")
    rc, said, err = call(tmp_path, "apply", "--cache", "p", stdin=upload([("code/ok", b"1", 0o644, None), (name, b"x" if link is None else None, 0o644, link)],
                                                                         {"delete": []}))
    assert rc == agent.REFUSED and said is None
    line = err.strip().splitlines()[-1]
    assert line.startswith(agent.ERROR) and "outside" in json.loads(line[len(agent.ERROR):])["problem"]
    [tree] = (tmp_path / "sync").rglob("tree")
    assert [p.name for p in tree.rglob("*")] == []  # staged, never moved in


def test_files_named_like_the_agents_own_are_synced_as_any_other(tmp_path):
    call(tmp_path, "manifest", "--cache", "p")
    names = ["pending", "lock", "stage-x", ".gpurig-pending"]
    members = [(f"code/{n}", n.encode(), 0o644, None) for n in names]
    rc, _, err = call(tmp_path, "apply", "--cache", "p", stdin=upload(members, {"delete": []}))
    assert rc == 0, err
    assert sorted(call(tmp_path, "manifest", "--cache", "p")[1]["entries"]) == sorted(names)
    rc, said, err = call(tmp_path, "apply", "--cache", "p", stdin=upload([], {"delete": names}))
    assert rc == 0 and call(tmp_path, "manifest", "--cache", "p")[1]["entries"] == {}


def test_the_pending_bundle_is_private(tmp_path):
    call(tmp_path, "manifest", "--cache", "p")
    rc, _, err = call(tmp_path, "apply", "--cache", "p", stdin=upload([("job/job.json", b'{"env": "secret"}', 0o644, None)], {"delete": [], "job": "abc12345"}))
    assert rc == 0, err
    [bundle] = (tmp_path / "sync").rglob("abc12345")
    assert (bundle / "job.json").stat().st_mode & 0o777 == 0o600 and bundle.stat().st_mode & 0o777 == 0o700


def state_of(root: Path, ident: str, state: dict, meta: dict | None = None) -> Path:
    d = root / ident
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"name": "t", "argv": ["true"], "seq": 1, "submitted_at": 0, **(meta or {})}))
    (d / "state.json").write_text(json.dumps(state))
    return d


def test_a_running_job_whose_supervisor_is_gone_is_failed_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(agent, "BOOT_TOKEN", str(tmp_path / "boot-token"))
    token = agent.boot_token()
    dead = {"pid": 2**22 + 12345, "start": 1}
    d = state_of(tmp_path / "jobs", "aaa11111", {"state": "running", "supervisor": dead, "boot": token})
    doc = agent.describe(str(d), token)
    assert doc["state"] == "failed" and doc["reason"].startswith("its job agent ended unexpectedly")
    assert json.loads((d / "state.json").read_text())["state"] == "failed"  # written, so no reader ever sees it running again
    d2 = state_of(tmp_path / "jobs", "bbb22222", {"state": "running", "supervisor": dead, "boot": "another boot"})
    assert agent.describe(str(d2), token)["reason"] == "host rebooted"
    me = {"pid": os.getpid(), "start": agent.proc_start(os.getpid())}
    d3 = state_of(tmp_path / "jobs", "ccc33333", {"state": "running", "supervisor": me, "boot": token})
    assert agent.describe(str(d3), token)["state"] == "running"
    reused = {"pid": os.getpid(), "start": agent.proc_start(os.getpid()) - 1}  # the same pid, another process
    d4 = state_of(tmp_path / "jobs", "ddd44444", {"state": "pending", "supervisor": reused, "boot": token})
    assert agent.describe(str(d4), token)["state"] == "failed"


def test_a_new_boot_has_a_new_token(tmp_path, monkeypatch):
    monkeypatch.setattr(agent, "BOOT_TOKEN", str(tmp_path / "run" / "gpurig" / "boot-token"))
    first = agent.boot_token()
    assert agent.boot_token() == first
    (tmp_path / "run" / "gpurig" / "boot-token").unlink()  # /run is emptied by a boot
    assert agent.boot_token() != first


HOST_GPUS = [(0, "GPU-aaaa"), (1, "GPU-bbbb")]


def container(name: str, request: dict | None, labels: dict | None = None) -> dict:
    """A running container as the engine's inspect shows it (the fields the agent reads)."""
    return {"Id": name * 4, "Name": f"/{name}", "Config": {"Labels": labels or {}},
            "HostConfig": {"DeviceRequests": [request] if request else None}}


class Engine:
    def __init__(self, running):
        self._running = running

    def running(self):
        return self._running


def test_held_gpus_read_every_running_containers_device_requests():
    running = [container("web", None), container("deployed", {"Driver": "", "Count": 0, "DeviceIDs": ["1"], "Capabilities": [["gpu"]]},
                                                 {"io.gpurig.deploy.settings": json.dumps({"share": True})}),
               container("job", {"Driver": "", "Count": 0, "DeviceIDs": ["GPU-aaaa"], "Capabilities": [["gpu"]]}, {"io.gpurig.job.id": "j1"}),
               container("mine", {"Count": -1, "Capabilities": [["gpu"]]}, {"io.gpurig.job.id": "me"})]
    held = agent.held_gpus(Engine(running), HOST_GPUS, "me")
    assert held == {1: ("container deployed", True), 0: ("job j1", False)}
    everything = agent.held_gpus(Engine([container("other", {"Count": -1, "Capabilities": [["gpu"]]})]), HOST_GPUS, "me")
    assert set(everything) == {0, 1}


def test_pick_gpus_waits_for_held_ones_and_shares_only_by_consent():
    held = {0: ("job j1", False), 1: ("container c", True)}
    assert agent.pick_gpus({"count": 1}, HOST_GPUS, held, share=False)[0] is None
    assert "held by container c, job j1" in agent.pick_gpus({"count": 1}, HOST_GPUS, held, share=False)[1]
    assert agent.pick_gpus({"count": 1}, HOST_GPUS, held, share=True) == (["1"], None)
    assert agent.pick_gpus({"ids": ["GPU-bbbb"]}, HOST_GPUS, {}, share=False) == (["1"], None)
    devices, why = agent.pick_gpus({"ids": ["0"]}, HOST_GPUS, held, share=True)
    assert devices is None and why == "waiting for GPU 0 (held by job j1)"
    assert agent.pick_gpus({"all": True}, HOST_GPUS, {}, share=False) == (["0", "1"], None)


def test_the_queue_is_first_in_first_out_among_live_waiting_gpu_jobs(tmp_path):
    me = {"pid": os.getpid(), "start": agent.proc_start(os.getpid())}
    root = tmp_path / "jobs"
    state_of(root, "early001", {"state": "pending", "supervisor": me}, {"seq": 1, "gpus": {"count": 1}})
    state_of(root, "dead0002", {"state": "pending", "supervisor": {"pid": 2**22 + 99, "start": 1}}, {"seq": 2, "gpus": {"count": 1}})
    state_of(root, "cpujob03", {"state": "pending", "supervisor": me}, {"seq": 3, "gpus": {}})
    state_of(root, "running4", {"state": "running", "supervisor": me}, {"seq": 4, "gpus": {"count": 1}})
    state_of(root, "late0006", {"state": "pending", "supervisor": me}, {"seq": 6, "gpus": {"count": 1}})
    assert agent.queue_ahead(str(root), "mine0005", 5) == ["early001"]
    assert agent.queue_ahead(str(root), "early001", 1) == []


def test_logs_follow_says_on_stderr_why_a_pending_job_waits_once_and_again_when_why_changes(tmp_path):
    import threading
    import time

    job = tmp_path / "jobs" / "abc12345"
    job.mkdir(parents=True)
    (job / "log").write_bytes(b"")
    (job / "meta.json").write_text(json.dumps({"name": "train", "submitted_at": time.time()}))  # just submitted: no supervisor yet

    def state(**doc) -> None:
        tmp = job / "state.tmp"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, job / "state.json")

    state(state="pending", reason="starting")
    proc = subprocess.Popen([sys.executable, str(AGENT), "logs", "--root", str(tmp_path / "jobs"), "--id", "abc12345", "--follow"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    watchdog = threading.Timer(60, proc.kill)  # a bounded wait: a hung agent fails the test instead of hanging it
    watchdog.start()
    try:
        assert json.loads(proc.stderr.readline().decode().split(": ", 1)[1]) == {"state": "pending", "reason": "starting"}
        state(state="pending", reason="waiting for GPU 0 (held by job ef012345)")
        said = json.loads(proc.stderr.readline().decode().split(": ", 1)[1])
        assert said == {"state": "pending", "reason": "waiting for GPU 0 (held by job ef012345)"}
        state(state="running", reason="")
        assert json.loads(proc.stderr.readline().decode().split(": ", 1)[1]) == {"state": "running", "reason": ""}
        state(state="succeeded", reason="", exit_code=0)
        rest = proc.stderr.read().decode().splitlines()
        assert proc.wait() == 0
    finally:
        watchdog.cancel()
    assert [line.split(": ", 1)[0] for line in rest] == ["gpurig-job-state"]  # no wait line repeated while why stayed the same
