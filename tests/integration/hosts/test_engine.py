"""The Docker engine API over gpurig's own SSH transport (``docker system dial-stdio`` on a checked channel).

The sshd farm runs on this machine, so the engine at the far end of the SSH
channel is this machine's own: what the API says is compared with what the
local docker CLI says.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from gpurig.connect.engine import EngineError
from gpurig.connect.engineopen import open_engine


@pytest.fixture
def engine_conn(connector, make_host, sshd, docker_engine):
    conn = connector.open(dataclasses.replace(make_host(sshd.port), become=True))
    yield conn
    conn.close()


def test_engine_answers_over_ssh_with_the_hosts_own_figures(engine_conn, docker_engine):
    with open_engine(engine_conn) as engine:
        info = engine.info()
    assert "runc" in info.runtimes
    expected = docker_engine("info", "--format", "{{.ServerVersion}} {{.DockerRootDir}}").stdout.split()
    assert [info.server_version, info.root_dir] == expected


def test_containers_logs_and_images_through_the_stream(engine_conn, docker_engine, host_image):
    label = f"io.gpurig.test.engine={uuid.uuid4().hex[:8]}"
    with open_engine(engine_conn) as engine:
        assert engine.image("gpurig-no-such-image:never") is None
        image = engine.image(host_image)
        assert image is not None and host_image in image.tags
        body = {"Image": host_image, "Cmd": ["sh", "-c", "echo 'out $(id)'; echo err >&2"], "Labels": {label.split("=")[0]: label.split("=")[1]}}
        created = engine.create(body, f"gpurig-test-{label.rsplit('=', 1)[1]}")
        try:
            engine.start(created)
            assert engine.wait(created, timeout=60) == 0
            logs = engine.logs(created)
            assert "out $(id)" in logs and "err" in logs
            listed = engine.containers(label=label)
            assert [c.id for c in listed] == [created]
            assert listed[0].status == "exited" and listed[0].exit_code == 0
            assert listed[0].image_id == image.id
        finally:
            engine.remove(created)
        assert engine.container(created) is None


def test_a_login_without_become_or_docker_group_gets_the_fix(connector, make_host, sshd, docker_engine):
    conn = connector.open(make_host(sshd.port))
    try:
        with pytest.raises(EngineError) as err:
            open_engine(conn)
    finally:
        conn.close()
    assert "may not use the Docker socket" in str(err.value)
    assert "ansible_become" in err.value.fix


def test_a_pooled_stream_whose_engine_restarted_is_opened_again(engine_conn):
    """A channel whose dial-stdio ended (its process killed, as a dockerd restart does) is not reused."""
    with open_engine(engine_conn) as engine:
        engine.info()
        pooled = engine._api._custom_adapter._pool  # the stream adapter's own pool: white-box, as the bug was there
        conn = pooled.pool.queue[-1]
        conn.sock.close()  # what the host's end going away leaves: a closed channel in the pool
        assert engine.info().server_version  # no "Socket is closed" error: a new stream was opened
