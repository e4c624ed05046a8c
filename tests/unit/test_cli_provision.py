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
