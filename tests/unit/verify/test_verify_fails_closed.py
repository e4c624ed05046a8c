"""Verify fails closed: a host whose probes are missing, unreadable, silent, garbled or skip everything is failed, never ok.

Each way a probe can be absent or silent gets its own case, through the same
path a run takes (VerifyPlan -> verify_host -> the fleet outcome -> the JSON's
``passed``). The hosts are ScriptedConnections answering with what such a
probe prints; the last tests run the real CLI, from this checkout and from a
copy of the package that ships no probes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import RecordedEngine, ScriptedConnection
from test_verify_host import nvidia_on_this_pci_bus

from gpurig import skeleton
from gpurig.connect.connection import Result
from gpurig.connect.engineinfo import Exited, image_info
from gpurig.results import FleetReport, HostResult
from gpurig.status import Status
from gpurig.verify import runner
from gpurig.verify.gate import fleet_passed, verdict_outcome
from gpurig.verify.records import HostVerdict, Record, unchecked
from gpurig.verify.runner import DockerFacts, VerifyPlan, container_records, read_probe, verify_host

ROOT = Path(__file__).resolve().parents[3]
HOST_PROBE_TEXT = "print('the host probe')"


def doc(*records: dict) -> str:
    return json.dumps({"probe": "host", "version": 1, "records": list(records)}) + "\n"


def verified(answer: tuple[int, str, str], plan: VerifyPlan | None = None) -> HostVerdict:
    """One host's verdict where the host probe printed ``answer`` (exit, stdout, stderr)."""
    return verify_host(ScriptedConnection("gpu-01", [answer]), plan or VerifyPlan(host_probe=HOST_PROBE_TEXT))


def assert_failed_with_one_line(verdict: HostVerdict, *fragments: str) -> str:
    """The verdict is not a pass, the fleet sees a failed host, and its reason is one line naming why."""
    assert not verdict.passed and verdict.worst == "fail"
    outcome = verdict_outcome(verdict)
    assert outcome.status == Status.FAILED
    assert "\n" not in outcome.detail
    for fragment in fragments:
        assert fragment in outcome.detail, outcome.detail
    report = FleetReport((HostResult("gpu-01", outcome.resolved, outcome.detail, verdict),), "t", 0.1)
    assert fleet_passed(report) is False
    assert verdict.to_dict()["passed"] is False
    return outcome.detail


# ---- the probe's source is not in this gpurig ----


def test_the_plan_carries_the_probes_this_gpurig_ships():
    """The mutation 'probes looked up in a missing folder' must turn this red: the plan holds the real files' text."""
    plan = VerifyPlan.from_checks()
    assert plan.host_probe == (ROOT / "checks" / "verify_host.py").read_text()
    assert plan.torch_probe == (ROOT / "checks" / "verify_torch.py").read_text()
    assert plan.host_probe_error == plan.torch_probe_error == ""


def test_a_probe_missing_from_the_install_fails_the_host_naming_the_file():
    text, why = read_probe("checks/verify_nothing.py")
    assert text is None and "has no checks/verify_nothing.py" in why
    verdict = verified((0, "", ""), VerifyPlan(host_probe=None, host_probe_error=why))
    detail = assert_failed_with_one_line(verdict, "host.probe", "the host could not be checked", "checks/verify_nothing.py")
    assert "reinstall gpurig" in verdict.failures[0].fix and detail


@pytest.mark.parametrize(("content", "reason"), [
    (None, "cannot be read"),  # a directory where the file should be
    (b"\xff\xfe not utf-8", "cannot be read"),
    (b"  \n", "is empty"),
])
def test_an_unreadable_or_empty_probe_fails_the_host(tmp_path, monkeypatch, content, reason):
    probe = tmp_path / "verify_host.py"
    if content is None:
        probe.mkdir()
    else:
        probe.write_bytes(content)
    monkeypatch.setattr(skeleton, "shipped", lambda path: probe)  # where this install keeps it
    text, why = read_probe("checks/verify_host.py")
    assert text is None and reason in why
    plan = VerifyPlan.from_checks()
    assert plan.host_probe is None
    assert_failed_with_one_line(verified((0, "", ""), plan), "host.probe", reason)


# ---- the probe ran and said nothing useful ----


def test_a_host_probe_that_printed_nothing():
    assert_failed_with_one_line(verified((0, "", "")), "host.probe", "printed nothing (exit 0)", "nothing was checked")


def test_a_host_probe_that_printed_garbage():
    assert_failed_with_one_line(verified((0, "Welcome to gpu-01!\nthis is not json\n", "")), "printed no records: this is not json")


@pytest.mark.parametrize("stdout", [doc(), json.dumps({"records": "none"}), json.dumps({"records": [1, "x", None]}), "[]"])
def test_a_host_probe_document_without_records(stdout):
    assert_failed_with_one_line(verified((0, stdout, "")), "host.probe", "nothing was checked")


def test_a_host_probe_whose_every_record_skipped():
    stdout = doc({"id": "host.driver", "status": "skip", "detail": "NVML not importable"},
                 {"id": "host.gpu_count", "status": "skip", "detail": "skipped: driver not loaded"})
    verdict = verified((0, stdout, ""))
    assert_failed_with_one_line(verdict, "host.checked", "nothing was checked on the host", "NVML not importable")
    assert [r.id for r in verdict.records] == ["host.driver", "host.gpu_count", "host.checked"]


def test_a_host_with_a_failed_record_and_nothing_else_needs_no_second_line():
    """A GPU-less host: the driver record fails with its reason; that is the line, not 'nothing was checked'."""
    stdout = doc({"id": "host.driver", "status": "fail", "detail": "no NVIDIA driver loaded"}, {"id": "host.xid", "status": "skip"})
    verdict = verified((0, stdout, ""))
    assert_failed_with_one_line(verdict, "host.driver: no NVIDIA driver loaded")
    assert "host.checked" not in [r.id for r in verdict.records]


def test_a_host_whose_records_ran_and_passed_is_the_only_pass():
    verdict = verified((0, doc({"id": "host.driver", "status": "pass"}, {"id": "host.xid", "status": "skip"}), ""))
    assert verdict.passed and verdict_outcome(verdict).status is None
    report = FleetReport((HostResult("gpu-01", Status.OK, "", verdict),), "t", 0.1)
    assert fleet_passed(report) is True
    assert fleet_passed(FleetReport((), "t", 0.1)) is False  # no host at all proves nothing either


def test_a_verdict_made_of_skips_is_not_passed_even_without_the_runner():
    """The backstop: a HostVerdict built elsewhere (a replayed report) with only skips is not a pass and not ok."""
    verdict = HostVerdict("gpu-01", (Record("host", "host.driver", "skip"),))
    assert not verdict.passed
    outcome = verdict_outcome(verdict)
    assert outcome.status == Status.FAILED and "nothing was checked on the host" in outcome.detail


# ---- the container level, when a target is named ----


def test_no_torch_probe_in_this_gpurig_fails_the_container_level():
    plan = VerifyPlan(image="img:1", host_probe=HOST_PROBE_TEXT, torch_probe=None, torch_probe_error="this gpurig has no checks/verify_torch.py")
    [r] = container_records(None, plan, DockerFacts(), [])
    assert r.status == "fail" and "image img:1 could not be checked: this gpurig has no checks/verify_torch.py" in r.detail


@pytest.mark.parametrize(("stdout", "said"), [
    ("", "printed nothing"),
    (json.dumps({"records": []}), "a document with no records"),
])
def test_a_silent_container_probe_is_a_failure(stdout, said):
    facts = DockerFacts(image=image_info({"Id": "sha256:" + "1" * 64, "Config": {"Labels": {}}}))  # found: the probe runs
    plan = VerifyPlan(image="img:1", host_probe=HOST_PROBE_TEXT, torch_probe="print(1)")
    engine = RecordedEngine(ended=Exited(0, stdout, ""))
    [r] = container_records(ScriptedConnection("gpu-01"), plan, facts, [], engine_of=lambda conn, timeout: engine)
    assert r.status == "fail" and r.id == "container.probe" and said in r.detail
    [(verb, body)] = engine.asked
    assert verb == "run" and body["Image"] == "img:1"


def test_a_container_probe_whose_every_record_skipped_adds_one_failure():
    records = [Record("host", "host.driver", "pass"),
               Record("container", "torch.import", "skip", detail="no torch in the image"),
               Record("container", "cuda.available", "skip", detail="skipped: needs torch.import")]
    [r] = unchecked(records, "image img:1")
    assert r.id == "container.checked" and r.status == "fail"
    assert r.detail == "nothing was checked in image img:1: every record was skipped (no torch in the image)"
    assert unchecked(records, "") == []  # host-only verification: the container level was not asked for
    records[1] = Record("container", "torch.import", "pass")
    assert unchecked(records, "image img:1") == []


def test_a_probe_result_with_only_stderr_says_it():
    r = runner.probe_failed(Result("gpu-01", "docker run", 125, "", "docker: Error response from daemon: oops.\n"), VerifyPlan(image="i"))
    assert r.status == "fail" and "docker: Error response from daemon: oops." in r.detail


# ---- the real CLI ----


def gpurig(cwd: Path, *args: str, pythonpath: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "COLUMNS": "250", "HOME": str(cwd)}
    return subprocess.run([sys.executable, "-c", "from gpurig.cli import main; main()", *args], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def local_inventory(where: Path) -> Path:
    inv = where / "hosts.yaml"
    inv.write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n")
    return inv


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="this machine has an NVIDIA driver: the verdict would differ")
def test_verify_of_this_gpu_less_machine_fails_with_the_driver_reason(tmp_path):
    proc = gpurig(tmp_path, "verify", "-i", str(local_inventory(tmp_path)), "--json", "report.json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] is False
    [host] = report["hosts"]
    # no GPU here (the usual CI machine) is said as such, with provision's own answer; a GPU without its driver asks for one
    said = "no NVIDIA driver loaded" if nvidia_on_this_pci_bus() else "no NVIDIA GPU on this host"
    assert host["status"] == "failed" and host["reason"].startswith(f"host.driver: {said}"), host["reason"]
    assert host["data"]["passed"] is False and host["data"]["worst"] == "fail"


@pytest.fixture
def package_without_probes(tmp_path) -> Path:
    """gpurig's package alone, as a broken install leaves it: no skeleton/ beside it, no checkout around it."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "gpurig", site / "gpurig", ignore=shutil.ignore_patterns("__pycache__", "skeleton"))
    return site


def test_verify_from_an_install_without_probes_fails_every_host_in_one_line(tmp_path, package_without_probes):
    work = tmp_path / "work"
    work.mkdir()
    proc = gpurig(work, "verify", "-i", str(local_inventory(work)), "--json", "-", pythonpath=package_without_probes)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] is False
    [host] = report["hosts"]
    assert host["status"] == "failed"
    assert host["reason"].startswith("host.probe: the host could not be checked: this gpurig") and "installed without its project files" in host["reason"]
    assert [r["id"] for r in host["data"]["records"]] == ["host.probe"]
    failed = [line for line in proc.stderr.splitlines() if line.startswith("failed")]
    assert len(failed) == 1 and "reinstall" in failed[0], proc.stderr


def test_monitor_from_an_install_without_its_sampler_says_so_before_any_host(tmp_path, package_without_probes):
    work = tmp_path / "work"
    work.mkdir()
    proc = gpurig(work, "monitor", "-i", str(local_inventory(work)), "--duration", "1", "--csv", "out.csv", pythonpath=package_without_probes)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("gpurig: this gpurig") and "installed without its project files" in line and "fix: reinstall" in line
    assert not (work / "out.csv").exists()
