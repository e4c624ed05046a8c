"""Pre-flight refusals, from recorded host facts: each names both sides and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurig.connect.engineinfo import ContainerInfo, EngineInfo, ImageInfo
from gpurig.deploy.preflight import Planned, check_disk, check_driver, check_mig, check_ports, check_runtime, parse_listening
from gpurig.facts import parse_facts

FACTS = Path(__file__).resolve().parents[2] / "fixtures" / "facts"
CUDA13 = ImageInfo("sha256:" + "a" * 64, ("pytorch:2.14.1-cu130-jupyter",), {"io.gpurig.min-driver": "580.65.06", "io.gpurig.cuda": "13.0"}, 6_000_000_000)
CPU = ImageInfo("sha256:" + "b" * 64, ("pytorch:2.13.0-cpu-slim",), {"io.gpurig.min-driver": "none", "io.gpurig.cuda": "cpu"}, 900_000_000)


def facts(name: str):
    return parse_facts((FACTS / name).read_text())


def planned(image=CUDA13, gpus=True, ports=()) -> Planned:
    return Planned("gpurig-jupyter", image.tags[0], image, gpus, ports)


def engine_info(runtimes=("runc",)) -> EngineInfo:
    return EngineInfo("20.10.24", "1.41", runtimes, "runc", "/var/lib/docker", 8, 64 << 30)


def test_a_driver_older_than_the_images_minimum_names_both_and_the_image_that_fits():
    f = facts("a100-driver550-open-docker-stopped.txt")
    assert f.driver_version.startswith("550")
    [refusal] = check_driver(planned(), f, ("13.0", "12.8", "12.4", "cpu"))
    assert f.driver_version in refusal.problem and "580.65.06" in refusal.problem
    assert "upgrade the driver to >= 580.65.06" in refusal.fix
    assert "CUDA 12.4" in refusal.fix  # the newest CUDA the 550 driver runs


def test_no_driver_and_cpu_images_and_no_gpus_asked():
    fresh = facts("a100-fresh-nouveau.txt")
    assert "no NVIDIA driver" in check_driver(planned(), fresh)[0].problem
    assert "CPU image" in check_driver(planned(image=CPU), fresh)[0].problem
    assert check_driver(planned(gpus=False), fresh) == []


def test_gpus_without_the_nvidia_runtime_point_at_provision():
    [refusal] = check_runtime([planned(), planned(gpus=False)], engine_info())
    assert "no nvidia runtime" in refusal.problem and "invoke provision" in refusal.fix
    assert check_runtime([planned()], engine_info(("nvidia", "runc"))) == []


# /proc/net/tcp and tcp6 as the kernel writes them (addresses in host byte order per 32-bit word)
PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 20531 1 0 100 0 0 10 0
   1: 0100007F:22B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 30111 1 0 100 0 0 10 0
   2: 0100007F:A2C4 0100007F:22B8 01 00000000:00000000 00:00000000 00000000  1000        0 30112 1 0 20 4 30 10 -1
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:08AE 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 20533 1 0 100 0 0 10 0
   1: 00000000000000000000000001000000:238C 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 20534 1 0 100 0 0 10 0
"""


def test_listening_sockets_are_read_from_proc_net_tcp():
    assert parse_listening(PROC_NET_TCP) == {("0.0.0.0", 22), ("127.0.0.1", 8888), ("::", 2222), ("::1", 9100)}


def container(name, ports, running=True) -> ContainerInfo:
    return ContainerInfo("c" * 64, name, "img", "sha256:x", "running" if running else "exited", None, 0, None,
                         {"io.gpurig.deploy.name": name}, ports, None, "runc")


def test_busy_ports_are_refused_but_a_replaced_containers_own_port_is_free():
    listening = parse_listening(PROC_NET_TCP)
    p = planned(ports=(("127.0.0.1", 8888), ("0.0.0.0", 2222)))
    refusals = check_ports([p], listening, [])
    assert [r.problem for r in refusals] == ["host port 8888 is in use on 127.0.0.1", "host port 2222 is in use on ::"]
    assert "ss -ltnp" in refusals[0].fix
    # the same container holds 8888 now: replacing it frees the port
    mine = container("gpurig-jupyter", (("127.0.0.1", 8888, 8888, "tcp"),))
    assert [r.problem for r in check_ports([p], listening, [mine])] == ["host port 2222 is in use on ::"]
    # another of gpurig's containers holding it is still a clash
    other = container("gpurig-jupyter-bob", (("127.0.0.1", 8888, 8888, "tcp"),))
    assert len(check_ports([planned(ports=(("127.0.0.1", 8888),))], listening, [other])) == 1
    # a different address on the same port is no clash
    assert check_ports([planned(ports=(("10.0.0.5", 8888),))], listening, []) == []


def test_not_enough_disk_for_the_layers_to_move():
    f = facts("debian12-container-fresh.txt")
    root = max(f.disks, key=lambda d: len(d.mount))
    huge = ImageInfo(CUDA13.id, CUDA13.tags, CUDA13.labels, root.free_bytes)
    [refusal] = check_disk([planned(image=huge)], f, "/var/lib/docker")
    assert "GiB free" in refusal.problem and "docker image prune" in refusal.fix
    assert check_disk([planned(image=CPU)], f, "/var/lib/docker") == [] or root.free_bytes < CPU.size * 1.2
    assert check_disk([], f, "/var/lib/docker") == []


def test_a_host_that_serves_others_needs_room_for_its_layer_cache_too():
    from gpurig.facts.parsers import Disk

    f = facts("debian12-container-fresh.txt")
    [root] = f.disks  # /var/lib/docker is on / there, and so is the login user's home
    image = ImageInfo(CPU.id, CPU.tags, CPU.labels, int(root.free_bytes / 2))  # fits once (with the margin), not twice
    moving = [planned(image=image)]
    assert check_disk(moving, f, "/var/lib/docker", (), root) == []  # serves no one
    [refusal] = check_disk(moving, f, "/var/lib/docker", (image.tags[0],), root)
    assert refusal.problem.startswith(f"/ has {root.free_bytes / 2**30:.1f} GiB free; the images need about ")
    assert "and the layer cache it keeps for the hosts it serves (fleet delivery)" in refusal.problem
    assert "gpurig_delivery: {peer: false}" in refusal.fix
    home = Disk("/home", 10 << 30, image.size - 1)  # a home of its own, too small for the cache alone
    [refusal] = check_disk(moving, f, "/var/lib/docker", (image.tags[0],), home)
    assert refusal.problem.startswith("/home has ") and "under the login user's home" in refusal.problem
    assert check_disk(moving, f, "/var/lib/docker", (image.tags[0],), None) == []  # the home not known: the engine's disk alone


@pytest.mark.parametrize("text", ["", "garbage line\n", "   0: ZZ:0016 00000000:0000 0A\n", "   0: 0102:0016 00000000:0000 0A\n"])
def test_unreadable_ss_lines_are_skipped(text):
    assert parse_listening(text) == set()


def test_a_gpu_index_with_mig_on_is_refused_naming_its_mig_devices():
    """Recorded A100 host: MIG on for GPU 0 (two 3g.40gb instances), off on 1-7."""
    f = facts("a100-driver550-open-docker-stopped.txt")
    [refusal] = check_mig("trainer", ("0",), f)
    assert "GPU 0 has MIG mode on" in refusal.problem
    assert "MIG-4f3c2a1b-7e6d-5c4b-9a8f-0e1d2c3b4a50 (3g.40gb on GPU 0)" in refusal.problem
    assert refusal.fix.startswith("ask for GPUs without MIG (1, 2, 3, 4, 5, 6, 7)") and "gpurig_gpus.mig: false" in refusal.fix
    assert check_mig("trainer", (f.gpus[0].uuid,), f)  # by UUID too
    assert check_mig("trainer", ("1", "2"), f) == [] and check_mig("trainer", None, f) == []  # other GPUs, or gpus: all
    assert check_mig("trainer", ("0",), facts("h100-driver535-docker-nvidia.txt")) == []  # MIG off there
