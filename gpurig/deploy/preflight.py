"""Pre-flight: what would make a container fail on this host, found before anything moves or starts.

Pure: every check takes what was already read from the host (facts, the
engine's info, its containers, the listening sockets) and the images to run,
and returns ``Refusal``s, each naming the problem and the fix. A host with any
refusal gets nothing: no image moves, no container is touched.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from gpurig.connect.engineinfo import ContainerInfo, EngineInfo, ImageInfo
from gpurig.deploy.sharing import HostGpus
from gpurig.facts import Facts
from gpurig.facts.parsers import Disk
from gpurig.image import compat

MIN_DRIVER_LABEL = "io.gpurig.min-driver"
CUDA_LABEL = "io.gpurig.cuda"
DISK_MARGIN = 1.2  # layers unpack to about their compressed size and more; keep a fifth spare
GIB = 1024**3


@dataclass(frozen=True)
class Refusal:
    container: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.container}: {self.problem}; fix: {self.fix}"


@dataclass(frozen=True)
class Planned:
    """One container to run: its name, the image it runs, what it asks of the host."""

    name: str
    image_ref: str
    image: ImageInfo | None  # the image as the build machine has it (None: the host pulls it from a registry)
    wants_gpus: bool
    host_ports: tuple[tuple[str, int], ...]  # (bind address, port)


def check_driver(p: Planned, facts: Facts, matrix_cudas: tuple[str, ...] = ()) -> list[Refusal]:
    """The host driver against the image's io.gpurig.min-driver label (only for containers that use GPUs).

    An image gpurig did not build carries no such label: its CUDA is not known, so nothing is checked.
    """
    if not p.wants_gpus or p.image is None:
        return []
    need = p.image.labels.get(MIN_DRIVER_LABEL)
    cuda = p.image.labels.get(CUDA_LABEL, "?")
    if not need:
        return []
    if need == "none":
        return [Refusal(p.name, f"GPUs asked for, but {p.image_ref} is a CPU image", "set gpus: none, or deploy an image built for CUDA")]
    have = facts.driver_version
    if have is None:
        return [Refusal(p.name, f"no NVIDIA driver loaded on the host; {p.image_ref} (CUDA {cuda}) needs >= {need}",
                        "install it: invoke provision (driver step)")]
    if compat.driver_at_least(have, need):
        return []
    fits = [c for c in matrix_cudas if c != compat.CPU and compat.driver_supports(have, c)]
    other = f", or deploy the image built for CUDA {max(fits, key=compat.version_key)}" if fits else ""
    return [Refusal(p.name, f"host driver {have} is older than {need}, which {p.image_ref} (CUDA {cuda}) needs",
                    f"upgrade the driver to >= {need} (invoke provision){other}")]


def check_runtime(planned: list[Planned], info: EngineInfo) -> list[Refusal]:
    """GPUs asked for on an engine without NVIDIA's runtime: ``--gpus`` would fail at start."""
    if info.nvidia_runtime:
        return []
    return [
        Refusal(p.name, "GPUs asked for, but the host's Docker has no nvidia runtime (NVIDIA Container Toolkit)",
                "invoke provision (container-toolkit and daemon steps)")
        for p in planned if p.wants_gpus
    ]


def check_ports(planned: list[Planned], listening: set[tuple[str, int]], ours: list[ContainerInfo]) -> list[Refusal]:
    """Host ports already held by another process or container. Ports of the containers being replaced are free to take."""
    replaced = {c.name for c in ours} & {p.name for p in planned}
    freed = {(ip or "0.0.0.0", port) for c in ours if c.name in replaced and c.running for ip, port, _, _ in c.ports}
    taken = {(ip, port) for ip, port in listening} - freed
    refusals = []
    for p in planned:
        for bind, port in p.host_ports:
            clash = [(ip, pt) for ip, pt in taken if pt == port and _overlap(ip, bind)]
            if clash:
                refusals.append(Refusal(p.name, f"host port {port} is in use on {clash[0][0]}",
                                        f"pick another port in gpurig_containers, or stop what listens there (`ss -ltnp 'sport = :{port}'`)"))
    return refusals


def _overlap(a: str, b: str) -> bool:
    wildcard = {"0.0.0.0", "::", "*", ""}
    return a == b or a in wildcard or b in wildcard


def check_disk(to_move: list[Planned], facts: Facts, root_dir: str, serving: Collection[str] = (), home: Disk | None = None) -> list[Refusal]:
    """Room in the engine's storage for the images that must move (their full size: a bound, not a guess), and, on a host that
    serves the images ``serving`` to others (fleet delivery), for its layer cache under the login user's ``home`` (about their
    size again, on the engine's disk too where the home is there)."""
    images = {p.image_ref: p.image for p in to_move if p.image}
    need = sum(image.size for image in images.values())
    if not need:
        return []
    cache = sum(image.size for ref, image in images.items() if ref in serving) if home is not None else 0
    disk = _disk_for(facts, root_dir)
    shared = disk is not None and home is not None and home.mount == disk.mount
    names = ", ".join(sorted({p.name for p in to_move}))
    keeps = "the layer cache it keeps for the hosts it serves (fleet delivery)"
    refusals = []
    if disk is not None and disk.free_bytes < need * DISK_MARGIN + (cache if shared else 0):
        also = f" and {keeps} {cache / GIB:.1f} GiB more" if shared and cache else ""
        refusals.append(Refusal(names, f"{disk.mount} has {disk.free_bytes / GIB:.1f} GiB free; the images need about "
                                       f"{need * DISK_MARGIN / GIB:.1f} GiB{also}",
                                "free space (`docker image prune`, old images) or move Docker's data-root to a larger disk"
                                + (SERVE_NO_ONE if also else "")))
    if home is not None and not shared and cache and home.free_bytes < cache:
        refusals.append(Refusal(names, f"{home.mount} has {home.free_bytes / GIB:.1f} GiB free; {keeps} needs about {cache / GIB:.1f} GiB "
                                       "under the login user's home", f"free space there{SERVE_NO_ONE}"))
    return refusals


SERVE_NO_ONE = ", or set gpurig_delivery: {peer: false} on this host so that it serves no other host"


def _disk_for(facts: Facts, path: str):
    best = None
    for d in facts.disks:
        if path == d.mount or path.startswith(d.mount.rstrip("/") + "/"):
            if best is None or len(d.mount) > len(best.mount):
                best = d
    return best


def parse_listening(proc_net_tcp: str) -> set[tuple[str, int]]:
    """(address, port) of TCP listeners from /proc/net/tcp and /proc/net/tcp6 (present on every Linux; ``ss`` is not)."""
    import ipaddress
    import socket
    import struct

    found = set()
    for line in proc_net_tcp.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[3] != "0A" or ":" not in fields[1]:  # 0A: TCP_LISTEN
            continue
        hex_addr, _, hex_port = fields[1].partition(":")
        try:
            raw = bytes.fromhex(hex_addr)
            port = int(hex_port, 16)
        except ValueError:
            continue
        if len(raw) == 4:
            addr = socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
        elif len(raw) == 16:  # four host-order 32-bit words
            words = struct.unpack(">4I", raw)
            addr = str(ipaddress.IPv6Address(b"".join(struct.pack("<I", w) for w in words)))
        else:
            continue
        found.add((addr, port))
    return found


def check_mig(name: str, devices: tuple[str, ...] | None, facts: Facts) -> list[Refusal]:
    """GPU indexes or UUIDs (asked for, or a count resolved to them) of GPUs whose MIG mode is on.

    On such a GPU CUDA runs only in its MIG devices: a container given the
    GPU by index or UUID gets no usable whole GPU, and its device 0 is not
    the GPU the user meant. ``devices`` as deploy assigned them: None is every
    GPU (the toolkit then hands over the MIG devices too, which is what
    ``gpus: all`` asks for), () none.
    """
    on = set(facts.gpuhost.mig_on())
    if not devices or not on:
        return []
    on_host = HostGpus((g.index, g.uuid) for g in facts.gpus)
    hit = sorted({i for i in map(on_host.index_of, devices) if i in on})
    if not hit:
        return []
    slices = [d for d in facts.gpuhost.mig_devices if d.gpu in hit]
    named = ", ".join(f"{d.uuid} ({d.profile} on GPU {d.gpu})" for d in slices) or "none made yet (nvidia-smi mig -cgi)"
    whole = sorted(g.index for g in facts.gpuhost.gpu_modes or () if g.index not in on)
    other = f"ask for GPUs without MIG ({', '.join(map(str, whole))}), " if whole else ""
    gpus = ", ".join(map(str, hit))
    return [Refusal(name, f"GPU {gpus} has MIG mode on: CUDA there runs only in its MIG devices, so a container given GPU {gpus} "
                          f"gets no whole GPU (its MIG devices: {named})",
                    f"{other}turn MIG off (gpurig_gpus.mig: false, then gpurig provision and a GPU reset), or run it on MIG "
                    f"devices by UUID (docker run --gpus device=MIG-...; gpurig_containers cannot name MIG devices yet)")]
