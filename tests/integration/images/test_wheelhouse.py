"""A build from a local wheelhouse whose torch index cannot be reached never waits on that index."""

from __future__ import annotations

import re

from conftest import CPU_TORCH, SESSION, SPEC_NAME, TEST_LABEL

# TEST-NET-1 (RFC 5737): routed nowhere, so a pip that asked it would retry until its timeouts ran out
UNREACHABLE = "http://192.0.2.1/whl/{cuda_tag}"


def test_a_wheelhouse_build_never_asks_the_unreachable_torch_index(cli, base):
    # seen: with find_links set, every pip step still retried the torch index (702 s in one silent step)
    name = f"{SPEC_NAME}-wh"
    spec = cli.project / "images" / "wheelhouse.yaml"
    text = (cli.project / "images" / "pytorch.yaml").read_text()
    spec.write_text(text.replace(f"name: {SPEC_NAME}", f"name: {name}").replace('torch_index: ""', f'torch_index: "{UNREACHABLE}"'))
    try:
        proc = cli("build", "--spec", str(spec), "--variant", "slim", "--cuda", "cpu", "--label", f"{TEST_LABEL}={SESSION}")
    finally:
        spec.unlink()
    assert proc.returncode == 0, f"gpurig build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    tag = f"{CPU_TORCH}-cpu-slim"
    dockerfile = (cli.project / "build-contexts" / name / tag / "Dockerfile").read_text()
    pip_steps = [line for line in re.sub(r"\\\n", " ", dockerfile).splitlines() if "pip install" in line]
    assert pip_steps and not any("192.0.2.1" in s or "index-url" in s for s in pip_steps), pip_steps
    log = (cli.project / "reports" / "builds" / name / f"{tag}.log").read_text()
    assert "192.0.2.1" not in log and "Retrying" not in log, "pip waited on the torch index"
