"""The verify runner's decisions from recorded Docker output, its fleet table, and its JUnit XML."""

from __future__ import annotations

import json
import socket
import struct
import time
import xml.etree.ElementTree as ET

import pytest
from fakes import RecordedEngine, ScriptedConnection

from gpurig.connect.connection import Result
from gpurig.connect.engine import EngineError
from gpurig.connect.engineinfo import Exited, container_info, image_info
from gpurig.connect.enginewire import demux, read_to_end
from gpurig.errors import ConfigError
from gpurig.facts.probes import MARK, RC_MARK
from gpurig.flows.fleetverify import host_rows, record_rows
from gpurig.results import FleetReport, HostResult
from gpurig.verify.gate import make_plan
from gpurig.verify.junit import junit_xml
from gpurig.verify.records import HostVerdict, Record
from gpurig.verify.runner import (
    HOST_SCRIPT,
    DockerFacts,
    VerifyPlan,
    container_records,
    docker_facts,
    parse_document,
    parse_host_gpus,
    probe_argv,
    probe_failed,
    run_body,
    toolkit_records,
    uuid_record,
)

SMI_L = ("GPU 0: NVIDIA H200 (UUID: GPU-2b6ecd7e-4f6b-1d5a-9f0c-0c1f5c1e3a11)\n"
         "GPU 1: NVIDIA H200 (UUID: GPU-7a0f8e52-93d1-4c43-8b0e-55d1a2b3c4d5)\n")
RUNTIMES_NVIDIA = ("io.containerd.runc.v2", "nvidia", "runc")  # what the engine's info lists
RUNTIMES_PLAIN = ("io.containerd.runc.v2", "runc")


def probe_output(smi: str = "", hooks: str = "", proc: str = "") -> str:
    """What HOST_SCRIPT prints: each probe's output between its facts/probes.py markers (an empty one as a failed command)."""
    sections = (("gpu_uuids", smi), ("nvidia_hook", hooks), ("nvidia_version", proc))
    return "".join(f"\n{MARK} {name}\n{text}\n{RC_MARK} {0 if text else 1}\n" for name, text in sections)


def inspect(runtime="runc", gpus=False, running=True, cuda="13.0") -> dict:
    """A container as the engine's inspect answers (the fields verify reads)."""
    requests = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}] if gpus else None
    return {
        "Id": "c" * 64, "Name": "/alice",
        "State": {"Status": "running" if running else "exited", "Running": running, "ExitCode": 0 if running else 137},
        "HostConfig": {"Runtime": runtime, "DeviceRequests": requests, "ShmSize": 67108864},
        "Config": {"Labels": {"io.gpurig.cuda": cuda, "io.gpurig.min-driver": "580.65.06"}},
    }


def host_facts(smi=SMI_L, runtimes=RUNTIMES_NVIDIA, hooks="", proc="", container=None, image_cuda=None) -> DockerFacts:
    """The facts as docker_facts gathers them: the shell probe's recorded output, then the engine's answers."""
    uuids, hook, driver = parse_host_gpus(probe_output(smi, hooks, proc))
    image = None
    if image_cuda:
        image = image_info({"Id": "sha256:" + "1" * 64, "Config": {"Labels": {"io.gpurig.cuda": image_cuda, "io.gpurig.min-driver": "580.65.06"}}})
    return DockerFacts(uuids, hook, driver, runtimes, container=container_info(container) if container else None, image=image)


def test_nvidia_runtime_missing_on_a_gpu_host():
    facts = host_facts(runtimes=RUNTIMES_PLAIN, image_cuda="13.0")
    [r] = toolkit_records(facts, VerifyPlan(image="img"))
    assert r.status == "fail" and "nvidia runtime is missing" in r.detail and "gpurig provision" in r.fix
    assert r.measured == "io.containerd.runc.v2, runc"
    assert "DeviceRequests" not in run_body(VerifyPlan(image="img", torch_probe="pass"), facts)["HostConfig"]


def test_deployed_container_without_gpus():
    facts = host_facts(hooks="/usr/bin/nvidia-container-runtime-hook\n", container=inspect())
    [r] = toolkit_records(facts, VerifyPlan(container="alice"))
    assert r.status == "fail" and "started without GPUs" in r.detail and "gpurig_containers" in r.fix


def test_deployed_container_with_gpus_and_its_label_passed_on():
    facts = host_facts(container=inspect(gpus=True))
    [r] = toolkit_records(facts, VerifyPlan(container="alice"))
    assert r.status == "pass" and "--gpus" in r.detail
    argv = probe_argv(VerifyPlan(container="alice", torch_probe="print(1)"), facts)
    assert argv[:2] == ["python3", "-c"] and argv[-2:] == ["--expect-cuda", "13.0"]


def test_a_deployed_container_that_is_not_running_is_said_so():
    [r] = container_records(
        None, VerifyPlan(container="alice", torch_probe="x"), host_facts(container=inspect(gpus=True, running=False)), [])
    assert (r.status, r.measured) == ("fail", "exited") and "not running (exited, exit code 137)" in r.detail


def test_image_run_asks_for_gpus_only_where_the_host_can():
    plan = VerifyPlan(image="pytorch:slim-cu130", torch_probe="print(1)", level="full")
    with_gpus = run_body(plan, host_facts(image_cuda="13.0"))
    every_gpu = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}]  # docker run --gpus all
    assert with_gpus["Image"] == "pytorch:slim-cu130" and with_gpus["HostConfig"]["DeviceRequests"] == every_gpu
    assert with_gpus["HostConfig"]["ShmSize"] == 16 * 1024**3 and with_gpus["Labels"] == {"io.gpurig.verify": "1"}
    assert with_gpus["Entrypoint"] == ["python3"] and with_gpus["Cmd"][0] == "-c"
    hook_only = run_body(plan, host_facts(runtimes=RUNTIMES_PLAIN, hooks="/usr/bin/nvidia-container-runtime-hook\n", image_cuda="13.0"))
    assert hook_only["HostConfig"]["DeviceRequests"] == every_gpu  # --gpus works through NVIDIA's hook without the nvidia runtime
    cpu_host = run_body(plan, host_facts(smi="", runtimes=RUNTIMES_PLAIN, image_cuda="cpu"))
    assert "DeviceRequests" not in cpu_host["HostConfig"] and cpu_host["Cmd"][-4:] == ["--level", "full", "--expect-cuda", "cpu"]


def test_cpu_host_skips_the_toolkit_with_its_reason():
    facts = host_facts(smi="", runtimes=RUNTIMES_PLAIN, image_cuda="13.0")
    [r] = toolkit_records(facts, VerifyPlan(image="img"))
    assert r.status == "skip" and "no NVIDIA GPU visible on the host" in r.detail


def no_docker_access() -> ScriptedConnection:
    """A login that may not use the Docker socket: the engine's stream fails, and plain docker says why."""
    def host(line: str):
        if "docker version" in line:
            return (1, "", "permission denied while trying to connect to the Docker daemon socket\n")
        return (0, probe_output(SMI_L), "")
    return ScriptedConnection("gpu-01", host, user="admin")


def test_docker_not_usable():
    facts = docker_facts(no_docker_access(), VerifyPlan(image="img"))
    assert len(facts.host_uuids) == 2  # the host's own GPUs are still known
    [r] = toolkit_records(facts, VerifyPlan(image="img"))
    assert r.id == "toolkit.docker" and r.status == "fail"
    assert r.detail == "Docker is not usable on the host: admin may not use the Docker socket" and "gpurig provision" in r.fix
    [skipped] = container_records(None, VerifyPlan(image="img", torch_probe="x"), facts, [r])
    assert skipped.status == "skip" and "needs toolkit.docker" in skipped.detail


def test_uuids_same_subset_and_foreign():
    host = list(host_facts().host_uuids)
    assert len(host) == 2
    seen = lambda uuids: [Record("container", "cuda.devices", "pass", uuids)]  # noqa: E731
    assert uuid_record(host, seen(host[:1])).status == "pass"
    bad = uuid_record(host, seen(["GPU-00000000-0000-0000-0000-000000000000"]))
    assert bad.status == "fail" and "does not list" in bad.detail
    assert uuid_record(host, [Record("container", "cuda.devices", "skip")]).status == "skip"


def test_container_probe_errors_in_dockers_words():
    said = 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].\n'
    gpu = probe_failed(Result("h", "x", 125, "", said), VerifyPlan(image="i"))
    assert "gpurig provision" in gpu.fix
    nopy = probe_failed(Result("h", "x", 127, "", 'OCI runtime exec failed: exec: "python3": executable file not found in $PATH\n'), VerifyPlan(container="c"))
    assert "no python3 in container c" in nopy.detail


def test_probe_documents_parse_and_bad_status_is_a_failure():
    doc = {"probe": "container", "version": 1, "records": [{"id": "a", "status": "pass"}, {"id": "b", "status": "great"}]}
    records = parse_document(Result("h", "x", 1, "noise\n" + json.dumps(doc) + "\n", ""), "container")
    assert [r.status for r in records] == ["pass", "fail"]
    assert parse_document(Result("h", "x", 1, "Traceback...\n", ""), "container") is None


def test_flags_conflict_and_bad_level():
    with pytest.raises(ConfigError, match="both given"):
        make_plan("a", "b", "quick")
    with pytest.raises(ConfigError, match="--level 'fast' is not valid"):
        make_plan(None, "img", "fast")


# ---- presenting a fleet ----


def fleet() -> FleetReport:
    good = HostVerdict("gpu-01", (
        Record("host", "host.driver", "pass", "580.65.06"),
        Record("container", "matmul.bf16", "pass", 781.2, 989.0, "TFLOP/s", "79% of the 989 TFLOP/s peak"),
        Record("container", "shm.size", "warn", 512, ">= 1024", "MiB", "small", "shm_size: 16g"),
    ), "full", "image x", {"host": 0.2, "container": 40.0})
    bad = HostVerdict("gpu-02", (
        Record("container", "cuda.available", "fail", False, True, "", "container started without GPUs", "add --gpus all"),
        Record("container", "cuda.arch", "skip", detail="skipped: needs cuda.available"),
    ), "quick", "container c", {"container": 2.0})
    results = (
        HostResult("gpu-01", "ok", "", good, 40.2),
        HostResult("gpu-02", "failed", "cuda.available: container started without GPUs", bad, 2.0),
        HostResult("gpu-03", "unreachable", "connection refused", None, 0.1),
    )
    return FleetReport(results, "2026-11-30T05:00:00+00:00", 40.3, summary={"ok": 1, "failed": 1, "unreachable": 1})


def test_fleet_table_row_per_host_with_worst_failing_fix_and_figures():
    columns, rows = host_rows(fleet())
    assert [c.name for c in columns][:4] == ["host", "verdict", "failing", "fix"]
    one, two, three = rows
    assert one[1] == "warn" and one[2].startswith("shm.size") and "bf16 781.2 TFLOP/s (79%)" in one[4]
    assert two[1] == "fail" and two[2].startswith("cuda.available: container started without GPUs") and two[3] == "add --gpus all"
    assert three[1] == "unreachable" and three[3] == "connection refused"


def test_verbose_rows_show_every_record():
    _, rows = record_rows(fleet())
    assert [r[2] for r in rows] == ["host.driver", "matmul.bf16", "shm.size", "cuda.available", "cuda.arch", "-"]
    assert "fix: add --gpus all" in rows[3][5]


def test_junit_has_a_testcase_per_record_per_host():
    root = ET.fromstring(junit_xml(fleet()))
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == ("6", "1", "1", "1")
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["gpu-01", "gpu-02", "gpu-03"]
    for suite in suites:
        for attr in ("name", "tests", "failures", "errors", "skipped", "time", "timestamp", "hostname"):
            assert suite.get(attr) is not None, attr
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures")) == sum(1 for c in cases if c.find("failure") is not None)
        assert int(suite.get("skipped")) == sum(1 for c in cases if c.find("skipped") is not None)
        for case in cases:
            assert case.get("classname") and case.get("name") and float(case.get("time")) >= 0
            assert len([e for e in case if e.tag in ("failure", "error", "skipped")]) <= 1
    failure = suites[1].find("testcase[@name='cuda.available']/failure")
    assert failure.get("message") == "container started without GPUs" and "fix: add --gpus all" in failure.text
    assert suites[1].find("testcase").get("classname") == "gpu-02.container"
    assert suites[2].find("testcase/error").get("message") == "connection refused"


def test_junit_survives_control_characters_in_docker_output():
    v = HostVerdict("h", (Record("container", "container.probe", "fail", detail="bad \x1b[31mred\x1b[0m \x00 text"),))
    report = FleetReport((HostResult("h", "failed", "x", v, 1.0),), "t", 1.0)
    ET.fromstring(junit_xml(report))  # parses: no control character reached the XML


def test_an_indented_document_parses_too():
    doc = json.dumps({"probe": "host", "version": 1, "records": [{"id": "host.driver", "status": "fail", "unit": None, "fix": None}]}, indent=1)
    [r] = parse_document(Result("h", "x", 0, doc + "\n", ""), "host")
    assert (r.probe, r.id, r.status, r.unit, r.fix) == ("host", "host.driver", "fail", "", "")


PROC_VERSION = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Fri Mar 14 04:10:37 UTC 2025\n"
                "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


def test_toolkit_refusing_an_image_for_a_newer_cuda_names_both_versions():
    facts = host_facts(proc=PROC_VERSION, image_cuda="13.0")
    assert facts.driver == "570.133.20"
    stderr = ("docker: Error response from daemon: failed to create task for container: failed to create shim task: "
              "OCI runtime create failed: runc create failed: unable to start container process: error during container init: "
              "error running hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n"
              "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0, please update your driver to a newer version, "
              "or use an earlier cuda container: unknown.\n")
    r = probe_failed(Result("h", "x", 125, "", stderr), VerifyPlan(image="pytorch:slim-cu130"), facts)
    assert r.detail.startswith("host driver 570.133.20 too old for the image's CUDA 13.0 (needs >= 580.65.06)")
    assert r.fix.startswith("upgrade the host driver to >= 580.65.06")


def test_json_report_validates_against_its_schema():
    jsonschema = pytest.importorskip("jsonschema")
    from pathlib import Path

    from invoke import Config

    from gpurig.config import settings
    from gpurig.flows.fleettask import HostOptions, fleet_document
    from gpurig.results import jsonable

    schema = json.loads((Path(__file__).resolve().parents[3] / "checks" / "verify-report.schema.json").read_text())
    opts = HostOptions(settings=settings(Config()), limit=())
    doc = json.loads(json.dumps(fleet_document(opts, fleet(), "gpurig.verify/1", level="full", target="image x", passed=False), default=jsonable))
    jsonschema.validate(doc, schema)
    doc["hosts"][0]["data"]["records"][0]["status"] = "ok"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


def test_a_container_must_see_exactly_the_gpus_it_was_assigned():
    from gpurig.verify.runner import assigned_gpus

    host = list(host_facts().host_uuids)
    one = inspect(gpus=True)
    one["HostConfig"]["DeviceRequests"][0].update(Count=0, DeviceIDs=["1"])
    assert assigned_gpus(host, container_info(one)) == [host[1]]
    assert assigned_gpus(host, container_info(inspect(gpus=True))) is None  # --gpus all
    first = inspect(gpus=True)
    first["HostConfig"]["DeviceRequests"][0].update(Count=1)
    assert assigned_gpus(host, container_info(first)) == [host[0]]  # --gpus 1: dockerd hands over GPU 0
    by_env = inspect(runtime="nvidia")
    by_env["Config"]["Env"] = [f"NVIDIA_VISIBLE_DEVICES={host[0]}", "PATH=/usr/bin"]
    assert assigned_gpus(host, container_info(by_env)) == [host[0]]
    seen = lambda uuids: [Record("container", "cuda.devices", "pass", uuids)]  # noqa: E731
    assert uuid_record(host, seen([host[1]]), [host[1]]).status == "pass"
    wrong = uuid_record(host, seen([host[0]]), [host[1]])
    assert wrong.status == "fail" and "other GPUs than it was assigned" in wrong.detail


def test_the_host_probe_is_facts_probes_script_and_its_sections_parse_back(tmp_path):
    # verify's host probe speaks facts/probes.py's one protocol: run by a real sh with nvidia-smi and the hook stubbed
    import subprocess

    from gpurig.facts.probes import split_sections

    (tmp_path / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s' '{SMI_L}'\necho 'a warning on stderr' >&2\n")
    (tmp_path / "nvidia-container-runtime-hook").write_text("#!/bin/sh\n")
    for stub in tmp_path.iterdir():
        stub.chmod(0o755)
    out = subprocess.run(["sh", "-c", HOST_SCRIPT], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, check=False).stdout
    assert set(split_sections(out)) == {"gpu_uuids", "nvidia_hook", "nvidia_version"}
    uuids, hook, _ = parse_host_gpus(out)
    assert uuids == ("GPU-2b6ecd7e-4f6b-1d5a-9f0c-0c1f5c1e3a11", "GPU-7a0f8e52-93d1-4c43-8b0e-55d1a2b3c4d5") and hook
    assert parse_host_gpus("") == ((), False, None)  # nothing came back: no GPUs, no hook, no driver


def test_mig_lines_of_nvidia_smi_do_not_shift_the_gpu_indexes():
    from gpurig.verify.runner import assigned_gpus

    listing = ("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa)\n"
               "  MIG 3g.40gb     Device  0: (UUID: MIG-bbbb)\n"
               "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-cccc)\n")
    uuids = list(parse_host_gpus(probe_output(listing))[0])
    assert uuids == ["GPU-aaaa", "GPU-cccc"]
    found = container_info({"Id": "c" * 64, "HostConfig": {"DeviceRequests": [{"Count": 0, "DeviceIDs": ["1"], "Capabilities": [["gpu"]]}]}})
    assert assigned_gpus(uuids, found) == ["GPU-cccc"]


# ---- the container probe through the host's engine ----


class Refusing(RecordedEngine):
    """An engine that refuses every exec and run with its own words (as dockerd does one it cannot start)."""

    def run(self, body: dict, name: str, timeout: float):
        raise EngineError("the Docker engine refused to start x", reason='could not select device driver "" with capabilities: [[gpu]]')

    exec = run  # type: ignore[assignment]


def found(container: bool = False) -> DockerFacts:
    return host_facts(container=inspect(gpus=True) if container else None, image_cuda=None if container else "13.0")


def test_a_deployed_container_is_probed_by_an_exec_and_an_image_by_a_throwaway_run():
    document = json.dumps({"records": [{"id": "torch.import", "status": "pass"}]})
    for plan, facts, verb in [(VerifyPlan(container="alice", torch_probe="print(1)"), found(container=True), "exec"),
                              (VerifyPlan(image="img", torch_probe="print(1)"), found(), "run")]:
        engine = RecordedEngine(ended=Exited(0, document, ""))
        [r] = container_records(None, plan, facts, [], engine_of=lambda conn, timeout, engine=engine: engine)
        assert (r.id, r.status) == ("torch.import", "pass")
        [(asked, what)] = engine.asked
        assert asked == verb and (what[:2] == ["python3", "-c"] if verb == "exec" else what["Entrypoint"] == ["python3"])


def test_an_overrunning_probe_fails_with_its_timeout():
    plan = VerifyPlan(image="img", torch_probe="print(1)", container_timeout_s=0.5)
    [r] = container_records(None, plan, found(), [], engine_of=lambda conn, timeout: RecordedEngine(ended=None))
    assert r.status == "fail" and r.detail == "the container probe did not finish within 0.5 s"


def test_a_run_the_engine_refuses_is_judged_in_its_words():
    plan = VerifyPlan(image="img", torch_probe="print(1)")
    [r] = container_records(None, plan, found(), [], engine_of=lambda conn, timeout: Refusing())
    assert r.status == "fail" and r.detail.startswith("Docker could not start the container with GPUs: could not select device driver")


def test_an_exec_stream_splits_into_stdout_and_stderr_and_reads_to_a_deadline():
    frames = b"".join(struct.pack(">BxxxL", kind, len(data)) + data for kind, data in [(1, b"{\"a\""), (2, b"warn\n"), (1, b": 1}")])
    assert demux(frames) == (b'{"a": 1}', b"warn\n")
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert read_to_end(ours, time.monotonic() + 0.2) is None  # nothing yet and still open: the deadline ends the wait
        theirs.sendall(frames)
        theirs.shutdown(socket.SHUT_WR)
        assert read_to_end(ours, time.monotonic() + 60) == frames  # to the end the engine closes
