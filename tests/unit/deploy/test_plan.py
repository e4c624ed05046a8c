"""deploy's plan for one container from data cases: tests/operations/deploy/<case>.json.

Each case gives the container as written in gpurig_containers (``container``),
what the host's engine has (``host``: the container it runs, made from
another gpurig_containers entry or absent (null), its GPUs, image id and
state), the GPUs the container is to get (``devices``), and what the plan
must be: its status, the action (the change's name, ``none`` for ok), the
settings that differ as [key, old, new] (``diff`` exactly, or
``diff_includes``), the --diff lines, and values that must never appear in
a report (``never_shown``). Provision's cases sit beside them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import RecordedEngine

from gpurig.connect.engineinfo import ContainerInfo, ImageInfo
from gpurig.deploy.apply import ContainerRun, Target, container_doc
from gpurig.deploy.compare import plan
from gpurig.deploy.containers import load_containers
from gpurig.image.spec import load_spec
from gpurig.inventory import Host

TESTS = Path(__file__).resolve().parents[2]
SPEC = load_spec(TESTS.parent / "images" / "pytorch.yaml")
IMAGE = ImageInfo("sha256:" + "1" * 64, ("pytorch:2.14.1-cu130-jupyter",), {}, 10)
CASES = sorted((TESTS / "operations" / "deploy").glob("*.json"))


def spec(entry):
    specs, _ = load_containers(Host("gpu-01", ("gpu",), {"gpurig_containers": [entry]}), SPEC)
    return specs[0]


def engine(container=None) -> RecordedEngine:
    """What plan() asks of an engine: the container by its name, the image by its ref (recorded values)."""
    return RecordedEngine([container] if container else [], {IMAGE.tags[0]: IMAGE, IMAGE.id: IMAGE})


def on_host(s, host: dict) -> ContainerInfo:
    devices = tuple(host.get("devices") or ()) or None
    body = s.create_body(s.image, devices)
    return ContainerInfo("c" * 64, s.name, s.image, host.get("image_id", IMAGE.id), host.get("status", "running"),
                         None, 0, None, body["Labels"], (), devices, "runc")


@pytest.mark.parametrize("case_file", CASES, ids=[p.stem for p in CASES])
def test_container_plan(case_file: Path):
    case = json.loads(case_file.read_text())
    wanted = spec(case["container"])
    host = case["host"]
    current = None if host.get("container", "same") is None else on_host(spec(host["container"]) if "container" in host else wanted, host)
    target = Target(wanted, wanted.image, IMAGE)
    p = plan(engine(current), target, tuple(case["devices"]))
    assert p.status == case["status"]
    assert [c.summary for c in p.changes] == ([] if case["action"] == "none" else [case["action"]])
    settings = [list(d) for c in p.changes for d in c.settings]
    if "diff" in case:
        assert settings == case["diff"]
    for d in case.get("diff_includes", []):
        assert d in settings
    if "diff_text" in case:
        assert p.changes[0].diff.splitlines() == case["diff_text"]
    run = ContainerRun(engine(current), target, tuple(case["devices"]), None, {})
    shown = json.dumps(container_doc(run.result(p))) + "".join(c.diff for c in p.changes)
    for secret in case.get("never_shown", []):
        assert secret not in shown


def test_a_change_runs_through_engine_calls_not_a_special_apply():
    wanted = spec({"variant": "jupyter", "gpus": 1})
    run = ContainerRun(engine(), Target(wanted, wanted.image, IMAGE), ("1",), None, {})
    p = plan(engine(), run.target, ("1",), run.commands)
    assert [str(c) for c in p.changes[0].commands] == [f"move {wanted.image} to the host", f"create {wanted.name}"]
