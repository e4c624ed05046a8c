"""Stand-ins for what a GPU host has and this machine cannot: nvidia-smi, the container toolkit's hook and runtime.

They are put into a test host through the test's own `docker exec`, never
through gpurig. `nvidia-smi` replays the output format recorded from real
A100 hosts (tests/fixtures/facts/a100-driver550-open-docker-stopped.txt)
for two GPUs, with the driver version read from DRIVER_FILE (empty: no
driver, and it fails as the real one does when it cannot reach the kernel
module); what it has no recording for fails as the real one fails on bad
arguments. `nvidia-container-runtime-hook` on PATH when dockerd starts is
what makes dockerd register its ``nvidia`` device driver for ``--gpus``;
as the OCI prestart hook it then runs at each such container start and
must succeed. `nvidia-container-runtime` hands its arguments to runc.
"""

from __future__ import annotations

import json

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


PROBE_SCRIPT = r"""
set -e
root=$(mktemp -d)
mkdir -p "$root/tmp" "$root/etc"
for bin in /usr/bin/sleep /usr/bin/dash /usr/bin/cat /usr/bin/env; do
    cp --parents "$bin" "$root"
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do cp --parents -L "$lib" "$root"; done
done
ln -s dash "$root/usr/bin/sh"
ln -s usr/bin "$root/bin"
tar -C "$root" -c . | docker import -c 'CMD ["/usr/bin/sleep", "infinity"]' - "$1" >/dev/null
rm -rf "$root"
"""


def make_probe_image(host, ref: str) -> None:
    """A few-MB image in the host's own engine, made from its own sleep/sh/cat (no registry needed)."""
    host.sh(f"sh -s -- {ref}", input=PROBE_SCRIPT)
