"""The verify runner's decisions from recorded Docker output, its fleet table, and its JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from gpurig.cli.verify import host_rows, make_plan, record_rows
from gpurig.connect.connection import Result
from gpurig.connect.fleet import FleetReport, HostResult
from gpurig.errors import ConfigError
from gpurig.verify.junit import junit_xml
from gpurig.verify.records import HostVerdict, Record
from gpurig.verify.runner import (
    VerifyPlan,
    container_command,
    parse_docker_facts,
    parse_document,
    probe_failed,
    toolkit_records,
    uuid_record,
)

SMI_L = ("GPU 0: NVIDIA H200 (UUID: GPU-2b6ecd7e-4f6b-1d5a-9f0c-0c1f5c1e3a11)\n"
         "GPU 1: NVIDIA H200 (UUID: GPU-7a0f8e52-93d1-4c43-8b0e-55d1a2b3c4d5)\n")
RUNTIMES_NVIDIA = '{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}\n'
RUNTIMES_PLAIN = '{"io.containerd.runc.v2":{"path":"runc"},"runc":{"path":"runc"}}\n'


def inspect_json(runtime="runc", gpus=False, running=True, cuda="13.0") -> str:
    requests = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}] if gpus else None
    return json.dumps([{
        "State": {"Status": "running" if running else "exited", "Running": running, "ExitCode": 0 if running else 137},
        "HostConfig": {"Runtime": runtime, "DeviceRequests": requests, "ShmSize": 67108864},
        "Config": {"Labels": {"io.gpurig.cuda": cuda, "io.gpurig.min-driver": "580.65.06"}},
    }])


def test_nvidia_runtime_missing_on_a_gpu_host():
    facts = parse_docker_facts(SMI_L, RUNTIMES_PLAIN, "", inspect_json())
    [r] = toolkit_records(facts, VerifyPlan(image="img"))
    assert r.status == "fail" and "nvidia runtime is missing" in r.detail and "gpurig provision" in r.fix
    assert "--gpus" not in container_command(VerifyPlan(image="img", torch_probe="pass"), facts)


def test_deployed_container_without_gpus():
    facts = parse_docker_facts(SMI_L, RUNTIMES_NVIDIA, "/usr/bin/nvidia-container-runtime-hook\n", inspect_json())
    [r] = toolkit_records(facts, VerifyPlan(container="alice"))
    assert r.status == "fail" and "started without GPUs" in r.detail and "gpurig_containers" in r.fix


def test_deployed_container_with_gpus_and_its_label_passed_on():
    facts = parse_docker_facts(SMI_L, RUNTIMES_NVIDIA, "", inspect_json(gpus=True))
    [r] = toolkit_records(facts, VerifyPlan(container="alice"))
    assert r.status == "pass" and "--gpus" in r.detail
    argv = container_command(VerifyPlan(container="alice", torch_probe="print(1)"), facts)
    assert argv[:3] == ["docker", "exec", "alice"] and argv[-2:] == ["--expect-cuda", "13.0"]


def test_image_run_asks_for_gpus_only_where_the_host_can():
    plan = VerifyPlan(image="pytorch:slim-cu130", torch_probe="print(1)", level="full")
    with_gpus = container_command(plan, parse_docker_facts(SMI_L, RUNTIMES_NVIDIA, "", inspect_json()))
    assert with_gpus[:2] == ["docker", "run"] and "--gpus" in with_gpus and "--rm" in with_gpus
    assert with_gpus[with_gpus.index("--shm-size") + 1] == "16g" and with_gpus[with_gpus.index("--pull") + 1] == "never"
    cpu_host = container_command(plan, parse_docker_facts("", RUNTIMES_PLAIN, "", inspect_json(cuda="cpu")))
    assert "--gpus" not in cpu_host and cpu_host[-4:] == ["--level", "full", "--expect-cuda", "cpu"]


def test_cpu_host_skips_the_toolkit_with_its_reason():
    facts = parse_docker_facts("", RUNTIMES_PLAIN, "", inspect_json())
    [r] = toolkit_records(facts, VerifyPlan(image="img"))
    assert r.status == "skip" and "no NVIDIA GPU visible on the host" in r.detail


def test_docker_not_usable():
    facts = parse_docker_facts("", "permission denied while trying to connect to the Docker daemon socket\n", "", "")
    [r] = toolkit_records(facts, VerifyPlan(image="img"))
    assert r.id == "toolkit.docker" and r.status == "fail" and "permission denied" in r.detail


def test_uuids_same_subset_and_foreign():
    host = parse_docker_facts(SMI_L, "{}", "", "[]")["host_uuids"]
    assert len(host) == 2
    seen = lambda uuids: [Record("container", "cuda.devices", "pass", uuids)]  # noqa: E731
    assert uuid_record(host, seen(host[:1])).status == "pass"
    bad = uuid_record(host, seen(["GPU-00000000-0000-0000-0000-000000000000"]))
    assert bad.status == "fail" and "does not list" in bad.detail
    assert uuid_record(host, [Record("container", "cuda.devices", "skip")]).status == "skip"


def test_container_probe_errors_in_dockers_words():
    gpu = probe_failed(Result("h", "x", 125, "", 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].\n'), VerifyPlan(image="i"))
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
    facts = parse_docker_facts(SMI_L, RUNTIMES_NVIDIA, "", inspect_json(cuda="13.0"), PROC_VERSION)
    assert facts["driver"] == "570.133.20"
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

    from gpurig.cli.options import HostOptions, fleet_document
    from gpurig.config import settings
    from gpurig.connect.fleet import jsonable

    schema = json.loads((Path(__file__).resolve().parents[3] / "checks" / "verify-report.schema.json").read_text())
    opts = HostOptions(settings=settings(Config()), limit=())
    doc = json.loads(json.dumps(fleet_document(opts, fleet(), "gpurig.verify/1", level="full", target="image x", passed=False), default=jsonable))
    jsonschema.validate(doc, schema)
    doc["hosts"][0]["data"]["records"][0]["status"] = "ok"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


def test_a_container_must_see_exactly_the_gpus_it_was_assigned():
    from gpurig.verify.runner import assigned_gpus

    host = parse_docker_facts(SMI_L, "{}", "", "[]")["host_uuids"]
    one = json.loads(inspect_json(gpus=True))[0]
    one["HostConfig"]["DeviceRequests"][0].update(Count=0, DeviceIDs=["1"])
    assert assigned_gpus(host, one) == [host[1]]
    assert assigned_gpus(host, json.loads(inspect_json(gpus=True))[0]) is None  # --gpus all
    by_env = json.loads(inspect_json(runtime="nvidia"))[0]
    by_env["Config"]["Env"] = [f"NVIDIA_VISIBLE_DEVICES={host[0]}", "PATH=/usr/bin"]
    assert assigned_gpus(host, by_env) == [host[0]]
    seen = lambda uuids: [Record("container", "cuda.devices", "pass", uuids)]  # noqa: E731
    assert uuid_record(host, seen([host[1]]), [host[1]]).status == "pass"
    wrong = uuid_record(host, seen([host[0]]), [host[1]])
    assert wrong.status == "fail" and "other GPUs than it was assigned" in wrong.detail


def test_mig_lines_of_nvidia_smi_do_not_shift_the_gpu_indexes():
    from gpurig.verify.runner import _UUID, assigned_gpus

    listing = ("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa)\n"
               "  MIG 3g.40gb     Device  0: (UUID: MIG-bbbb)\n"
               "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-cccc)\n")
    uuids = _UUID.findall(listing)
    assert uuids == ["GPU-aaaa", "GPU-cccc"]
    inspect = {"HostConfig": {"DeviceRequests": [{"Count": 0, "DeviceIDs": ["1"], "Capabilities": [["gpu"]]}]}}
    assert assigned_gpus(uuids, inspect) == ["GPU-cccc"]
