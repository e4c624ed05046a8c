"""The local connection, known_hosts handling and target resolution, without any sshd."""

from __future__ import annotations

import multiprocessing
import shutil
import subprocess
import threading
import time
from pathlib import Path

import paramiko
import pytest

from gpurig.connection import (
    CommandError,
    CommandTimeout,
    Connector,
    HostKeyError,
    KnownHosts,
    SSHSettings,
    SSHTarget,
    fingerprint,
    to_shell,
)
from gpurig.errors import HostError
from gpurig.inventory import Host


def local_host() -> Host:
    return Host(name="localhost", groups=("ungrouped",), vars={}, address="localhost", connection="local")


@pytest.fixture
def local(tmp_path):
    return Connector(SSHSettings(project_known_hosts=tmp_path / "kh", user_known_hosts=None, ssh_config=None)).open(local_host())


def test_local_run_gives_output_and_exit_code(local):
    r = local.run("echo out; echo err >&2; exit 5", warn=True)
    assert (r.exited, r.stdout, r.stderr, r.host) == (5, "out\n", "err\n", "localhost")
    with pytest.raises(CommandError, match="exited 5"):
        local.run("exit 5")


def test_local_run_quotes_list_arguments(local, tmp_path):
    marker = tmp_path / "x"
    word = f"$(touch {marker}); `touch {marker}` ' \" \\"
    assert local.run(["printf", "%s", word]).stdout == word
    assert not marker.exists()
    assert to_shell(["echo", "a b", "c;d"]) == "echo 'a b' 'c;d'"


def test_local_command_timeout_kills_the_process_group(local):
    start = time.monotonic()
    with pytest.raises(CommandTimeout, match="within 0.5s"):
        local.run("sleep 30 & sleep 30", timeout=0.5)
    assert time.monotonic() - start < 5


def test_local_stdin_is_closed(local):
    assert local.run("cat; echo done", timeout=5).stdout == "done\n"


def test_local_streams_chunks_as_they_come(local):
    chunks = []
    local.run("printf 'é'; printf 'x' >&2", on_output=lambda stream, text: chunks.append((stream, text)))
    assert ("stdout", "é") in chunks and ("stderr", "x") in chunks


def test_local_put_and_get_are_atomic_copies(local, tmp_path):
    src = tmp_path / "a"
    src.write_text("hello")
    local.put(src, str(tmp_path / "b"), mode=0o640)
    assert (tmp_path / "b").read_text() == "hello" and oct((tmp_path / "b").stat().st_mode & 0o777) == "0o640"
    local.get(str(tmp_path / "b"), tmp_path / "c")
    assert (tmp_path / "c").read_text() == "hello"
    assert not list(tmp_path.glob("*.gpurig-tmp"))
    with pytest.raises(HostError, match="cannot copy"):
        local.put(src, str(tmp_path / "missing-dir" / "x"))


@pytest.mark.skipif(shutil.which("sudo") is None, reason="sudo not installed")
def test_local_sudo_runs_as_root(local):
    assert local.sudo(["id", "-u"]).stdout.strip() == "0"


def _pub_key(tmp_path: Path, name: str) -> paramiko.PKey:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
    return paramiko.PKey.from_path(str(tmp_path / name))


def _target(port: int) -> SSHTarget:
    return SSHTarget(name=f"h{port}", hostname="127.0.0.1", port=port, user="root", key_files=())


def test_fingerprint_matches_ssh_keygen(tmp_path):
    key = _pub_key(tmp_path, "k")
    expected = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True).stdout.split()[1]
    assert fingerprint(key) == expected


def test_accept_new_from_many_threads_and_processes_loses_no_line(tmp_path):
    keys = [_pub_key(tmp_path, f"k{i}") for i in range(4)]
    project = tmp_path / "inv" / "known_hosts"
    stores = [KnownHosts(project, None, "accept-new") for _ in range(2)]  # two "processes" with their own caches
    threads = [threading.Thread(target=stores[i % 2].check, args=(_target(2200 + i), keys[i % 4])) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=KnownHosts(project, None, "accept-new").check, args=(_target(3000 + i), keys[0])) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    lines = project.read_text().splitlines()
    assert len(lines) == 48 and len(set(lines)) == 48
    assert all(len(line.split()) == 3 for line in lines)
    assert not list(project.parent.glob(".known_hosts.*"))  # no temp file left behind


def test_changed_key_names_both_fingerprints_and_the_file(tmp_path):
    old, new = _pub_key(tmp_path, "old"), _pub_key(tmp_path, "new")
    project = tmp_path / "known_hosts"
    KnownHosts(project, None, "accept-new").check(_target(22), old)
    with pytest.raises(HostKeyError) as err:
        KnownHosts(project, None, "accept-new").check(_target(22), new)
    assert fingerprint(old) in str(err.value) and fingerprint(new) in str(err.value)
    assert f"ssh-keygen -R 127.0.0.1 -f {project}" in err.value.fix


def test_user_known_hosts_is_read_but_never_written(tmp_path):
    key = _pub_key(tmp_path, "k")
    user = tmp_path / "user_known_hosts"
    user.write_text(f"[127.0.0.1]:2222 {key.get_name()} {key.get_base64()}\n")
    store = KnownHosts(tmp_path / "project", user, "strict")
    store.check(_target(2222), key)  # known from the user's file: accepted under strict
    assert not (tmp_path / "project").exists()


def test_unknown_policy_is_refused():
    with pytest.raises(HostError, match="unknown host-key policy 'yes'"):
        SSHSettings(host_key_policy="yes")


def test_ssh_config_fills_what_the_inventory_leaves_out(tmp_path):
    config = tmp_path / "config"
    config.write_text(
        "Host gpu-*\n  HostName 10.1.2.3\n  User alice\n  Port 2200\n  IdentityFile ~/.ssh/gpu_key\n  ProxyJump ops@bastion:2022\n"
        "Host bastion\n  HostName 192.0.2.10\n  IdentityFile /keys/bastion\n"
    )
    c = Connector(SSHSettings(project_known_hosts=tmp_path / "kh", user_known_hosts=None, ssh_config=config))
    t = c.target(Host(name="gpu-1", groups=(), vars={}, address="gpu-1"))
    assert (t.hostname, t.port, t.user) == ("10.1.2.3", 2200, "alice")
    assert t.key_files == (str(Path("~/.ssh/gpu_key").expanduser()),)
    assert [(j.hostname, j.port, j.user, j.key_files) for j in t.jumps] == [("192.0.2.10", 2022, "ops", ("/keys/bastion",))]
    # Inventory vars win over the config, as ssh's command-line options do.
    t = c.target(Host(name="gpu-1", groups=(), vars={}, address="gpu-1", port=22, user="bob", key_file="/k"))
    assert (t.port, t.user, t.key_files[0]) == (22, "bob", "/k")


@pytest.mark.parametrize(
    "args,jump",
    [("-J ops@b:22", "ops@b:22"), ("-o ProxyJump=b1,b2", "b1,b2"), ("-o 'ProxyJump b'", "b"), ("-oProxyJump=b", "b"), ("-C -o Compression=yes", None)],
)
def test_proxy_jump_from_ansible_ssh_args(tmp_path, args, jump):
    c = Connector(SSHSettings(project_known_hosts=tmp_path / "kh", user_known_hosts=None, ssh_config=None))
    t = c.target(Host(name="h", groups=(), vars={"ansible_ssh_common_args": args}, address="10.0.0.1"))
    got = ",".join(f"{j.user}@{j.hostname}:{j.port}" if j.user else j.hostname for j in t.jumps) or None
    if jump is None:
        assert got is None
    else:
        assert len(t.jumps) == len(jump.split(","))
        assert t.jumps[0].hostname == jump.split(",")[0].rpartition("@")[2].split(":")[0]
