"""`gpurig rollout` over three loopback systemd hosts, as a user runs it: one host fails verify and is rolled back, then fixed.

The hosts are the session's ``fleet`` (tests/integration/deploy/conftest.py):
its deploy host and two more booted and provisioned the same way
(tests/integration/deploy/gpuhost.py), shared with the fabric faults'
module. No GPU exists here, so what a GPU verify would find comes from
stand-ins, as elsewhere in these tests: the images are a few MB (made on
this machine from its own binaries) whose ``python3`` replays a passing
torch probe document, and the host probe gpurig sends is replaced (in the
gpurig process this test starts, nowhere else) by one that reads the
stand-in nvidia-smi's driver and fails ``host.driver`` below the 580 the
new image's CUDA needs. Deploy, delivery, the verify plumbing (SSH, docker
exec, records, verdicts), the rollback and the state file are gpurig's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpurig.deploy.rollplan import verified_hosts

from .cpuimages import make_project
from .gpuhost import DEFAULT_DRIVER, REPO
from .test_deploy import HOST_ULIMITS

OLD_DRIVER = "535.183.01"
# The torch probe's answer from a GPU container, as a POSIX shell `python3` (the image has no Python): it ignores the probe it is sent.
PYTHON3 = """#!/usr/bin/sh
cat <<'EOF'
{"records": [{"id": "torch.import", "status": "pass", "measured": "2.14.1", "detail": "imported in 1.2s; CUDA build 13.0"},
 {"id": "cuda.available", "status": "pass", "measured": true, "expected": true, "detail": "1 GPU(s), CUDA 13.0"}]}
EOF
"""
# Run as `python3 -c` on the host by gpurig's verify: host.driver from the stand-in nvidia-smi, against what the new image needs.
HOST_PROBE = r'''
import json, subprocess
need = "580"
out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.split()
driver = out[0] if out else None
ok = driver is not None and int(driver.split(".")[0]) >= int(need)
detail = f"driver {driver}" if ok else f"{driver} < {need} needed by the image's CUDA"
print(json.dumps({"nvidia_gpus_on_pci": 2, "records": [{"id": "host.driver", "status": "pass" if ok else "fail", "measured": driver,
                  "expected": f">= {need}", "detail": detail, "fix": "" if ok else f"upgrade the host driver to >= {need}"}]}))
'''
# The gpurig process of this test: the shipped host probe replaced by HOST_PROBE (and no GPU-host traps: no real GPU host here).
RUN = """
import dataclasses, sys
from gpurig.verify import runner
plain = runner.VerifyPlan.from_checks.__func__
def standin(cls, level="quick", container=None, image=None):
    return dataclasses.replace(plain(cls, level, container, image), host_probe={probe!r}, traps=False)
runner.VerifyPlan.from_checks = classmethod(standin)
from gpurig.cli import main
main(["gpurig", *sys.argv[1:]])
"""
# $1 the image's name, $2 what /etc/rollout-image says, $3 its label, $4 the python3 stand-in (PYTHON3);
# a root of this machine's sleep, sh and cat with their libraries
IMAGE_SCRIPT = r"""
set -e
root=$(mktemp -d)
mkdir -p "$root/tmp" "$root/etc" "$root/usr/bin"
for bin in /usr/bin/sleep /usr/bin/dash /usr/bin/cat; do
    cp --parents "$bin" "$root"
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do cp --parents -L "$lib" "$root"; done
done
ln -s dash "$root/usr/bin/sh"
ln -s usr/bin "$root/bin"
cp "$4" "$root/usr/bin/python3"; chmod 0755 "$root/usr/bin/python3"
echo "$2" > "$root/etc/rollout-image"
tar -C "$root" -c . | docker import -c 'CMD ["/usr/bin/sleep", "infinity"]' -c "LABEL $3" - "$1" >/dev/null
rm -rf "$root"
"""


@pytest.fixture(scope="module")
def images(docker_engine, container_kit, tmp_path_factory):
    """(old, new): two few-MB images on this machine whose python3 passes the torch probe; removed at the end."""
    label = f"{container_kit.label}={container_kit.session}"
    refs = [f"gpurig-rollout-{container_kit.session[:8]}:{v}" for v in ("old", "new")]
    python3 = tmp_path_factory.mktemp("rollout-images") / "python3"
    python3.write_text(PYTHON3)
    try:
        for ref in refs:
            subprocess.run(["sh", "-s", "--", ref, ref, label, str(python3)], input=IMAGE_SCRIPT, text=True, check=True, capture_output=True)
        yield tuple(refs)
    finally:
        docker_engine("image", "rm", "-f", *refs, check=False)


@pytest.fixture
def rollout_inventory(fleet, clean_deploy_host, images, tmp_path):
    """An inventory with the three hosts in group `fleet`, each running one GPU container of the old image; cleaned afterwards."""
    hosts = {}
    for i, h in enumerate(fleet):
        hosts[f"roll-{'abc'[i]}"] = {
            "ansible_host": "127.0.0.1", "ansible_port": h.port, "ansible_user": h.user, "ansible_ssh_private_key_file": str(h.key),
            "ansible_become": True,
            "gpurig_containers": [{"name": "train", "variant": "slim", "image": images[0], "gpus": [0], "ulimits": HOST_ULIMITS,
                                   "command": ["/usr/bin/sleep", "infinity"]}],
        }
    path = tmp_path / "project" / "inventory" / "hosts.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"all": {"children": {"fleet": {"hosts": hosts}}}}, sort_keys=False))
    try:
        yield path
    finally:
        for h in fleet:
            h.clean()
            h.docker("image", "rm", "-f", *images, check=False)


def gpurig(project: Path, *args: str) -> subprocess.CompletedProcess:
    """`gpurig ARGS` from the project, with the stand-in host probe (RUN)."""
    env = {**os.environ, "HOME": str(project), "COLUMNS": "80", "PYTHONPATH": str(REPO), "GPURIG_ROOT": str(project)}
    env.pop("SSH_AUTH_SOCK", None)
    return subprocess.run([sys.executable, "-c", RUN.format(probe=HOST_PROBE), *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=900)


def ok(proc: subprocess.CompletedProcess, rc: int = 0) -> subprocess.CompletedProcess:
    assert proc.returncode == rc, f"exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def test_a_host_failing_verify_is_rolled_back_and_a_rerun_after_the_fix_completes(fleet, images, rollout_inventory, container_kit):
    project = rollout_inventory.parent.parent  # a project of the test spec (nothing of it is built: the images are explicit)
    make_project(project, f"gpurig-rollout-{container_kit.session[:8]}", "gpurig-rollout-unused:base", "/nonexistent")
    old, new = images
    inv = ["-i", str(rollout_inventory)]
    ok(gpurig(project, "deploy", *inv, "-l", "fleet"))
    a, b, c = fleet
    before = {h.name: h.inspect("train")["Image"] for h in fleet}
    c.set_driver(OLD_DRIVER)
    roll = ["rollout", *inv, "-l", "fleet", "--variant", "slim", "--to", new, "--batch", "1"]

    dry = ok(gpurig(project, *roll, "--check"))
    assert "canary" in dry.stdout and "would move" in dry.stdout
    assert {h.inspect("train")["Image"] for h in fleet} == set(before.values())  # --check changed nothing
    assert not (project / ".gpurig").exists()

    first = ok(gpurig(project, *roll, "--json", "-"), rc=1)
    doc = json.loads(first.stdout)
    rows = {r["host"]: r for r in doc["rows"]}
    new_id = doc["image_id"]
    assert rows["roll-a"]["batch"] == "canary" and rows["roll-a"]["why"] == "new image, verify passed"
    assert rows["roll-b"]["why"] == "new image, verify passed"
    assert rows["roll-c"]["why"] == f"rolled back: host.driver: {OLD_DRIVER} < 580 needed by the image's CUDA", rows["roll-c"]
    assert a.inspect("train")["Image"] == new_id and b.inspect("train")["Image"] == new_id
    assert c.inspect("train")["Image"] == before[c.name] and c.inspect("train")["State"]["Running"]  # back on its old image id
    assert c.image_id(new) is not None  # the new image stays where it was moved; the old one too (nothing removed mid-rollout)
    state = json.loads((project / ".gpurig" / "rollouts" / "fleet-slim.json").read_text())
    entries = state["hosts"]
    assert (entries["roll-c"]["state"], entries["roll-c"]["verify"], entries["roll-c"]["image_id"]) == ("rolled-back", "failed", before[c.name])
    assert (entries["roll-a"]["state"], entries["roll-a"]["image_id"], entries["roll-a"]["level"]) == ("done", new_id, "quick")
    assert sorted(e["host"] for e in verified_hosts(project, new_id)) == ["roll-a", "roll-b"]

    c.set_driver(DEFAULT_DRIVER)  # the fix
    again = ok(gpurig(project, *roll, "--prune"))
    lines = again.stdout.splitlines()
    row = {h: next(line for line in lines if line.startswith(h)) for h in ("roll-a", "roll-b", "roll-c")}
    assert "verify passed earlier" in row["roll-a"] and "verify passed earlier" in row["roll-b"], again.stdout  # skipped: done before
    assert "canary" in row["roll-c"] and "new image, verify passed" in row["roll-c"], again.stdout
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert {h.inspect("train")["Image"] for h in fleet} == {new_id}
    assert [h.image_id(old) for h in fleet] == [None, None, None] and "--prune removed 3 old images" in again.stderr  # now unused


def test_promote_moves_the_alias_only_once_enough_hosts_passed_verify_and_records_them(fleet, images, rollout_inventory, container_kit,
                                                                                       docker_engine):
    project = rollout_inventory.parent.parent
    make_project(project, f"gpurig-rollout-{container_kit.session[:8]}", "gpurig-rollout-unused:base", "/nonexistent")
    _, new = images
    stable = new.rsplit(":", 1)[0] + ":stable"
    new_id = docker_engine("image", "inspect", "-f", "{{.Id}}", new).stdout.strip()
    # The build report `gpurig build` would have written (these few-MB images are made without it): promote records into it.
    report = project / "reports" / "builds" / "rollout" / "new-slim.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"image": new, "image_id": new_id, "built_at": "2026-12-01T00:00:00+00:00"}))
    inv = ["-i", str(rollout_inventory)]
    ok(gpurig(project, "deploy", *inv, "-l", "fleet"))
    fleet[2].set_driver(OLD_DRIVER)
    roll = ["rollout", *inv, "-l", "fleet", "--variant", "slim", "--to", new, "--batch", "2"]
    try:
        ok(gpurig(project, *roll), rc=1)  # roll-c fails verify: two hosts proved the image
        refused = gpurig(project, "promote", new, "--as", "stable", "--min-hosts", "3")
        assert refused.returncode != 0 and "passed verify on 2 hosts (roll-a, roll-b); --min-hosts 3 asks for 3" in refused.stderr
        assert docker_engine("image", "inspect", stable, check=False).returncode != 0  # no alias made
        assert "promotions" not in json.loads(report.read_text())

        fleet[2].set_driver(DEFAULT_DRIVER)
        ok(gpurig(project, *roll))
        done = json.loads(ok(gpurig(project, "promote", new, "--as", "stable", "--min-hosts", "3", "--json", "-")).stdout)
        assert docker_engine("image", "inspect", "-f", "{{.Id}}", stable).stdout.strip() == new_id
        recorded = json.loads(report.read_text())["promotions"]
        assert [h["host"] for h in recorded[-1]["verified_on"]] == ["roll-a", "roll-b", "roll-c"] and recorded[-1]["alias"] == stable
        assert done["alias"] == stable and done["image_id"] == new_id
    finally:
        docker_engine("image", "rm", stable, check=False)
