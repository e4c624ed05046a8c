"""deploy's plan for one container: ok, start, create or recreate, from what the host's engine reports."""

from __future__ import annotations

from pathlib import Path

from gpurig.connect.engineinfo import ContainerInfo, ImageInfo
from gpurig.deploy.apply import Target, plan
from gpurig.deploy.containers import load_containers
from gpurig.image.spec import load_spec
from gpurig.inventory import Host

SPEC = load_spec(Path(__file__).resolve().parents[3] / "images" / "pytorch.yaml")
IMAGE = ImageInfo("sha256:" + "1" * 64, ("pytorch:2.14.1-cu130-jupyter",), {}, 10)


def spec(**entry):
    specs, _ = load_containers(Host("gpu-01", ("gpu",), {"gpurig_containers": [{"variant": "jupyter", **entry}]}), SPEC)
    return specs[0]


class Engine:
    """What plan() asks of an engine: one container by name, one image by ref (recorded values)."""

    def __init__(self, container=None):
        self._container = container

    def container(self, name):
        return self._container

    def image(self, ref):
        return IMAGE


def running(s, devices, image_id=IMAGE.id, status="running") -> ContainerInfo:
    body = s.create_body(s.image, devices)
    return ContainerInfo("c" * 64, s.name, s.image, image_id, status, None, 0, None, body["Labels"], (), devices and tuple(devices), "runc")


def test_same_image_settings_and_gpus_is_ok():
    s = spec(gpus=1)
    out = plan(Engine(running(s, ("1",))), Target(s, s.image, IMAGE), ("1",))
    assert (out.status, out.action, out.diff) == ("ok", "none", [])


def test_a_count_resolved_to_other_gpus_recreates_though_the_settings_are_equal():
    s = spec(gpus=1)
    out = plan(Engine(running(s, ("1",))), Target(s, s.image, IMAGE), ("0",))
    assert (out.status, out.action) == ("changed", "recreate")
    assert out.diff == [("gpu devices", "1", "0")]


def test_changed_setting_and_image_are_both_in_the_diff():
    old, new = spec(gpus=1, shm_size="8g"), spec(gpus=1, shm_size="16g")
    out = plan(Engine(running(old, ("1",), image_id="sha256:" + "2" * 64)), Target(new, new.image, IMAGE), ("1",))
    assert out.action == "recreate"
    assert ("shm_size", 8 << 30, 16 << 30) in out.diff
    assert ("image id", "2" * 12, "1" * 12) in out.diff


def test_stopped_is_started_and_missing_is_created():
    s = spec(gpus=1)
    assert plan(Engine(running(s, ("1",), status="exited")), Target(s, s.image, IMAGE), ("1",)).action == "start"
    assert plan(Engine(None), Target(s, s.image, IMAGE), ("1",)).action == "create"


def test_env_changes_are_shown_by_name_never_by_value_or_digest():
    old, new = spec(gpus=1, env={"TOKEN": "hunter2", "KEEP": "x", "GONE": "y"}), spec(gpus=1, env={"TOKEN": "swordfish", "KEEP": "x", "NEW": "z"})
    out = plan(Engine(running(old, ("1",))), Target(new, new.image, IMAGE), ("1",))
    [env] = [d for d in out.diff if d[0] == "env"]
    assert env == ("env", "GONE, KEEP, TOKEN", "KEEP, NEW (new), TOKEN (changed), GONE (removed)")
    assert "sha256" not in repr(out.to_dict()) and "hunter2" not in repr(out.to_dict())
    created = plan(Engine(None), Target(new, new.image, IMAGE), ("1",))
    assert ("env", None, "KEEP (new), NEW (new), TOKEN (new)") in created.diff
