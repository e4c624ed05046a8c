"""What the operation cases cannot show: step selection flags, the air-gapped toolkit plan, the reboot's bounded wait, the apt guard."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fakes import ScriptedConnection

from gpurig.connect.connection import ConnectionLost
from gpurig.errors import ConfigError, HostError, InventoryError
from gpurig.facts import parse_facts
from gpurig.flows.fleetprovision import pick_steps
from gpurig.inventory import Host
from gpurig.inventory.profile import host_profile
from gpurig.steps import RebootStep, Shell, ToolkitStep, Upload
from gpurig.steps.apt import candidate_guard, install_command

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


OTHER_MACHINE = "00000000000000000000000000000001"  # the machine gpurig runs on, in these tests: not the host

def facts(name: str):
    return parse_facts((FIXTURES / f"{name}.txt").read_text())


def test_the_step_names_provision_offers_are_the_steps_in_their_order():
    from gpurig.cli.provision import SLURM, STEP_NAMES
    from gpurig.flows.fleetprovision import step_names
    from gpurig.steps import STEPS

    assert STEP_NAMES == (*STEPS, SLURM) == step_names()


def test_only_and_skip_keep_the_run_order():
    assert pick_steps("daemon,docker", None) == ["docker", "daemon"]
    assert pick_steps(None, "reboot,driver") == ["gpus", "nouveau", "docker", "container-toolkit", "daemon", "gpu-devices", "driver-hold",
                                                 "fabric-manager", "mig", "persistence", "python3", "slurm"]
    with pytest.raises(ConfigError, match="--skip dockr: no such step"):
        pick_steps(None, "dockr")
    with pytest.raises(ConfigError, match="leave no step"):
        pick_steps("docker", "docker")


def test_air_gapped_toolkit_pushes_the_local_debs(tmp_path):
    for name in ("nvidia-container-toolkit_1.17.8-1_amd64.deb", "libnvidia-container1_1.17.8-1_amd64.deb"):
        (tmp_path / name).write_bytes(b"!<arch>\n")
    wanted = host_profile(Host("h", (), {"gpurig_toolkit": {"packages_dir": str(tmp_path)}}))
    plan = ToolkitStep().plan(facts("a100-fresh-secure-boot-off"), wanted)
    install = plan.changes[0]
    assert install.summary == f"install nvidia-container-toolkit from 2 .deb files in {tmp_path} (pushed over SSH)"
    uploads = [c for c in install.commands if isinstance(c, Upload)]
    assert [u.local for u in uploads] == sorted(str(p) for p in tmp_path.iterdir())
    remote = uploads[0].remote.rsplit("/", 1)[0]
    apt = next(c.line for c in install.commands if isinstance(c, Shell))
    assert apt.startswith(f"cd {remote} && ") and "./libnvidia-container1_1.17.8-1_amd64.deb" in apt
    assert "apt-get -q -y" in apt and " update" not in apt  # no repository is asked
    assert not any("nvidia.github.io" in str(c) for change in plan.changes for c in change.commands)


def test_air_gapped_toolkit_without_debs_is_one_clear_error(tmp_path):
    wanted = host_profile(Host("h", (), {"gpurig_toolkit": {"packages_dir": str(tmp_path)}}))
    with pytest.raises(InventoryError, match="holds no .deb files"):
        ToolkitStep().plan(facts("a100-fresh-secure-boot-off"), wanted)


ANSWERS = {"back": (0, "", ""), "old": (1, "", ""), "down": ConnectionLost("connection lost", "check the host", host="gpu-01")}


def rebooting_host(answers):
    """A host that reboots (what no machine here may do): the old boot a while, then gone, then back."""
    return ScriptedConnection("gpu-01", [ANSWERS[a] for a in answers] or [ANSWERS["back"]])


def test_reboot_waits_for_a_new_boot_id(monkeypatch):
    monkeypatch.setattr("gpurig.steps.reboot.POLL_S", 0)
    step = RebootStep(allowed=True, local_machine_id=OTHER_MACHINE, wait_s=30)
    plan = step.plan(facts("a100-driver-mismatch"), host_profile(Host("h", (), {})))
    host = rebooting_host(["back", "old", "down", "down", "back"])
    step.apply(host, plan)
    assert "systemctl reboot" in host.lines[0]
    assert host.lines[1:] == ['test "$(cat /proc/sys/kernel/random/boot_id)" != c0ffee00-1b2c-4d3e-8f4a-5b6c7d8e9f01'] * 4


def test_reboot_gives_up_after_its_bound(monkeypatch):
    monkeypatch.setattr("gpurig.steps.reboot.POLL_S", 0)
    step = RebootStep(allowed=True, local_machine_id=OTHER_MACHINE, wait_s=0.05)
    plan = step.plan(facts("a100-driver-mismatch"), host_profile(Host("h", (), {})))
    with pytest.raises(HostError, match="did not come back within 0 s"):
        step.apply(rebooting_host(["back"] + ["down"] * 10_000), plan)


def test_candidate_guard_refuses_an_old_candidate_on_the_host(tmp_path):
    """The guard runs after apt-get update on the host: here against a fake apt-cache printing Debian 12's answer."""
    (tmp_path / "apt-cache").write_text("#!/bin/sh\nprintf 'nvidia-driver:\\n  Installed: (none)\\n  Candidate: 535.309.01-0+deb12u1\\n'\n")
    (tmp_path / "apt-cache").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    old = subprocess.run(["sh", "-c", candidate_guard("nvidia-driver", "580.65.06", "CUDA 13.0")], env=env, capture_output=True, text=True)
    assert old.returncode == 1
    assert old.stderr.strip() == "apt would install nvidia-driver 535.309.01-0+deb12u1, older than 580.65.06 (CUDA 13.0)"
    ok = subprocess.run(["sh", "-c", candidate_guard("nvidia-driver", "535.54.03", "CUDA 12.2")], env=env, capture_output=True, text=True)
    assert ok.returncode == 0


def test_install_finishes_interrupted_dpkg_first_and_quotes_names():
    line = install_command("docker.io", "nvidia-container-toolkit=1.17.8*", optional=("docker-cli",))
    assert line.index("dpkg --configure -a") < line.index(" update") < line.index("install --no-install-recommends")
    # a package dpkg left needing a reinstall is reinstalled from the fresh lists, then configured, before the install
    assert line.index(" update") < line.index("install --reinstall") < line.rindex("dpkg --configure -a") < line.index(
        "install --no-install-recommends docker.io")
    assert "'nvidia-container-toolkit=1.17.8*'" in line
    assert "if apt-cache show docker-cli" in line


def test_after_a_reboot_every_other_step_is_planned_again_from_fresh_facts(monkeypatch):
    """Before: module 550.54.15 with library 550.90.07 (mismatch). After the reboot: the A100 with module and library agreeing."""
    from gpurig.steps import DriverStep, GpusStep, converge_rebooting

    monkeypatch.setattr("gpurig.steps.reboot.POLL_S", 0)
    seen = [facts("a100-driver-mismatch"), facts("a100-driver550-open-docker-stopped"), facts("a100-driver550-open-docker-stopped")]
    gathered = []

    def gather(conn):
        gathered.append(seen[len(gathered)])
        return gathered[-1]

    steps = [GpusStep(), DriverStep(reboot=True), RebootStep(allowed=True, local_machine_id=OTHER_MACHINE, wait_s=30)]
    results = converge_rebooting(rebooting_host(["back", "back"]), steps, host_profile(Host("h", (), {})), gather=gather)
    assert [(r.step, r.status) for r in results] == [("gpus", "ok"), ("driver", "ok"), ("reboot", "changed")]
    assert results[1].reason.startswith("driver 550.54.15 loaded")  # planned from the host as it came back
    assert len(gathered) == 3  # before, after the reboot (converge's own re-gather), and the second pass


def test_check_mode_never_reboots():
    from gpurig.steps import converge_rebooting

    host = rebooting_host([])
    results = converge_rebooting(host, [RebootStep(allowed=True, local_machine_id=OTHER_MACHINE)], host_profile(Host("h", (), {})), check=True,
                                 gather=lambda conn: facts("a100-driver-mismatch"))
    assert results[0].status == "changed" and results[0].reason.startswith("would change (check mode)")
    assert host.lines == []


def test_reboot_never_runs_over_a_local_connection():
    from gpurig.connect.local import LocalConnection

    step = RebootStep(allowed=True, local_machine_id=OTHER_MACHINE, wait_s=30)
    plan = step.plan(facts("a100-driver-mismatch"), host_profile(Host("h", (), {})))
    with pytest.raises(HostError, match="never reboots it"):
        step.apply(LocalConnection("here", become=True), plan)


def test_a_toolkit_pin_is_a_version_not_a_prefix():
    from gpurig.steps.toolkit import _pinned

    assert _pinned("1.17.8-1", "1.17.8") and _pinned("1.17.8", "1.17.8") and _pinned("1.17.8-1", "1.17.8-1")
    assert not _pinned("1.17.80-1", "1.17.8")  # a prefix match took this for the pinned version


def test_the_python3_install_is_one_idempotent_apt_line():
    from gpurig.steps import Python3Step

    [change] = Python3Step().plan(facts("debian12-container-fresh"), host_profile(Host("h", (), {}))).changes
    [shell] = change.commands
    assert shell.line == install_command("python3")  # dpkg --configure -a, update, install: a rerun after a lost host completes
    assert "--no-install-recommends python3" in shell.line


def test_check_mode_shows_daemon_json_once_as_it_will_be_after_every_step():
    """Seen: --check --diff showed the toolkit's runtime and gpurig_daemon's keys as two diffs, each from the
    file as it is, so neither was the file provision would leave."""
    import io

    from rich.console import Console

    from gpurig.report.changes import print_diffs
    from gpurig.results import FleetReport, HostResult
    from gpurig.steps import DaemonStep, converge

    host = Host("l4", (), {"gpurig_daemon": {"log-opts": {"max-size": "10m"}}})
    l4 = facts("debian12-l4-nonfree-nouveau")  # a GPU, Docker running, a daemon.json without the nvidia runtime
    results = converge(ScriptedConnection("l4"), [ToolkitStep(), DaemonStep()], host_profile(host), check=True, diff=True,
                       gather=lambda conn: l4)
    assert [r.status for r in results] == ["changed", "changed"]
    out = Console(width=300, record=True, file=io.StringIO())
    print_diffs(FleetReport((HostResult("l4", results[1].status, data=tuple(results)),), "", 0.0), out)
    text = out.export_text()
    assert text.count("--- /etc/docker/daemon.json (host)") == 1, text
    assert text.splitlines()[0] == ("l4 container-toolkit: add the nvidia runtime to /etc/docker/daemon.json; "
                                    "daemon: merge into /etc/docker/daemon.json: add log-opts (old file kept as "
                                    "daemon.json.gpurig-bak.<time>)")
    added = [line for line in text.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert any('"nvidia"' in line for line in added) and any('"max-size": "10m"' in line for line in added), text
    removed = [line for line in text.splitlines() if line.startswith("-") and not line.startswith("---")]
    kept = {line[1:].rstrip(",") for line in added}
    assert all(line[1:].rstrip(",") in kept for line in removed), text  # nothing of the host's own is lost
