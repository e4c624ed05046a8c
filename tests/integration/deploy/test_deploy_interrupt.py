"""Ctrl-C during `gpurig deploy` mid transfer: it ends within seconds, no name sits on a half-moved image, the next deploy completes.

The transfer interrupted is the push of the CPU slim image into gpurig's own
registry (a fresh cache under the test's HOME: every layer moves), the phase
seen to keep a process alive for minutes after its summary. The host's and
this machine's engines are looked at through `docker`, not through gpurig.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from systemd_kit import interrupt_when

from .gpuhost import REPO
from .test_delivery import bare, host_images
from .test_deploy import entries, run


def test_ctrl_c_mid_push_ends_within_seconds_names_nothing_half_moved_and_the_next_deploy_completes(
        deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images, docker_engine, tmp_path):
    host, slim = clean_deploy_host, cpu_images["slim"]
    bare(host)
    inventory = deploy_inventory(entries({"variant": "slim", "cuda": "cpu"}))
    cache = tmp_path / ".cache" / "gpurig" / "registry"  # under HOME=tmp_path: empty, so the whole image is pushed
    env = {**os.environ, "HOME": str(tmp_path), "COLUMNS": "200", "PYTHONPATH": str(REPO), "GPURIG_ROOT": str(cpu_images.project)}
    env.pop("SSH_AUTH_SOCK", None)
    env.pop("XDG_CACHE_HOME", None)  # not the session's registry cache (tests/integration/conftest.py): this one starts empty
    code = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
    proc = subprocess.Popen([sys.executable, "-c", code, "deploy", "-i", str(inventory), "--json", "interrupted.json"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the push is under way once the registry holds the first layer's bytes
    out, err, took = interrupt_when(proc, lambda: any(p.is_file() for p in (cache / "data").rglob("data")), "the push into the local registry")
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "gpurig: interrupted", out + err
    assert took < 15, f"deploy took {took:.1f} s to end after Ctrl-C"
    doc = json.loads((tmp_path / "interrupted.json").read_text())
    assert doc["interrupted"] is True
    local_names = docker_engine("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    # the push's temporary name (registry/gpurig/deliver:SPEC_TAG) was taken off again; the engine is the machine's, where
    # another worker's deploy test may be pushing its own project's image at the same moment
    assert not [n for n in local_names if n.partition("/gpurig/deliver:")[2].startswith(f"{cpu_images.spec_name}_")]
    names = host_images(host)
    assert slim not in names and not [n for n in names if n.startswith("127.0.0.1:")]  # nothing half-moved carries a name
    assert not list(cache.glob("config-*.yml"))  # the registry was stopped, its files removed

    run(gpurig_cli, cpu_images, inventory, "deploy", "--json", str(tmp_path / "again.json"))
    assert host.image_id(slim) == json.loads(docker_engine("image", "inspect", slim).stdout)[0]["Id"]
    assert host.inspect("gpurig-slim")["State"]["Running"]
