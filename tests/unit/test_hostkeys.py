"""known_hosts: fingerprints, the three policies, changed keys, concurrent accept-new writes."""

from __future__ import annotations

import multiprocessing
import subprocess
import threading
import time
from pathlib import Path

import paramiko
import pytest

from gpurig.connect.connection import HostKeyError
from gpurig.connect.hostkeys import KnownHosts, fingerprint
from gpurig.connect.ssh import SSHSettings
from gpurig.connect.target import SSHTarget
from gpurig.errors import HostError


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


def test_unknown_policy_is_refused(tmp_path):
    with pytest.raises(HostError, match="unknown host-key policy 'yes'"):
        SSHSettings(host_key_policy="yes")
    with pytest.raises(HostError, match="unknown host-key policy 'yes'"):
        KnownHosts(tmp_path / "kh", None, "yes")


def test_strict_refuses_an_unknown_key_and_off_accepts_it_without_recording(tmp_path):
    key = _pub_key(tmp_path, "k")
    project = tmp_path / "known_hosts"
    with pytest.raises(HostKeyError, match="policy is strict") as err:
        KnownHosts(project, None, "strict").check(_target(2222), key)
    assert fingerprint(key) in str(err.value) and "ssh-keyscan -p 2222 127.0.0.1" in err.value.fix
    KnownHosts(project, None, "off").check(_target(2222), key)
    assert not project.exists()


def test_recorded_key_types_come_first(tmp_path):
    key = _pub_key(tmp_path, "k")
    project = tmp_path / "known_hosts"
    KnownHosts(project, None, "accept-new").check(_target(2222), key)
    assert KnownHosts(project, None, "strict").known_types("[127.0.0.1]:2222") == ["ssh-ed25519"]
    assert KnownHosts(project, None, "strict").known_types("[127.0.0.1]:2223") == []


def test_a_name_hashed_by_openssh_is_recognised_and_a_changed_key_still_stops_the_host(tmp_path):
    """The user's ~/.ssh/known_hosts as Debian's ssh writes it (HashKnownHosts yes): ssh-keygen -H hashes the names."""
    key, other = _pub_key(tmp_path, "k"), _pub_key(tmp_path, "o")
    user = tmp_path / "user_known_hosts"
    user.write_text(f"[127.0.0.1]:2222 {key.get_name()} {key.get_base64()}\n127.0.0.1 {other.get_name()} {other.get_base64()}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(user)], check=True, capture_output=True)
    assert "127.0.0.1" not in user.read_text()  # only hashes are left
    known = KnownHosts(tmp_path / "project", user, "strict")
    known.check(_target(2222), key)
    assert known.known_types("[127.0.0.1]:2222") == ["ssh-ed25519"] and known.known_types("[127.0.0.1]:2223") == []
    with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
        known.check(_target(2222), other)


def test_a_known_hosts_file_of_ten_thousand_hosts_costs_little_to_load_and_to_look_up(tmp_path):
    """A 10,000-host project: paramiko's HostKeys scans every line per lookup and per loaded line (17 s of CPU here)."""
    key = _pub_key(tmp_path, "k")
    project = tmp_path / "known_hosts"
    project.write_text("".join(f"10.0.{i // 250}.{i % 250} {key.get_name()} {key.get_base64()}\n" for i in range(10_000)))
    start = time.process_time()
    known = KnownHosts(project, None, "strict")
    for i in range(10_000):
        known.check(SSHTarget(name=f"h{i}", hostname=f"10.0.{i // 250}.{i % 250}", port=22, user="root", key_files=()), key)
    assert time.process_time() - start < 3.0  # about 0.13 s here; HostKeys took 16.9 s


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_known_hosts_that_is_no_regular_file_is_one_line_not_a_hang(tmp_path, kind):
    import os

    user = tmp_path / "known_hosts"
    if kind == "fifo":
        os.mkfifo(user)  # nobody writes to it: a plain read would wait for ever
    elif kind == "device":
        user.symlink_to("/dev/zero")  # never ends
    else:
        user.mkdir()
    loaded: list[BaseException] = []

    def load() -> None:
        try:
            KnownHosts(tmp_path / "project_known_hosts", user, "accept-new")
        except HostError as err:
            loaded.append(err)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(10)
    assert not loader.is_alive(), "reading known_hosts hung"
    assert loaded and "is not a regular file" in loaded[0].problem and str(user) in loaded[0].problem
