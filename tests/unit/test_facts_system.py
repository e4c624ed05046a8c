"""Package, apt, service, group and identity facts parsed from recorded outputs (tests/fixtures/facts)."""

from __future__ import annotations

from pathlib import Path

from gpurig.facts import FACTS_SCRIPT, Section, parse_facts
from gpurig.facts.system import parse_apt_policy, parse_packages, parse_services

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def load(name: str):
    return parse_facts((FIXTURES / name).read_text())


def test_one_script_still_carries_every_probe():
    for probe in ("dpkg-query -W", "apt-cache policy", "systemctl is-enabled", "getent group docker", "/etc/machine-id"):
        assert probe in FACTS_SCRIPT


def test_debian12_ci_machine_recorded():
    s = load("debian12-root.txt").system
    assert s.installed == {"docker.io": "20.10.24+dfsg1-1+deb12u1+b6"}  # docker-ce "un" (known, not installed) is left out
    assert s.candidates["nvidia-driver"] is None and s.candidates["docker.io"] == "20.10.24+dfsg1-1+deb12u1+b6"
    assert s.systemd is False and s.service("docker").enabled == "enabled" and not s.service("docker").running
    assert s.docker_members == () and s.nouveau_blacklisted == () and s.nvml_version is None
    assert s.machine_id and len(s.machine_id) == 32 and s.boot_id and s.reboot_required is False


def test_fresh_container_host_recorded_over_ssh():
    s = load("debian12-systemd-fresh.txt").system
    assert s.installed.get("docker.io") is None and s.systemd
    assert s.service("docker") == s.service("nvidia-persistenced")  # neither unit exists
    assert not s.service("docker").enabled and s.docker_members is None


def test_container_host_after_provision_recorded():
    s = load("debian12-systemd-docker.txt").system
    assert "docker.io" in s.installed
    assert s.service("docker").enabled == "enabled" and s.service("docker").running
    assert s.docker_members == ("gpurig",)


def test_debian13_recorded_has_the_separate_client():
    f = load("debian13-systemd-docker.txt")
    assert f.os.codename == "trixie" and "docker.io" in f.system.installed and f.docker.client_version


def test_debian12_non_free_candidate_is_535():
    assert load("debian12-l4-nonfree-nouveau.txt").system.candidates["nvidia-driver"].startswith("535.")


def test_gpu_host_packages_repositories_library():
    s = load("h100-driver535-docker-nvidia.txt").system
    assert s.installed["nvidia-driver-535-server"].startswith("535.161.08")
    assert set(s.repositories) == {"docker", "nvidia-container-toolkit"}
    assert s.nvml_version == "535.161.08" and s.nouveau_blacklisted == ("/etc/modprobe.d/blacklist-nouveau.conf",)
    assert s.service("nvidia-persistenced").running and s.docker_members == ("dgxuser",)


def test_half_installed_packages_are_broken_not_installed():
    installed, broken = parse_packages(Section(0, "docker.io\tiU \t26.1.5+dfsg1-9\ncontainerd\tii \t1.7.24~ds1-6\nrunc\tiF \t1.1.15\n"))
    assert installed == {"containerd": "1.7.24~ds1-6"} and broken == ("docker.io", "runc")


def test_apt_policy_none_and_unknown():
    text = "nvidia-driver:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\ndocker.io:\n  Installed: (none)\n  Candidate: 26.1.5\n"
    assert parse_apt_policy(Section(0, text)) == {"nvidia-driver": None, "docker.io": "26.1.5"}
    assert parse_apt_policy(Section(0, "")) == {}


def test_services_without_systemd_say_so():
    services, systemd = parse_services(Section(0, "docker enabled= active=\nnvidia-persistenced enabled= active=\nsystemd no\n"))
    assert not systemd and services["docker"].enabled == "" and not services["docker"].running
