"""The git remote recorded in an image (label, context JSON) never carries its user:token@."""

import json
import subprocess

import pytest

from gpurig.image.render import render
from gpurig.image.spec import load_spec

SOURCE = "org.opencontainers.image.source"


@pytest.mark.parametrize(
    "remote,recorded",
    [
        ("https://bob:ghp_s3cretT0ken@git.example.com/ml/images.git", "https://git.example.com/ml/images.git"),
        ("https://ghp_s3cretT0ken@git.example.com:8443/ml/images.git", "https://git.example.com:8443/ml/images.git"),
        ("ssh://deploy:s3cretT0ken@git.example.com/ml/images.git", "ssh://git.example.com/ml/images.git"),
    ],
)
def test_remote_credentials_are_stripped_from_labels_and_context(project, remote, recorded):
    for args in (["init", "-q"], ["remote", "add", "origin", remote]):
        subprocess.run(["git", "-C", str(project), *args], check=True, capture_output=True)
    spec = load_spec(project / "images" / "pytorch.yaml")
    context = render(spec, spec.default, "slim", project, project / "build-contexts")
    assert context.labels[SOURCE] == recorded
    meta = (context.path / "gpurig-context.json").read_text()
    assert json.loads(meta)["labels"][SOURCE] == recorded
    dockerfile = context.dockerfile.read_text()
    assert f'{SOURCE}="{recorded}"' in dockerfile
    for text in (meta, dockerfile):
        assert "s3cretT0ken" not in text
