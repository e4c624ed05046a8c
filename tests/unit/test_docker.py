"""gpurig.image.dockercli's pure parts: which docker client can build with BuildKit, and stopping a child on the way out."""

from __future__ import annotations

import sys

import pytest

from gpurig.errors import DockerError
from gpurig.image import dockercli as d


@pytest.mark.parametrize(
    "version,buildx,ok",
    [
        ("20.10.24", False, True),  # Debian's docker.io: BuildKit built in
        ("18.09.0", False, True),
        ("18.06.1", False, False),  # before BuildKit
        ("28.2.2", False, False),  # a 23+ client without the buildx plugin refuses BuildKit
        ("28.2.2", True, True),
        ("", False, False),
    ],
)
def test_which_clients_can_build_with_buildkit(version, buildx, ok):
    assert d.supports_buildkit(version, buildx) is ok


def test_client_version_is_read_from_docker_version_output():
    assert d.parse_client_version("Docker version 20.10.24+dfsg1, build 297e128") == "20.10.24"
    assert d.parse_client_version("Docker version 28.2.2, build e6534b4") == "28.2.2"
    assert d.parse_client_version("garbage") == ""


def test_the_first_capable_client_on_path_is_chosen():
    new = d.DockerClient("/usr/local/bin/docker", "28.2.2", False)
    old = d.DockerClient("/usr/bin/docker", "20.10.24", False)
    assert d.choose_client([new, old]) == old


def test_no_capable_client_says_what_to_install():
    with pytest.raises(DockerError) as err:
        d.choose_client([d.DockerClient("/usr/local/bin/docker", "28.2.2", False)])
    assert "/usr/local/bin/docker (28.2.2, no buildx)" in err.value.problem and "buildx" in err.value.fix
    with pytest.raises(DockerError, match="docker is not installed"):
        d.choose_client([])


def test_docker_candidates_lists_each_binary_once_in_path_order(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        (folder / "docker").write_text("#!/bin/sh\n")
        (folder / "docker").chmod(0o755)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "docker").symlink_to(first / "docker")
    path = f"{second}:{tmp_path / 'c'}:{first}:{tmp_path / 'missing'}"
    assert d.docker_candidates(path) == [str(second / "docker"), str(tmp_path / "c" / "docker")]


def test_last_line_is_the_reason_a_tool_gives():
    assert d.last_line("Pulling...\n\nError: manifest unknown\n  \n") == "Error: manifest unknown"
    assert d.last_line("", "exit 1") == "exit 1"


def test_a_streamed_child_is_stopped_and_reaped_when_the_caller_is_interrupted():
    client = d.DockerClient(sys.executable, "20.10.24", False)
    script = "import sys, time; print('started', flush=True); time.sleep(600)"
    with pytest.raises(KeyboardInterrupt):
        with client.stream(["-c", script]) as proc:
            assert proc.stdout.readline().strip() == "started"
            raise KeyboardInterrupt
    assert proc.returncode == -15  # SIGTERM, waited for: no zombie, nothing left running

