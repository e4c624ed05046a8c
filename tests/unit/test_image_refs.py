"""A reference's name and tag as Docker reads them: a registry's port is not a tag, a digest is kept whole."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpurig.connect.engineinfo import name_and_tag


@pytest.mark.parametrize(("ref", "want"), [
    ("repo", ("repo", "latest")),
    ("repo:2.13.0-cpu-slim", ("repo", "2.13.0-cpu-slim")),
    ("registry.lan:5000/team/repo", ("registry.lan:5000/team/repo", "latest")),
    ("registry.lan:5000/team/repo:slim", ("registry.lan:5000/team/repo", "slim")),
    ("repo@sha256:" + "a" * 64, ("repo", "sha256:" + "a" * 64)),
    ("127.0.0.1:5000/repo@sha256:" + "b" * 64, ("127.0.0.1:5000/repo", "sha256:" + "b" * 64)),
    ("repo:", ("repo", "latest")),
])
def test_name_and_tag(ref, want):
    assert name_and_tag(ref) == want


def test_reading_facts_readiness_does_not_load_docker_py():
    """Every command that reads facts imports this module: docker-py and requests (~170 modules) load only where a Docker verb runs."""
    code = "import sys, gpurig.facts.readiness; print(sorted({m.split('.')[0] for m in sys.modules} & {'docker', 'requests', 'urllib3'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
