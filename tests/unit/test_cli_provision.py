"""`gpurig provision` refuses a bad host profile with one line before contacting any host."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from test_cli import assert_one_line_error, gpurig


@pytest.fixture
def listener():
    """A port that would see any connection attempt."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


def inventory(tmp_path: Path, port: int, **vars) -> Path:
    hosts = {"ok-host": {"ansible_host": "127.0.0.1", "ansible_port": port},
             "bad-host": {"ansible_host": "127.0.0.1", "ansible_port": port, **vars}}
    path = tmp_path / "inventory" / "hosts.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


@pytest.mark.parametrize(
    "vars, fragments",
    [
        ({"gpurig_deamon": {"log-driver": "local"}}, ("host bad-host: gpurig_deamon", "did you mean 'gpurig_daemon'?")),
        ({"gpurig_daemon": {"log-driver": "local"}, "gpurig_gpu_count": True}, ("gpurig_gpu_count must be a whole number",)),
        ({"gpurig_daemon": {"log-drvier": "local"}}, ("gpurig_daemon.log-drvier", "did you mean 'log-driver'?")),
        ({"gpurig_daemon": {"mtu": float("nan")}}, ("gpurig_daemon.mtu is nan, which JSON cannot hold",)),
    ],
)
def test_bad_profile_is_one_line_and_no_host_is_contacted(tmp_path, listener, vars, fragments):
    path = inventory(tmp_path, listener.getsockname()[1], **vars)
    proc = gpurig(tmp_path, "provision", "--inventory", str(path))
    assert_one_line_error(proc, str(path), *fragments)
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody knocked
    assert not (path.parent / "known_hosts").exists()


CONTAINER_TYPO = {"gpurig_containers": [{"variant": "jupyter", "prots": ["8888:8888"]}]}


@pytest.mark.parametrize("task", [["provision", "--check"], ["facts"], ["status"], ["exec", "--", "true"], ["verify"]])
def test_a_misspelt_container_key_stops_every_task_before_any_host(tmp_path, listener, task):
    """Seen: `provision --check` passed an inventory whose gpurig_containers deploy later refused."""
    path = inventory(tmp_path, listener.getsockname()[1], **CONTAINER_TYPO)
    proc = gpurig(tmp_path, *task[:1], "--inventory", str(path), *task[1:])
    assert_one_line_error(proc, str(path), "host bad-host: gpurig_containers[0]: unknown key 'prots'", "did you mean 'ports'?")
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_container_rules_that_need_no_image_spec_are_checked_outside_deploy(tmp_path, listener):
    bad = {"gpurig_containers": [{"variant": "jupyter", "ports": ["8888:8888"]}, {"variant": "ssh", "ports": ["8888:22"]}]}
    path = inventory(tmp_path, listener.getsockname()[1], **bad)
    proc = gpurig(tmp_path, "provision", "--check", "--inventory", str(path))
    assert_one_line_error(proc, "gpurig_containers[1]", "publishes")
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_an_unknown_step_gets_a_did_you_mean(tmp_path):
    proc = gpurig(tmp_path, "provision", "--only", "dockr")
    assert_one_line_error(proc, "--only dockr: no such step (did you mean 'docker'?)")
