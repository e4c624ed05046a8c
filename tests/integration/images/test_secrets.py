"""No secret in any layer: `docker save` of each image is read member by member."""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

import conftest
import pytest
from conftest import CUDA, docker

# A whole PEM key (libraries such as gnutls contain the marker alone, as a format string).
PRIVATE_KEY = re.compile(rb"-----BEGIN ((?:[A-Z]+ )?PRIVATE KEY)-----\s*(?:Proc-Type[^\n]*\n[^\n]*\n\s*)?[A-Za-z0-9+/=\s]{64,}-----END \1-----")
SHADOW_HASH = re.compile(rb"^[^:\n]+:\$[0-9a-z]+\$", re.M)
SCAN_LIMIT = 8 << 20  # contents of files up to 8 MiB are read; every name is checked
PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


def host_only_cas() -> list[bytes]:
    """Certificates in the host's CA bundle (the one passed as a build secret) that Debian's bundle lacks."""
    from gpurig.image.build import resolve_ca_bundle

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
    # (a line's worth that any PEM wrapping keeps whole, for a fast first look; the first 200 characters, whitespace taken out)
    extra_cas = [(body[:48], body[:200]) for body in (b"".join(ca.split()[2:-2]) for ca in host_only_cas()) if body]
    findings = []
    proc = subprocess.Popen([conftest.DOCKER, "save", ref], stdout=subprocess.PIPE)
    with tarfile.open(fileobj=proc.stdout, mode="r|") as image:
        for member in image:
            # docker save writes a layer identical to an earlier one as a symlink to it: scanned already
            if not member.name.endswith("layer.tar") or not member.isfile() or member.size == 0:
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
                    # Public test vectors, not secrets: gnutls's self-test keys inside its ELF, and the
                    # test keys some wheels ship (tornado/test/test.key).
                    shipped = data[:4] == b"\x7fELF" or re.search(r"/site-packages/[^/]+/(.+/)?tests?/", name)
                    if b"PRIVATE KEY-----" in data and PRIVATE_KEY.search(data) and not shipped:
                        findings.append(f"{member.name}: private key in {name}")
                    if name.endswith("etc/shadow") and SHADOW_HASH.search(data):
                        findings.append(f"{member.name}: password hash in {name}")
                    for line, ca in extra_cas:  # joining every file's words cost a minute of CPU on the 7 GB CUDA image
                        if line in data and ca in b"".join(data.split()):
                            findings.append(f"{member.name}: the host's CA bundle in {name}")
    proc.wait(timeout=60)
    return findings


@pytest.mark.parametrize("variant,cuda", [("slim", "cpu"), ("ssh", "cpu"), ("jupyter", "cpu"),
                                          pytest.param("full", CUDA, marks=pytest.mark.slow)])
def test_no_secret_in_any_layer(build, variant, cuda):
    image = build(variant, cuda)
    assert scan(image.ref, ssh=variant in ("ssh", "full")) == []


def test_the_scan_finds_a_planted_key_and_ca(base, tmp_path):
    """The scanner itself: an image with a private key and the host's CA bundle copied in is caught."""
    found, _ = base
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id")], check=True)
    from gpurig.image.build import resolve_ca_bundle

    bundle = resolve_ca_bundle("auto")
    lines = [f"FROM {found.ref}", "COPY id /root/.ssh/id_ed25519"]
    if bundle:
        (tmp_path / "ca.pem").write_bytes(bundle.read_bytes())
        lines.append("COPY ca.pem /usr/local/share/ca.pem")
    (tmp_path / "Dockerfile").write_text("\n".join(lines) + "\n")
    ref = f"gpurig-test-planted:{conftest.SESSION}"
    docker("build", "-q", "--label", f"{conftest.TEST_LABEL}={conftest.SESSION}", "-t", ref, str(tmp_path))
    findings = scan(ref, ssh=False)
    assert any("private key in ./root/.ssh/id_ed25519" in f or "private key in root/.ssh/id_ed25519" in f for f in findings)
    if bundle and host_only_cas():
        assert any("CA bundle in" in f for f in findings)
