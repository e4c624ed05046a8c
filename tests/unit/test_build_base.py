"""gpurig.image.baseimage's pure parts: how the base that was used is named and described."""

from __future__ import annotations

import time
from pathlib import Path

from gpurig.image.baseimage import BaseImage, _slim_down, bootstrap_description, bootstrap_tag
from gpurig.image.spec import Bootstrap

BOOKWORM = Bootstrap("bookworm", "http://deb.debian.org/debian")


def test_bootstrapped_base_is_named_and_described_as_a_stand_in():
    assert bootstrap_tag(BOOKWORM) == "gpurig-base:bookworm-minbase"
    made = BaseImage("debian:bookworm-slim", "bootstrapped", "sha256:1", (), bootstrap_description(BOOKWORM))
    line = made.describe()
    assert "no registry answered" in line and "stand-in" in line and "debootstrap --variant=minbase bookworm" in line
    later = BaseImage("debian:bookworm-slim", "local", "sha256:1", (), bootstrap_description(BOOKWORM))
    assert later.stand_in and "docker rmi debian:bookworm-slim" in later.describe()
    assert made.as_dict()["bootstrap"] == bootstrap_description(BOOKWORM)


def test_registry_bases_say_where_they_came_from():
    pulled = BaseImage("debian:bookworm-slim", "pulled", "sha256:1", ("debian@sha256:abc",))
    assert not pulled.stand_in and "pulled" in pulled.describe() and "debian@sha256:abc" in pulled.describe()
    local = BaseImage("debian:bookworm-slim", "local", "sha256:1", ())
    assert "local image store (sha256:1)" in local.describe() and local.as_dict()["bootstrap"] is None


def test_slim_down_keeps_apt_working_and_adds_updates(tmp_path: Path):
    root = tmp_path / "rootfs"
    for sub in ("etc/apt", "var/cache/apt/archives/partial", "var/lib/apt/lists", "usr/share/man/man1", "var/log"):
        (root / sub).mkdir(parents=True)
    (root / "etc/apt/sources.list").write_text("deb http://deb.debian.org/debian bookworm main\n")
    (root / "var/cache/apt/archives/x.deb").write_text("deb")
    (root / "var/cache/apt/archives/lock").write_text("")
    (root / "var/log/dpkg.log").write_text("log")
    (root / "etc/machine-id").write_text("0123\n")
    _slim_down(root, BOOKWORM)
    assert (root / "etc/apt/sources.list").read_text().splitlines() == [
        "deb http://deb.debian.org/debian bookworm main",
        "deb http://deb.debian.org/debian bookworm-updates main",
        "deb http://deb.debian.org/debian-security bookworm-security main",
    ]
    assert not (root / "var/cache/apt/archives/x.deb").exists() and (root / "var/cache/apt/archives/partial").is_dir()
    assert not (root / "var/log/dpkg.log").exists() and (root / "etc/machine-id").read_text() == ""
    assert "path-exclude /usr/share/doc/*" in (root / "etc/dpkg/dpkg.cfg.d/gpurig-slim").read_text()


def test_an_overrunning_bootstrap_goes_with_its_children(monkeypatch, tmp_path: Path):
    import gpurig.image.baseimage as base

    monkeypatch.setattr(base, "DEBOOTSTRAP_TIMEOUT_S", 2)
    pidfile = tmp_path / "child.pid"
    code, output = base._run_group(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"])
    assert code == -1 and "no end within 2 s" in output
    state = Path(f"/proc/{int(pidfile.read_text())}/stat")

    def gone() -> bool:  # SIGKILLed; a zombie until init reaps it
        try:
            return state.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    deadline = time.monotonic() + 10
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(), "debootstrap's child outlived it"
    assert base._run_group(["sh", "-c", "echo made; exit 3"]) == (3, "made\n")
