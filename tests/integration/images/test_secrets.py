"""No secret in any layer: `docker save` of each image is read member by member."""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import CUDA, DOCKER, docker
import conftest

PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")
SHADOW_HASH = re.compile(rb"^[^:\n]+:\$[0-9a-z]+\$", re.M)
SCAN_LIMIT = 8 << 20  # contents of files up to 8 MiB are read; every name is checked
PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def host_only_cas() -> list[bytes]:
    """Certificates in the host's CA bundle (the one passed as a build secret) that Debian's bundle lacks."""
    from gpurig.build import resolve_ca_bundle

    bundle = resolve_ca_bundle("auto")
    if bundle is None:
        return []
    debian = Path("/usr/share/ca-certificates")
    known = set()
    for crt in debian.rglob("*.crt"):
        known.update(b"".join(m.group(0).split()) for m in PEM.finditer(crt.read_bytes()))
    return [m.group(0) for m in PEM.finditer(bundle.read_bytes()) if b"".join(m.group(0).split()) not in known]


def scan(ref: str, ssh: bool) -> list[str]:
    """Findings in the layers of ``ref``."""
    extra_cas = [b"".join(ca.split()[2:-2])[:200] for ca in host_only_cas()]
    findings = []
    proc = subprocess.Popen([conftest.DOCKER, "save", ref], stdout=subprocess.PIPE)
    with tarfile.open(fileobj=proc.stdout, mode="r|") as image:
        for member in image:
            if not member.name.endswith("layer.tar"):
                continue
            with tarfile.open(fileobj=image.extractfile(member), mode="r|") as layer:
                for entry in layer:
                    name = entry.name
                    if re.search(r"(^|/)run/secrets/|jupyter_token|authorized_keys$", name):
                        findings.append(f"{member.name}: {name}")
                    if ssh and re.match(r"(\./)?etc/ssh/ssh_host_.*key", name):
                        findings.append(f"{member.name}: host key {name}")
                    if not entry.isfile() or entry.size > SCAN_LIMIT:
                        continue
                    data = layer.extractfile(entry).read()
                    if PRIVATE_KEY.search(data):
                        findings.append(f"{member.name}: private key in {name}")
                    if name.endswith("etc/shadow") and SHADOW_HASH.search(data):
                        findings.append(f"{member.name}: password hash in {name}")
                    compact = b"".join(data.split())
                    for ca in extra_cas:
                        if ca and ca in compact:
                            findings.append(f"{member.name}: the host's CA bundle in {name}")
    proc.wait()
    return findings


@pytest.mark.parametrize("variant,cuda", [("slim", "cpu"), ("ssh", "cpu"), ("jupyter", "cpu"),
                                          pytest.param("full", CUDA, marks=pytest.mark.slow)])
def test_no_secret_in_any_layer(build, variant, cuda):
    image = build(variant, cuda)
    assert scan(image.ref, ssh=variant in ("ssh", "full")) == []
