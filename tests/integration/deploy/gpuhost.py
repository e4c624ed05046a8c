"""A provisioned systemd host made to look like a GPU host: `gpurig provision`, then stand-ins put in by docker exec.

``prepare_host`` runs `gpurig provision --only docker,daemon,python3` on a fresh
systemd host (tests/integration/systemd_kit.py), then puts in the stand-ins
for what a GPU host has and this machine cannot: nvidia-smi, the container
toolkit's hook and runtime, the nvidia runtime in daemon.json. They go in
through the test's own `docker exec`, never through gpurig. `nvidia-smi` replays the output format recorded from real
A100 hosts (tests/fixtures/facts/a100-driver550-open-docker-stopped.txt)
for two GPUs, with the driver version read from DRIVER_FILE (empty: no
driver, and it fails as the real one does when it cannot reach the kernel
module); what it has no recording for fails as the real one fails on bad
arguments. `nvidia-container-runtime-hook` on PATH when dockerd starts is
what makes dockerd register its ``nvidia`` device driver for ``--gpus``;
as the OCI prestart hook it then runs at each such container start and
must succeed. `nvidia-container-runtime` hands its arguments to runc.
The deploy tests' hosts boot from ``gpu_host_image``: one such host, made once
per run and committed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from systemd_kit import inventory_for

REPO = Path(__file__).resolve().parents[3]
PROVISION_VARS = {"gpurig_docker": {"users": ["gpurig"]}}
PROBE_IMAGE = "gpurig-test-probe:1"

DRIVER_FILE = "/etc/gpurig-test/driver"
DEFAULT_DRIVER = "580.95.05"
FAKE_GPUS = (
    # index, name, uuid, memory.total (MiB), pci.bus_id
    (0, "NVIDIA A100-SXM4-80GB", "GPU-4f6a1c2e-8b3d-4e5f-9a0b-1c2d3e4f5a6b", 81920, "00000000:07:00.0"),
    (1, "NVIDIA A100-SXM4-80GB", "GPU-9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b", 81920, "00000000:0F:00.0"),
)

NVIDIA_SMI = r"""#!/bin/sh
# gpurig test stand-in for nvidia-smi (not a GPU): two A100s in the output format of real ones.
driver=$(cat __DRIVER_FILE__ 2>/dev/null)
if [ -z "$driver" ]; then
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
    echo
    exit 9
fi
invalid() { echo "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."; echo; exit 2; }
fields= format= list= ids=
while [ $# -gt 0 ]; do
    case $1 in
        --query-gpu=*) fields=${1#--query-gpu=} ;;
        --format=*) format=${1#--format=} ;;
        -L|--list-gpus) list=1 ;;
        --id=*) ids=${1#--id=} ;;
        -i|--id) shift; ids=$1 ;;
        *) invalid ;;
    esac
    shift
done
noheader= nounits=
case ",$format," in *,noheader,*) noheader=1 ;; esac
case ",$format," in *,nounits,*) nounits=1 ;; esac
gpus="__GPUS__"
count=$(printf '%s\n' "$gpus" | wc -l)
selected() {
    [ -z "$ids" ] && return 0
    case ",$ids," in *",$1,"*|*",$2,"*) return 0 ;; esac
    return 1
}
if [ -n "$list" ]; then
    [ -n "$fields$format" ] && invalid
    printf '%s\n' "$gpus" | while IFS='|' read -r index name uuid mem bus; do
        selected "$index" "$uuid" && echo "GPU $index: $name (UUID: $uuid)"
    done
    exit 0
fi
[ -n "$fields" ] || invalid
case $format in csv|csv,*) ;; *) invalid ;; esac
mib() { if [ -n "$nounits" ]; then echo "$1"; else echo "$1 MiB"; fi; }
header= ; line_fields=$(echo "$fields" | tr ',' ' ')
for f in $line_fields; do
    case $f in
        index|count|name|gpu_name|uuid|gpu_uuid|driver_version|pci.bus_id|gpu_bus_id|compute_cap) h=$f ;;
        memory.total|memory.used|memory.free) h="$f [MiB]" ;;
        *) echo "Field \"$f\" is not a valid field to query."; echo; exit 2 ;;
    esac
    header="${header:+$header, }$h"
done
[ -n "$noheader" ] || echo "$header"
printf '%s\n' "$gpus" | while IFS='|' read -r index name uuid mem bus; do
    selected "$index" "$uuid" || continue
    out=
    for f in $line_fields; do
        case $f in
            index) v=$index ;;
            count) v=$count ;;
            name|gpu_name) v=$name ;;
            uuid|gpu_uuid) v=$uuid ;;
            driver_version) v=$driver ;;
            pci.bus_id|gpu_bus_id) v=$bus ;;
            compute_cap) v=8.0 ;;
            memory.total) v=$(mib "$mem") ;;
            memory.used) v=$(mib 0) ;;
            memory.free) v=$(mib $((mem - 433))) ;;
        esac
        out="${out:+$out, }$v"
    done
    echo "$out"
done | grep . || { echo "No devices were found"; exit 6; }
"""

HOOK = """#!/bin/sh
# gpurig test stand-in for nvidia-container-runtime-hook: dockerd registers its nvidia device driver
# (--gpus, DeviceRequests) only when this is on PATH; as the OCI prestart hook it reads the state and succeeds.
cat >/dev/null 2>&1
exit 0
"""

RUNTIME = """#!/bin/sh
# gpurig test stand-in for nvidia-container-runtime: runc with the same arguments.
exec runc "$@"
"""


def nvidia_smi_script() -> str:
    gpus = "\n".join(f"{i}|{name}|{uuid}|{mem}|{bus}" for i, name, uuid, mem, bus in FAKE_GPUS)
    return NVIDIA_SMI.replace("__DRIVER_FILE__", DRIVER_FILE).replace("__GPUS__", gpus)


def install_standins(host, driver: str = DEFAULT_DRIVER) -> None:
    """Put nvidia-smi, the hook and the runtime into /usr/bin of ``host`` (a ContainerHost), the driver file beside."""
    host.write(DRIVER_FILE, f"{driver}\n")
    host.write("/usr/bin/nvidia-smi", nvidia_smi_script(), "0755")
    host.write("/usr/bin/nvidia-container-runtime-hook", HOOK, "0755")
    host.write("/usr/bin/nvidia-container-runtime", RUNTIME, "0755")


def nvidia_runtime_json(current: str) -> str:
    """daemon.json with the nvidia runtime merged in, exactly as gpurig's toolkit step writes it."""
    from gpurig.steps.daemon import merge, render
    from gpurig.steps.toolkit import NVIDIA_RUNTIME

    return render(merge(json.loads(current or "{}"), NVIDIA_RUNTIME), current)


# $1: the image's name; the rest: the binaries it holds (with their libraries), dash as /bin/sh.
IMAGE_SCRIPT = r"""
set -e
ref=$1; shift
root=$(mktemp -d)
mkdir -p "$root/tmp" "$root/etc"
chmod 1777 "$root/tmp"
for bin in "$@"; do
    cp --parents "$bin" "$root"
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do cp --parents -L "$lib" "$root"; done
done
ln -s dash "$root/usr/bin/sh"
ln -s usr/bin "$root/bin"
tar -C "$root" -c . | docker import -c 'CMD ["/usr/bin/sleep", "infinity"]' - "$ref" >/dev/null
rm -rf "$root"
"""
PROBE_BINARIES = ("/usr/bin/sleep", "/usr/bin/dash", "/usr/bin/cat", "/usr/bin/env")
# what the jobs tests' scripts use besides: folders, files of random bytes, listings
JOB_BINARIES = (*PROBE_BINARIES, "/usr/bin/mkdir", "/usr/bin/head", "/usr/bin/ls", "/usr/bin/rm", "/usr/bin/sha256sum", "/usr/bin/true")


def make_probe_image(host, ref: str, binaries: tuple[str, ...] = PROBE_BINARIES) -> None:
    """A few-MB image in the host's own engine, made from its own binaries (no registry needed)."""
    host.sh(f"sh -s -- {ref} {' '.join(binaries)}", input=IMAGE_SCRIPT)


def host_images(host) -> dict[str, str]:
    """{name:tag: image id} in the host's engine."""
    out = host.docker("images", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}").stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def bare(host) -> None:
    """The host's engine with only the probe image: nothing of the CPU images is there."""
    keep = host.image_id(host.probe_image)
    ids = {i for i in host.docker("images", "-aq", "--no-trunc").stdout.split() if i != keep}
    if ids:
        host.docker("rmi", "-f", *sorted(ids), check=False)
    assert set(host_images(host)) == {host.probe_image}


def gpurig(cwd: Path, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """`gpurig ARGS` as a user runs it, from ``cwd`` (HOME there too, so no user SSH config or agent joins in)."""
    env = {**os.environ, "HOME": str(cwd), "COLUMNS": "200", "PYTHONPATH": str(REPO), **(env or {})}
    env.pop("SSH_AUTH_SOCK", None)
    code = "import sys; from gpurig.cli import main; main(['gpurig', *sys.argv[1:]])"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def restart_docker(host, deadline_s: float = 60) -> None:
    """`systemctl restart docker` in the host, then wait until its engine answers."""
    host.sh("systemctl restart docker")
    wait_engine(host, deadline_s)


def wait_engine(host, deadline_s: float = 60) -> None:
    """Until the host's engine answers."""
    end = time.monotonic() + deadline_s
    while host.sh("docker info --format '{{.ServerVersion}}'", check=False).returncode != 0:
        if time.monotonic() > end:
            raise AssertionError(f"dockerd in {host.name} did not come back: {host.sh('journalctl -u docker -n 20', check=False).stdout}")
        time.sleep(0.2)  # polling interval while dockerd starts, not a synchronisation sleep


def prepare_host(host, work: Path) -> None:
    """`gpurig provision --only docker,daemon,python3` over SSH (python3: the job agent's), then the GPU stand-ins and the nvidia
    runtime through docker exec."""
    inventory = inventory_for(work / "provision" / "hosts.yaml", host, PROVISION_VARS)
    proc = gpurig(inventory.parent, "provision", "--inventory", str(inventory), "--only", "docker,daemon,python3")
    assert proc.returncode == 0, f"gpurig provision failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    install_standins(host)
    host.write("/etc/docker/daemon.json", nvidia_runtime_json(host.read("/etc/docker/daemon.json") or ""))
    restart_docker(host)
    make_probe_image(host, PROBE_IMAGE)


def gpu_host_image(docker, kit, images, keys: Path, key: Path, work: Path) -> str:
    """A host made by ``prepare_host`` (`gpurig provision` and the stand-ins), committed with its engine stopped and its SSH
    host keys out (each host booted from it makes its own) as this run's image: hosts booted from it need only
    ``ready_host``, not a provision each (apt installing Docker took about 20 s of a core per host). Made once per run,
    under the lock the systemd images are built under; its label is the run's, so it goes at the run's end with them."""
    from systemd_kit import SystemdHosts, run_lock

    tag = gpu_host_tag(kit)
    with run_lock(kit, "gpuhost-debian12"):
        if docker("image", "inspect", "--format", "{{.Id}}", tag, check=False).returncode == 0:
            return tag
        maker = SystemdHosts(docker, kit, images, keys, key)
        try:
            host = maker.make("debian12")
            prepare_host(host, work)
            host.sh("systemctl stop docker docker.socket && rm -f /etc/ssh/ssh_host_*")
            # not labelled with a session (a session's teardown removes what carries its own): the run's label, inherited
            docker("commit", "--change", f"LABEL {kit.label}=gpuhost-{kit.run}", host.cid, tag)
        finally:
            maker.remove()
    return tag


def gpu_host_tag(kit) -> str:
    return f"gpurig-test-gpuhost-debian12:{kit.run}"


def ready_host(host) -> None:
    """A host booted from ``gpu_host_image``: its engine answers and holds the probe image (the engine's store is the host's own)."""
    wait_engine(host, 120)
    make_probe_image(host, PROBE_IMAGE)


def check_gpu_requests(host, label: str) -> None:
    """`docker run --gpus device=1` starts, and the container's config holds the request: the fixture's own proof."""
    run = host.sh(f"docker run -d --label {label} --gpus device=1 {PROBE_IMAGE}", check=False)
    assert run.returncode == 0, f"docker run --gpus in the deploy host failed: {run.stderr.strip()}"
    cid = run.stdout.strip()
    try:
        found = json.loads(host.sh(f"docker inspect {cid}").stdout)[0]
        requests = found["HostConfig"]["DeviceRequests"]
        assert found["State"]["Running"], found["State"]
        assert [(r["DeviceIDs"], r["Capabilities"]) for r in requests] == [(["1"], [["gpu"]])], requests
    finally:
        host.sh(f"docker rm -f -v {cid}", check=False)
