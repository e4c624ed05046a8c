"""`gpurig run` / jobs / logs --job / attach / cancel / fetch against the session's provisioned host over SSH, as a user runs them.

The jobs run in a few-MB image made in the host's own engine from its own
binaries (no registry, no torch), on the host's stand-in GPUs (two A100s in
nvidia-smi, the toolkit's hook). What a job did is read back through the
test's own `docker exec` into the host, not through gpurig. Every job,
supervisor and folder a test made is removed after it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .gpuhost import IMAGE_SCRIPT, JOB_BINARIES, REPO, make_probe_image

JOB_IMAGE = "gpurig-test-jobs:1"
HOST_ULIMIT = ("--ulimit", "memlock=8388608")  # dockerd here may not raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE)


@pytest.fixture(scope="module")
def job_image(deploy_host) -> str:
    if deploy_host.image_id(JOB_IMAGE) is None:
        make_probe_image(deploy_host, JOB_IMAGE, JOB_BINARIES)
    return JOB_IMAGE


@pytest.fixture
def job_host(clean_deploy_host, job_image):
    """The deploy host, its jobs' supervisors, folders and containers removed after the test."""
    try:
        yield clean_deploy_host
    finally:
        clean_deploy_host.sh("systemctl stop 'gpurig-job-*' 2>/dev/null; pkill -f '[j]ob_agent.py supervise' 2>/dev/null; "
                             "umount /srv/gpurig/sync 2>/dev/null; rm -rf /srv/gpurig/jobs /srv/gpurig/sync; true", check=False)


@pytest.fixture
def job_cli(deploy_inventory, tmp_path):
    """cli(*args, wait=True) -> CompletedProcess (or Popen): `gpurig ARGS -i INVENTORY` from tmp_path, HOME there."""
    inv = deploy_inventory()
    env = {**os.environ, "HOME": str(tmp_path), "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)

    def cli(*args: str, wait: bool = True, timeout: float = 300):
        argv = [sys.executable, "-c", "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])", *args, "-i", str(inv)]
        if "--" in args:  # host flags before the command's words
            cut = args.index("--")
            argv = [*argv[:3], *args[:cut], "-i", str(inv), *args[cut:]]
        if not wait:
            return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, timeout=timeout)

    return cli


def workdir(tmp_path: Path, files: dict[str, bytes | str]) -> Path:
    root = tmp_path / "work"
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return root


def submit(job_cli, work: Path, *command: str, flags: tuple[str, ...] = ()) -> dict:
    proc = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--workdir", str(work), "--json", "-", *flags, "--", *command)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return json.loads(proc.stdout)["job"]


def job_state(job_cli, ident: str) -> dict:
    proc = job_cli("jobs", "--job", ident, "--json", "-")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    [found] = json.loads(proc.stdout)["jobs"]
    return found


def until(job_cli, ident: str, done, what: str, deadline_s: float = 120) -> dict:
    end = time.monotonic() + deadline_s
    while True:
        found = job_state(job_cli, ident)
        if done(found):
            return found
        assert time.monotonic() < end, f"job {ident} never {what}: {found}"
        time.sleep(0.5)  # polling the host's state with a deadline, not a synchronisation sleep


HOLD = "echo on $NVIDIA_VISIBLE_DEVICES; while [ ! -e release ]; do sleep 0.1; done\n"  # holds its GPU until the test says


def release(job_host, ident: str) -> None:
    job_host.sh(f"touch /srv/gpurig/jobs/{ident}/work/release")


ARGS = ["a b", "it's", '"quoted"', "$(touch /tmp/pwned)", "line1\nline2", "-x", ""]
SHOW_ARGS = 'for a in "$@"; do printf "[%s]\\n" "$a"; done\n'


def test_run_wait_streams_the_log_exits_with_the_scripts_code_and_argv_arrives_literally(job_host, job_cli, tmp_path):
    work = workdir(tmp_path, {"show.sh": SHOW_ARGS + "exit 3\n"})
    proc = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--workdir", str(work), "--wait", "--json", str(tmp_path / "run.json"),
                   "--junit", str(tmp_path / "run.xml"), "--", "sh", "show.sh", *ARGS)
    assert proc.returncode == 3, proc.stderr.decode()[-3000:]
    assert proc.stdout.decode() == "".join(f"[{a}]\n" for a in ARGS)
    assert job_host.sh("ls /tmp/pwned", check=False).returncode != 0
    doc = json.loads((tmp_path / "run.json").read_text())["job"]
    assert doc["state"] == "failed" and doc["exit_code"] == 3 and doc["reason"] == "exited 3"
    assert 'failures="1"' in (tmp_path / "run.xml").read_text()
    assert "exit code 3" in proc.stderr.decode()
    killed = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--gpus", "none", "--workdir", str(work), "--wait", "--", "sh", "-c", "kill -9 $$")
    assert killed.returncode == 137, killed.stderr.decode()[-2000:]  # 128 + SIGKILL
    assert "killed by signal 9" in killed.stderr.decode()


def test_logs_and_artifacts_come_back_byte_identical_and_a_second_fetch_moves_nothing(job_host, job_cli, tmp_path):
    data = os.urandom(300_000)
    script = ("mkdir -p out/deep; cat data.bin > out/copy.bin; head -c 200000 /dev/urandom > out/deep/gen.bin; "
              "printf 'caf\\303\\251 \\001\\002 tab\\tend\\n'; printf 'no newline at the end'\n")
    work = workdir(tmp_path, {"data.bin": data, "make.sh": script})
    proc = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--gpus", "none", "--workdir", str(work), "--artifacts", "out", "--wait",
                   "--", "sh", "make.sh")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    runs = work / "gpurig-runs"
    [ident] = [p.name for p in runs.iterdir()]
    fetched = runs / ident / "out"
    assert (fetched / "copy.bin").read_bytes() == data
    on_host = job_host.sh(f"cat /srv/gpurig/jobs/{ident}/work/out/deep/gen.bin | sha256sum").stdout.split()[0]
    import hashlib

    assert hashlib.sha256((fetched / "deep" / "gen.bin").read_bytes()).hexdigest() == on_host
    log = job_cli("logs", "--job", ident[:4])
    host_log = job_host.sh(f"cat /srv/gpurig/jobs/{ident}/log").stdout
    assert log.returncode == 0 and log.stdout == "café \x01\x02 tab\tend\nno newline at the end".encode() == host_log.encode()
    again = job_cli("fetch", ident, "--into", str(runs / ident))
    said = again.stderr.decode()
    assert again.returncode == 0 and "0 files (0 bytes) fetched" in said and "2 unchanged" in said, said


def test_a_one_file_edit_syncs_only_that_file(job_host, job_cli, tmp_path):
    files = {f"src/m{i:02d}.py": f"x = {i}\n" * 200 for i in range(40)}
    work = workdir(tmp_path, {**files, "big.bin": os.urandom(1_000_000), ".gitignore": "*.ckpt\n", "old.ckpt": "ignored"})
    first = submit(job_cli, work, "true", flags=("--gpus", "none"))
    assert first["sync"]["files"] == 42 and first["sync"]["unchanged"] == 0  # 40 + big.bin + .gitignore; old.ckpt ignored
    edited = work / "src" / "m07.py"
    edited.write_text("x = 'edited'\n")
    second = submit(job_cli, work, "true", flags=("--gpus", "none"))
    assert second["sync"]["files"] == 1 and second["sync"]["bytes"] == edited.stat().st_size
    assert second["sync"]["wire_bytes"] < 200_000  # the edited file, headers and the job's own files, not the 1 MB file
    assert job_host.sh(f"cat /srv/gpurig/jobs/{second['id']}/work/src/m07.py").stdout == "x = 'edited'\n"
    assert job_host.sh(f"cat /srv/gpurig/jobs/{first['id']}/work/src/m07.py").stdout == "x = 7\n" * 200  # the first job's copy stays


def test_a_job_runs_to_completion_after_the_client_is_killed(job_host, job_cli, tmp_path):
    work = workdir(tmp_path, {"slow.sh": "echo started; while [ ! -e release ]; do sleep 0.1; done; echo finished\n"})
    client = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--gpus", "none", "--workdir", str(work), "--wait", "--json",
                     str(tmp_path / "run.json"), "--", "sh", "slow.sh", wait=False)
    try:
        first = client.stdout.readline()
        assert first == b"started\n", client.stderr.read()[-2000:]
        client.send_signal(signal.SIGKILL)  # no cleanup of any kind: the client is simply gone
        client.wait(timeout=30)
    finally:
        if client.poll() is None:
            client.kill()
    listed = json.loads(job_cli("jobs", "--json", "-").stdout)["jobs"]
    [running] = [j for j in listed if j["state"] in ("pending", "running")]
    release(job_host, running["id"])
    done = until(job_cli, running["id"], lambda j: j["state"] not in ("pending", "running"), "ended")
    assert done["state"] == "succeeded" and done["exit_code"] == 0
    assert job_cli("logs", "--job", running["id"]).stdout == b"started\nfinished\n"



def test_ctrl_c_on_run_wait_leaves_the_job_running_and_a_sigterm_with_cancel_on_interrupt_cancels_it(job_host, job_cli, tmp_path):
    work = workdir(tmp_path, {"slow.sh": "echo started; while [ ! -e release ]; do sleep 0.1; done; echo finished\n"})

    def interrupted(sig: int, *flags: str) -> tuple[int, str, str]:
        client = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--gpus", "none", "--workdir", str(work), "--wait", *flags, "--",
                         "sh", "slow.sh", wait=False)
        try:
            assert client.stdout.readline() == b"started\n", client.stderr.read()[-2000:]
            client.send_signal(sig)
            _, err = client.communicate(timeout=120)
        finally:
            if client.poll() is None:
                client.kill()
        said = err.decode()
        last = said.strip().splitlines()[-1]
        found = re.search(r"job ([a-f0-9]{8})", last)
        assert found and "run again" not in said, said[-2000:]
        return client.returncode, last, found.group(1)

    code, last, ident = interrupted(signal.SIGINT)
    assert code == 130 and last.startswith(f"gpurig: interrupted; detached from job {ident}, which goes on: "
                                           f"follow it with gpurig logs --job {ident} --follow"), last
    assert job_state(job_cli, ident)["state"] == "running"  # it went on without gpurig
    release(job_host, ident)
    assert until(job_cli, ident, lambda j: j["state"] != "running", "ended")["state"] == "succeeded"

    code, last, ident = interrupted(signal.SIGTERM, "--cancel-on-interrupt", "--grace", "2")
    assert code == 143 and last == f"gpurig: terminated (SIGTERM); cancelled job {ident} (cancelled)", last
    assert job_state(job_cli, ident)["state"] == "cancelled"


def test_two_jobs_asking_for_the_one_gpu_run_one_after_the_other(job_host, job_cli, tmp_path):
    work = workdir(tmp_path, {"hold.sh": HOLD})
    first = submit(job_cli, work, "sh", "hold.sh", flags=("--gpus", "device=0", "--name", "first"))
    until(job_cli, first["id"], lambda j: j["state"] == "running", "started")
    second = submit(job_cli, work, "sh", "hold.sh", flags=("--gpus", "device=0", "--name", "second"))
    waiting = until(job_cli, second["id"], lambda j: j["reason"].startswith("waiting"), "waited")
    assert waiting["state"] == "pending" and f"held by job {first['id']}" in waiting["reason"]
    table = job_cli("jobs").stdout.decode()
    assert "pending (1st in the queue: waiting for GPU 0" in table, table
    release(job_host, first["id"])
    a = until(job_cli, first["id"], lambda j: j["state"] == "succeeded", "succeeded")
    until(job_cli, second["id"], lambda j: j["state"] == "running", "started")
    release(job_host, second["id"])
    b = until(job_cli, second["id"], lambda j: j["state"] == "succeeded", "succeeded")
    assert b["started_at"] >= a["ended_at"] and a["devices"] == b["devices"] == ["0"]
    # a count takes a free GPU: with a job on GPU 0, a --gpus 1 job gets GPU 1 at once
    third = submit(job_cli, work, "sh", "hold.sh", flags=("--gpus", "device=0"))
    until(job_cli, third["id"], lambda j: j["state"] == "running", "started")
    fourth = submit(job_cli, work, "sh", "hold.sh", flags=("--gpus", "1"))
    got = until(job_cli, fourth["id"], lambda j: j["state"] != "pending", "started")
    assert got["state"] == "running" and got["devices"] == ["1"], got


@pytest.fixture
def box_image(docker_engine, container_kit):
    """The job image made on this machine too (deploy moves images from where they were built), removed afterwards."""
    ref = f"gpurig-test-jobbox:{container_kit.session}"
    subprocess.run(["sh", "-s", "--", ref, *JOB_BINARIES], input=IMAGE_SCRIPT, text=True, check=True, capture_output=True,
                   env={**os.environ, "PATH": f"{Path(docker_engine.path).parent}:{os.environ.get('PATH', '')}"})
    try:
        yield ref
    finally:
        docker_engine("image", "rm", "-f", ref, check=False)


def test_cancel_stops_the_jobs_process_group_and_leaves_the_deployed_container(job_host, job_cli, deploy_inventory, tmp_path, gpurig_cli,
                                                                                 box_image):
    inv = deploy_inventory({"gpurig_containers": [{"variant": "slim", "name": "box", "image": box_image, "gpus": "none",
                                                   "ulimits": {"memlock": 8388608}}]})
    deployed = gpurig_cli("deploy", "-i", str(inv), env={"GPURIG_ROOT": str(REPO)})
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    work = workdir(tmp_path, {"tree.sh": "sleep 1001 & sleep 1002 & echo children; wait\n"})
    proc = job_cli("run", "--container", "box", "--workdir", str(work), "--json", "-", "--", "sh", "tree.sh")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    ident = json.loads(proc.stdout)["job"]["id"]
    until(job_cli, ident, lambda j: j["state"] == "running", "started")
    count = "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $f 2>/dev/null; echo; done | grep -c '^sleep 100[12] ' || true"
    end = time.monotonic() + 30
    while int(job_host.sh(count).stdout.strip() or 0) < 2:
        assert time.monotonic() < end, f"the job's children never started: {job_state(job_cli, ident)}"
        time.sleep(0.2)  # polling for the job's processes with a deadline
    cancelled = job_cli("cancel", ident[:5], "--grace", "2")
    assert cancelled.returncode == 0 and b"cancelled" in cancelled.stdout, cancelled.stderr.decode()
    assert job_state(job_cli, ident)["state"] == "cancelled"
    assert int(job_host.sh(count).stdout.strip()) == 0  # the whole tree, not only the shell
    assert job_host.inspect("box")["State"]["Running"]
    again = job_cli("cancel", ident)
    assert again.returncode == 0 and b"already" in again.stdout


def test_a_workdir_with_links_out_of_the_tree_and_a_fifo_is_synced_without_them(job_host, job_cli, tmp_path):
    work = workdir(tmp_path, {"ok.txt": "fine\n"})
    (work / "escape").symlink_to("/etc")
    (tmp_path / "secret.txt").write_text("not for the host\n")
    (work / "up").symlink_to("../secret.txt")
    (work / "inside").symlink_to("ok.txt")
    os.mkfifo(work / "pipe")
    proc = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--gpus", "none", "--workdir", str(work), "--wait", "--",
                   "sh", "-c", "ls -A; cat inside")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    err = proc.stderr.decode()
    assert "escape: is an absolute symlink" in err and "up: " in err and "outside" in err and "pipe: is a FIFO" in err
    assert proc.stdout.decode().splitlines() == ["inside", "ok.txt", "fine"]


def test_check_mode_says_what_would_be_synced_and_changes_nothing(job_host, job_cli, tmp_path):
    work = workdir(tmp_path, {"a.py": "1\n", "b.py": "2\n"})
    proc = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--workdir", str(work), "--check", "--", "true")
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"would submit" in proc.stdout and b"2 changed" in proc.stdout
    assert job_host.sh("ls /srv/gpurig/jobs /srv/gpurig/sync 2>&1", check=False).returncode != 0


def test_a_full_disk_while_syncing_is_one_line_and_the_last_copy_stays(job_host, job_cli, tmp_path):
    work = workdir(tmp_path, {"small.txt": "v1\n"})
    submit(job_cli, work, "true", flags=("--gpus", "none"))
    job_host.sh("set -e; cp -a /srv/gpurig/sync /tmp/sync-copy; mount -t tmpfs -o size=512k tmpfs /srv/gpurig/sync; "
                "cp -a /tmp/sync-copy/. /srv/gpurig/sync/")
    (work / "small.txt").write_text("v2\n")
    (work / "big.bin").write_bytes(os.urandom(2_000_000))
    proc = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--gpus", "none", "--workdir", str(work), "--", "true")
    assert proc.returncode == 1
    err = proc.stderr.decode()
    assert "disk is full" in err and "df -h" in err and "Traceback" not in err
    copy = job_host.sh("find /srv/gpurig/sync -type f ! -name lock -print").stdout.split()
    assert [p.split("/")[-2:] for p in copy] == [["tree", "small.txt"]]  # no half-written big.bin, no stage left
    assert job_host.sh("cat /srv/gpurig/sync/*/*/tree/small.txt").stdout == "v1\n"


def test_a_full_disk_while_fetching_is_one_line_and_nothing_is_half_written(job_host, job_cli, tmp_path):
    work = workdir(tmp_path, {"make.sh": "mkdir -p out; head -c 3000000 /dev/urandom > out/big.bin; echo done > out/small.txt\n"})
    proc = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--gpus", "none", "--workdir", str(work), "--artifacts", "out",
                   "--json", "-", "--", "sh", "make.sh")
    ident = json.loads(proc.stdout)["job"]["id"]
    until(job_cli, ident, lambda j: j["state"] == "succeeded", "succeeded")
    small = tmp_path / "small-disk"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        fetched = job_cli("fetch", ident, "--into", str(small / "dest"))
        assert fetched.returncode == 1, fetched.stderr.decode()
        err = fetched.stderr.decode()
        assert "nothing was changed there" in err and "Traceback" not in err
        left = [p for p in small.rglob("*") if p.is_file()]
        assert left == []
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_retry_runs_a_failing_script_again_and_timeout_stops_a_long_one(job_host, job_cli, tmp_path):
    work = workdir(tmp_path, {"flaky.sh": "if [ -e tried ]; then echo second try; else : > tried; echo first try; exit 1; fi\n"})
    proc = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--gpus", "none", "--workdir", str(work), "--retry", "2", "--wait",
                   "--json", "-", "--", "sh", "flaky.sh")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    out = proc.stdout.decode()
    assert out.startswith("first try\ngpurig: attempt 1 of 3 exited 1; retrying\nsecond try\n"), out
    doc = json.loads(out[out.index("{"):])["job"]
    assert doc["state"] == "succeeded" and [a["exit_code"] for a in doc["attempts"]] == [1, 0]
    slow = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--gpus", "none", "--workdir", str(work), "--timeout", "2", "--grace", "1",
                   "--retry", "1", "--wait", "--", "sleep", "60")
    assert slow.returncode in (137, 143), slow.stderr.decode()[-2000:]  # sleep as PID 1's child: TERM, or KILL after the grace
    assert "timed out after 2s" in slow.stderr.decode() and "2 attempts" in slow.stderr.decode()


def test_attach_follows_a_running_job_and_exits_with_its_code(job_host, job_cli, tmp_path):
    work = workdir(tmp_path, {"late.sh": "echo early; sleep 3; echo late; exit 5\n"})
    ident = submit(job_cli, work, "sh", "late.sh", flags=("--gpus", "none"))["id"]
    until(job_cli, ident, lambda j: j["state"] == "running", "started")
    attached = job_cli("attach", ident)
    assert attached.returncode == 5, attached.stderr.decode()[-2000:]
    assert attached.stdout.decode().endswith("late\n") and b"failed (exited 5)" in attached.stderr
    cancel_none = job_cli("cancel", "zzzzzz")
    assert cancel_none.returncode != 0 and b"no job zzzzzz" in cancel_none.stderr


def test_keep_leaves_only_the_newest_ended_jobs_of_a_working_directory(job_host, job_cli, tmp_path):
    work = workdir(tmp_path, {"a.txt": "a\n"})
    made = []
    for _ in range(3):
        proc = job_cli("run", "--image", JOB_IMAGE, *HOST_ULIMIT, "--gpus", "none", "--workdir", str(work), "--keep", "1", "--wait",
                       "--json", "-", "--", "true")
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        out = proc.stdout.decode()
        made.append(json.loads(out[out.index("{"):])["job"]["id"])
    left = job_host.sh("ls /srv/gpurig/jobs").stdout.split()
    assert left == [made[-1]], (left, made)
