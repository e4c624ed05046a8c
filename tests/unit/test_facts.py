"""Fact parsers against recorded outputs (tests/fixtures/facts/): what a host is, with no host at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpurig.facts import (
    ABSENT,
    FACTS_SCRIPT,
    PROBES,
    SUMMARY_PROBES,
    Probe,
    Section,
    facts_script,
    parse_facts,
    parse_lspci,
    parse_nvidia_smi,
    parse_nvidia_version,
    parse_pci_sysfs,
    parse_secure_boot,
    read,
    split_sections,
)
from gpurig.facts.readiness import lacks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def load(name: str):
    return parse_facts((FIXTURES / name).read_text())


def test_every_fixture_has_every_section_except_the_cut_one():
    for path in FIXTURES.glob("*.txt"):
        sections = split_sections(path.read_text())
        if "cut-short" in path.name:
            continue
        assert sorted(sections) == sorted(probe.name for probe in PROBES), path.name


def test_debian_machine_as_root():
    f = load("debian12-root.txt")
    assert (f.os.id, f.os.version_id, f.os.codename) == ("debian", "12", "bookworm")
    assert f.arch == "x86_64" and f.kernel and f.cpus == 2
    assert f.mem_total_bytes > f.mem_available_bytes > 0
    assert [d.mount for d in f.disks] == ["/", "/var/lib/docker"]
    assert f.pci_gpus == () and f.gpus == () and f.driver_version is None
    assert f.nouveau_loaded is False and f.nvidia_loaded is False
    assert f.secure_boot == "not-efi"
    assert f.docker.installed and f.docker.running
    assert f.docker.server_version == "20.10.24+dfsg1" and f.docker.client_version == "28.2.2"
    assert f.docker.default_runtime == "runc" and "runc" in f.docker.runtimes
    assert f.toolkit_version is None
    assert f.cgroup_version == 1
    assert f.missing == ()


def test_docker_socket_permission_denied_is_a_flag_and_a_reason_not_a_crash():
    d = load("debian12-nobody.txt").docker
    assert d.installed and not d.running and d.server_version is None
    assert d.denied and d.problem == "permission denied on the docker socket (user not in the docker group)"
    assert not load("debian12-docker-down.txt").docker.denied and not load("debian12-root.txt").docker.denied


def test_docker_daemon_down():
    d = load("debian12-docker-down.txt").docker
    assert d.installed and not d.running
    assert d.problem == "daemon not running"
    assert d.client_version == "28.2.2"


def test_old_docker_client_without_client_version():
    d = load("debian12-docker-20.10-client.txt").docker
    assert d.running and d.server_version == "20.10.24+dfsg1" and d.client_version is None


def test_h100_host_with_driver_535_and_nvidia_runtime():
    f = load("h100-driver535-docker-nvidia.txt")
    assert (f.os.id, f.os.version_id) == ("ubuntu", "22.04")
    assert f.kernel == "5.15.0-105-generic" and f.cpus == 224
    assert len(f.pci_gpus) == 8  # the 4 NVSwitch bridges are not GPUs
    assert {g.device_id for g in f.pci_gpus} == {"2330"} and f.pci_gpus[0].name == "GH100 [H100 SXM5 80GB]"
    assert f.driver_version == "535.161.08" and f.driver_flavour == "proprietary"
    assert len(f.gpus) == 8 and f.gpus[0].name == "NVIDIA H100 80GB HBM3" and f.gpus[0].memory_mib == 81559
    assert f.gpus[7].index == 7 and f.gpus[7].uuid.startswith("GPU-") and f.gpus[7].bus_id == "00000000:DF:00.0"
    assert f.nvidia_loaded and not f.nouveau_loaded
    assert f.secure_boot == "disabled"
    assert f.docker.server_version == "24.0.7" and f.docker.default_runtime == "nvidia"
    assert f.docker.runtimes == ("io.containerd.runc.v2", "nvidia", "runc")
    assert f.toolkit_version == "1.14.6"
    assert f.cgroup_version == 2
    assert {d.mount: d.free_bytes for d in f.disks}["/var/lib/docker"] == 6198893704 * 1024


def test_fresh_a100_host_everything_absent_maps_to_absent_values():
    f = load("a100-fresh-nouveau.txt")
    assert len(f.pci_gpus) == 8 and f.pci_gpus[0].device_id == "20b2"
    assert f.gpus == () and f.driver_version is None and f.driver_flavour is None
    assert f.nouveau_loaded and not f.nvidia_loaded
    assert f.secure_boot == "enabled"
    assert not f.docker.installed and not f.docker.running and f.docker.problem is None
    assert f.docker.runtimes == () and f.docker.default_runtime is None
    assert f.toolkit_version is None
    assert [d.mount for d in f.disks] == ["/"]  # df exit 1 for the missing /var/lib/docker still gives /


def test_a100_open_driver_550_with_docker_stopped_reads_daemon_json():
    f = load("a100-driver550-open-docker-stopped.txt")
    assert f.driver_version == "550.54.15" and f.driver_flavour == "open"
    assert [g.memory_mib for g in f.gpus] == [81920] * 8 and f.gpus[0].name == "NVIDIA A100-SXM4-80GB"
    assert f.docker.installed and not f.docker.running and f.docker.client_version == "26.1.3"
    assert f.docker.problem == "daemon not running"
    assert f.docker.runtimes == ("nvidia", "runc") and f.docker.default_runtime == "runc"
    assert f.toolkit_version == "1.15.0"


def test_output_cut_short_keeps_what_arrived_and_lists_the_rest():
    f = load("h100-cut-short.txt")
    assert f.driver_version == "535.161.08" and len(f.pci_gpus) == 8
    assert f.gpus == ()
    assert "nvidia_smi" in f.missing and "cgroup" in f.missing and "lspci" not in f.missing
    assert f.docker.installed is False and f.cgroup_version is None


def test_facts_serialise_to_json():
    data = json.loads(json.dumps(load("h100-driver535-docker-nvidia.txt").to_dict()))
    assert data["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"


def test_empty_output_gives_all_absent():
    f = parse_facts("")
    assert f.os.id is None and f.cpus is None and f.gpus == () and f.secure_boot == "unknown"
    assert len(f.missing) == len(PROBES)


@pytest.mark.parametrize(
    "line",
    [
        "garbage",
        "0, NVIDIA H100, GPU-x",  # too few fields
        "0, NVIDIA H100 80GB HBM3, GPU-5e1c, 81559, 550.54.15",  # a line cut short: its bus id missing
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
    ],
)
def test_nvidia_smi_noise_is_ignored(line):
    assert parse_nvidia_smi(Section(0, line)) == ((), None)


def test_nvidia_smi_failure_exit_code_gives_no_gpus():
    assert parse_nvidia_smi(Section(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")) == ((), None)


def test_nvidia_version_and_lspci_edge_cases():
    assert parse_nvidia_version(Section(0, "something else")) == (None, None)
    t4 = "01:00.0 VGA compatible controller [0300]: NVIDIA Corporation TU104GL [Tesla T4] [10de:1eb8] (rev a1)"
    assert parse_lspci(Section(0, t4))[0].device_id == "1eb8"
    assert parse_lspci(Section(0, "01:00.1 Audio device [0403]: NVIDIA Corporation Device [10de:10fa] (rev a1)")) == ()


def test_sysfs_fallback_when_lspci_is_missing():
    gpus = parse_pci_sysfs(Section(0, "0000:1b:00.0 0x030200 0x2330\n0000:05:00.0 0x068000 0x22a3\n"))
    assert [(g.slot, g.device_id) for g in gpus] == [("0000:1b:00.0", "2330")]
    out = "\n@@gpurig-fact lspci\nsh: 6: lspci: not found\n\n@@gpurig-rc 127\n\n@@gpurig-fact pci_sysfs\n0000:1b:00.0 0x030200 0x2330\n\n@@gpurig-rc 0\n"
    assert len(parse_facts(out).pci_gpus) == 1


@pytest.mark.parametrize("text,rc,state", [("   6   0   0   0   1", 0, "enabled"), ("   6   0   0   0   0", 0, "disabled"),
                                           ("legacy-bios", 0, "not-efi"), ("od: x: No such file", 1, "unknown")])
def test_secure_boot_states(text, rc, state):
    assert parse_secure_boot(Section(rc, text)) == state


def test_script_is_one_posix_sh_exec_with_fixed_text():
    # Nothing host-specific is interpolated into the script: it is a constant.
    dpkg_format = "${Package}\\t${db:Status-Abbrev}\\t${Version}"  # dpkg-query's own field syntax
    assert dpkg_format in FACTS_SCRIPT
    assert "{" not in FACTS_SCRIPT.replace("{{json .}}", "").replace("${d##*/}", "").replace(dpkg_format, "")
    assert FACTS_SCRIPT.count("@@gpurig-fact") == len(PROBES)


def test_each_probe_is_declared_once_and_parses_its_absence_to_an_absent_value():
    names = [probe.name for probe in PROBES]
    assert len(names) == len(set(names))
    for probe in PROBES:
        assert probe.shell in FACTS_SCRIPT
        probe.parse(ABSENT)  # a command that is not there is a value, never an exception


def test_a_declared_probe_travels_in_the_one_script_and_gets_its_own_section_back():
    uptime = Probe("uptime", "cut -d' ' -f1 /proc/uptime", lambda s: float(s.text) if s.ok else None)
    script = facts_script((uptime,))
    assert script.count("@@gpurig-fact") == 1 and "( cut -d' ' -f1 /proc/uptime ) 2>&1" in script
    assert read((uptime,), split_sections("\n@@gpurig-fact uptime\n12.5\n\n@@gpurig-rc 0\n")) == {"uptime": 12.5}
    assert read((uptime,), {}) == {"uptime": None}  # its section never arrived


def test_the_summary_script_leaves_out_provision_and_the_traps_probes_and_keeps_what_the_verdict_reads():
    script = facts_script(SUMMARY_PROBES)
    for word in ("dpkg-query", "systemctl", "apt-config", "apt-cache", "/etc/machine-id"):
        assert word in FACTS_SCRIPT and word not in script
    for word in ("nvidia-smi", "docker info", "/proc/driver/nvidia/version", "python3 --version", "/etc/os-release"):
        assert word in script
    assert script.count("@@gpurig-fact") == len(SUMMARY_PROBES) < len(PROBES) and script.count("\n") < FACTS_SCRIPT.count("\n")


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.txt")))
def test_facts_from_the_summary_probes_judge_a_host_as_the_full_facts_do(name):
    text = (FIXTURES / f"{name}.txt").read_text()
    full, summary = parse_facts(text), parse_facts(text, SUMMARY_PROBES)
    for cuda in ("cpu", "12.8", "13.0"):
        said, said_full = lacks(summary, cuda), lacks(full, cuda)
        if full.missing:  # cut short: both say so, the summary naming only the sections it asked for
            assert said[0].startswith("facts cut short (") and said_full[0].startswith("facts cut short (")
            said, said_full = said[1:], said_full[1:]
        assert said == said_full
    assert (summary.os, summary.gpus, summary.driver_version, summary.docker, summary.toolkit_version) == \
        (full.os, full.gpus, full.driver_version, full.docker, full.toolkit_version)
    assert set(summary.missing) <= set(full.missing)  # a recorded run cut short is still cut short, in what was asked
    assert set(summary.unasked) == {p.name for p in PROBES} - {p.name for p in SUMMARY_PROBES} and full.unasked == ()
    assert summary.system.installed == {} and summary.system.services == {}  # what was not asked is absent, not guessed
    assert json.loads(json.dumps(summary.to_dict()))["unasked"] == list(summary.unasked)  # the JSON report names them
