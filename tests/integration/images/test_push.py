"""--push to a real local registry (Debian's docker-registry): the report's digest pulls the same image back."""

from __future__ import annotations

import json

from conftest import CPU_TORCH, SESSION, SPEC_NAME, TEST_LABEL, docker, write_spec


def test_push_records_the_digest_and_pulls_back_by_it(build, cli, registry, wheels):
    local = build("slim")  # the layers are cached: the push build only retags
    spec = write_spec(cli.project / "push.yaml", wheels, registry=f"{registry}/ml")
    proc = cli("build", "--spec", str(spec), "--variant", "slim", "--cuda", "cpu", "--push",
               "--label", f"{TEST_LABEL}={SESSION}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    report = json.loads((cli.project / "reports/builds" / SPEC_NAME / f"{CPU_TORCH}-cpu-slim.json").read_text())
    ref = f"{registry}/ml/{SPEC_NAME}"
    assert report["pushed"] == [f"{ref}:{CPU_TORCH}-cpu-slim", f"{ref}:slim-cpu"]
    assert report["digest"].startswith("sha256:") and report["image_id"] == local.report["image_id"]
    assert report["steps"]["ran"] == 0
    docker("image", "rm", f"{ref}:{CPU_TORCH}-cpu-slim", f"{ref}:slim-cpu")
    pulled = docker("pull", f"{ref}@{report['digest']}")
    assert report["digest"] in pulled.stdout
    inspected = json.loads(docker("image", "inspect", f"{ref}@{report['digest']}").stdout)[0]
    assert inspected["Id"] == report["image_id"]
