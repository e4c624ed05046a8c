"""A rollout's batches, its stop rule, its state file (what a re-run skips and rolls back to), its rows, and one host's course.

One host's course (``roll_host``) runs against a fake engine and deploy:
deploy and verify are their own modules' tests; here it is the order and
what the state file says after each outcome.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gpurig.connect.engineinfo import ImageInfo
from gpurig.deploy import rollhost
from gpurig.deploy.apply import DeployJob, Target
from gpurig.deploy.containers import ContainerSpec
from gpurig.deploy.rollplan import (
    DONE,
    MOVED,
    NOT_MOVED,
    NOT_REACHED,
    ROLLED_BACK,
    SKIPPED,
    STARTED,
    RolloutState,
    batch_size,
    host_row,
    on_target,
    plan_batches,
    should_stop,
    state_path,
    verified_hosts,
)
from gpurig.errors import ConfigError
from gpurig.status import Status
from gpurig.steps.plan import StepResult
from tests.unit.test_cli import assert_one_line_error, gpurig

HOSTS = [f"gpu{i:02d}" for i in range(1, 11)]
OLD, NEW = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def test_a_canary_alone_then_batches_of_a_share_of_all_hosts():
    batches = plan_batches(HOSTS, 1, "20%")
    assert batches[0] == ["gpu01"]
    assert [len(b) for b in batches[1:]] == [2, 2, 2, 2, 1]  # 20% of 10 hosts, the canary's host not counted again
    assert [h for b in batches for h in b] == HOSTS  # every host once, in inventory order


def test_batches_of_a_count_and_no_canary():
    assert plan_batches(HOSTS[:5], 0, "2") == [["gpu01", "gpu02"], ["gpu03", "gpu04"], ["gpu05"]]
    assert plan_batches(HOSTS[:2], 3, "5") == [["gpu01", "gpu02"]]  # a canary larger than the fleet is the whole fleet
    assert plan_batches([], 1, "20%") == []


def test_a_percentage_rounds_up_and_is_never_zero():
    assert batch_size("1%", 10) == 1 and batch_size("25%", 10) == 3 and batch_size("100%", 7) == 7


@pytest.mark.parametrize("bad", ["0%", "0", "abc", "101%", "-1", "20 %", "%", ""])
def test_a_bad_batch_is_one_line_naming_it_and_the_fix(bad):
    with pytest.raises(ConfigError) as err:
        plan_batches(HOSTS, 1, bad)
    assert repr(bad) in err.value.problem and "--batch 20%" in err.value.fix


def test_a_negative_canary_is_refused():
    with pytest.raises(ConfigError, match="--canary -1"):
        plan_batches(HOSTS, -1, "1")


def test_max_fail_lets_that_many_hosts_fail():
    assert not should_stop(0, 0) and should_stop(1, 0)  # default: stop at the first failure
    assert not should_stop(2, 2) and should_stop(3, 2)


def test_the_state_file_is_named_after_the_selection_and_variant_and_safe_for_any_pattern(tmp_path):
    assert state_path(tmp_path, ["gpu"], "slim") == tmp_path / ".gpurig/rollouts/gpu-slim.json"
    assert state_path(tmp_path, [], "jupyter").name == "all-jupyter.json"
    odd = state_path(tmp_path, ["gpu:!a100-*", "../x"], "slim")
    assert odd.parent == tmp_path / ".gpurig/rollouts" and odd.name.startswith("gpu_a100-") and odd.name.endswith("_x-slim.json")


def test_a_rerun_skips_hosts_done_on_the_same_image_id_and_remembers_what_a_mid_change_host_ran(tmp_path):
    path = state_path(tmp_path, ["gpu"], "slim")
    state = RolloutState.load(path, image_id=NEW)
    state.record("gpu01", state=DONE, image_ref="p:new", image_id=NEW, verify="passed")
    state.record("gpu02", state=STARTED, image_ref="p:new", image_id=NEW, previous={"train": {"image_id": OLD, "image_ref": "p:old"}})
    state.record("gpu03", state=DONE, image_ref="p:older", image_id=OLD, verify="passed")
    again = RolloutState.load(path, image_id=NEW)  # a re-run reads what the interrupted one wrote
    assert again.done_on("gpu01", NEW) and not again.done_on("gpu03", NEW) and not again.done_on("gpu02", NEW)
    assert again.previous("gpu02") == {"train": {"image_id": OLD, "image_ref": "p:old"}}
    assert again.previous("gpu01") is None  # done: nothing to roll back to from the state
    assert json.loads(path.read_text())["hosts"]["gpu01"]["time"]
    assert not list(path.parent.glob(".*gpurig-tmp"))  # written by rename, no temp file left
    assert on_target([again.entry("gpu01")], NEW) and not on_target([again.entry("gpu01"), again.entry("gpu03")], NEW)


def test_an_unreadable_state_file_says_how_to_start_afresh(tmp_path):
    path = state_path(tmp_path, ["gpu"], "slim")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read") as err:
        RolloutState.load(path)
    assert "remove it" in err.value.fix


def test_verified_hosts_are_those_done_with_verify_passed_on_that_image_id(tmp_path):
    one = RolloutState.load(state_path(tmp_path, ["gpu"], "slim"))
    one.record("gpu01", state=DONE, image_ref="p:new", image_id=NEW, verify="passed")
    one.record("gpu02", state=ROLLED_BACK, image_ref="p:old", image_id=OLD, verify="failed", tried="p:new")
    other = RolloutState.load(state_path(tmp_path, ["cpu"], "slim"))
    other.record("cpu01", state=DONE, image_ref="p:new", image_id=NEW, verify="passed")
    assert sorted(e["host"] for e in verified_hosts(tmp_path, NEW)) == ["cpu01", "gpu01"]
    assert verified_hosts(tmp_path, OLD) == [] and verified_hosts(tmp_path / "nowhere", NEW) == []


def test_rows_say_what_each_host_runs_and_why():
    done = {"state": DONE, "image_ref": "p:new"}
    back = {"state": ROLLED_BACK, "image_ref": "p:old"}
    assert host_row("a", "canary", done, MOVED) == ["a", "canary", "p:new", "new image, verify passed"]
    assert host_row("b", "1", back, NOT_MOVED, "rolled back: host.driver: 535 < 580") == ["b", "1", "p:old", "rolled back: host.driver: 535 < 580"]
    assert host_row("c", "2", None, NOT_REACHED) == ["c", "2", "unchanged", "not reached: rollout stopped"]
    assert host_row("d", "-", done, SKIPPED)[3] == "new image, verify passed earlier (skipped)"
    unreachable = host_row("e", "1", {"state": STARTED}, NOT_MOVED, "connection refused")
    assert unreachable[2:] == ["unchanged", "failed: connection refused; a re-run rolls it back or moves it on"]


# --- one host's course, against a fake engine and deploy ------------------------------------------------------------------------


class FakeEngine:
    def __init__(self, running: str | None) -> None:
        self.running = running
        self.images = {OLD, NEW}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def container(self, name):
        return SimpleNamespace(image_id=self.running, labels={"io.gpurig.image": "p:old"}, image=self.running) if self.running else None

    def image(self, ref):
        return ImageInfo(ref, (), {}, 1) if ref in self.images else None

    def remove(self, name):
        self.running = None

    def containers(self):
        return [self.container("train")] if self.running else []

    def untag(self, ref):
        self.images.discard(ref)


@pytest.fixture
def course(tmp_path, monkeypatch):
    """run(verify_passes, running=OLD) -> (Outcome, engine, deploys, state): roll_host on gpu01 with a fake engine and deploy."""
    engine = FakeEngine(OLD)
    deploys: list[str] = []

    def deploy(conn, job):
        [t] = job.targets[conn.name]
        deploys.append(t.image_ref)
        engine.running = NEW if t.image_ref == "p:new" else t.image_ref
        return [StepResult(t.spec.name, Status.CHANGED)]

    monkeypatch.setattr(rollhost, "open_engine", lambda conn: engine)
    monkeypatch.setattr(rollhost, "deploy_host", deploy)
    spec = ContainerSpec(host="gpu01", name="train", variant="slim", image="p:new", entry=None)
    job = DeployJob(targets={"gpu01": [Target(spec, "p:new", ImageInfo(NEW, ("p:new",), {}, 1))]}, assign_gpus=lambda *a, **k: {},
                    deliver=lambda *a: None)

    def run(passes: bool, running: str = OLD):
        engine.running = running
        state = RolloutState.load(state_path(tmp_path, ["gpu"], "slim"))  # as a run reads it when it starts
        verify = lambda conn, name: (passes, "host.driver: 535 < 580 needed", "upgrade the driver")  # noqa: E731
        out = rollhost.roll_host(SimpleNamespace(name="gpu01"), rollhost.RolloutJob(job, verify, state, "p:new", NEW))
        return out, engine, deploys, state

    return run


def test_a_host_that_passes_verify_is_done_on_the_new_image_id(course):
    out, engine, deploys, state = course(True)
    assert out.changed and engine.running == NEW and deploys == ["p:new"]
    entry = state.entry("gpu01")
    assert (entry["state"], entry["image_id"], entry["verify"], entry["previous"]["train"]["image_id"]) == (DONE, NEW, "passed", OLD)


def test_a_host_that_fails_verify_is_put_back_on_its_old_image_id(course):
    out, engine, deploys, state = course(False)
    assert out.status == Status.FAILED and out.detail == "rolled back: host.driver: 535 < 580 needed" and out.fix == "upgrade the driver"
    assert deploys == ["p:new", OLD] and engine.running == OLD  # back by its id: the old image never left the host
    entry = state.entry("gpu01")
    assert (entry["state"], entry["image_id"], entry["verify"], entry["tried"]) == (ROLLED_BACK, OLD, "failed", "p:new")


def test_a_host_caught_mid_change_rolls_back_to_what_it_ran_before_the_interrupted_run(course, tmp_path):
    state = RolloutState.load(state_path(tmp_path, ["gpu"], "slim"))
    state.record("gpu01", state=STARTED, image_ref="p:new", image_id=NEW, previous={"train": {"image_id": OLD, "image_ref": "p:old"}})
    out, engine, deploys, state = course(False, running=NEW)  # the interrupted run left the container on the new, unverified image
    assert deploys[-1] == OLD and engine.running == OLD  # not to the unverified image it ran when this run began


def test_a_container_new_to_the_host_is_removed_when_verify_fails(course):
    out, engine, deploys, state = course(False, running=None)  # the host ran no "train" before the rollout
    assert out.status == Status.FAILED and out.detail == "rolled back: host.driver: 535 < 580 needed"
    assert deploys == ["p:new"] and engine.running is None  # nothing to go back to: the unverified container is gone, not left running
    entry = state.entry("gpu01")
    assert (entry["state"], entry["image_id"], entry["previous"]["train"]["image_id"]) == (ROLLED_BACK, "", None)


def test_prune_removes_old_images_no_container_uses(monkeypatch):
    engine = FakeEngine(NEW)
    monkeypatch.setattr(rollhost, "open_engine", lambda conn: engine)
    out = rollhost.prune_host(SimpleNamespace(name="gpu01"), NEW, [OLD, NEW, OLD])
    assert out.changed and out.data == (OLD,) and engine.images == {NEW}
    engine.images.add(OLD)
    engine.running = OLD  # a container still runs the old image: it stays
    assert not rollhost.prune_host(SimpleNamespace(name="gpu01"), NEW, [OLD]).changed and OLD in engine.images


# --- the task, as a user meets bad input: one line, before any host, nothing written ------------------------------------------------

FLEET = "all:\n  children:\n    gpu:\n      hosts:\n        gpu01: {ansible_host: 127.0.0.1}\n        gpu02: {ansible_host: 127.0.0.1}\n"


@pytest.mark.parametrize(("flags", "said"), [
    (["-l", "gpu", "--to", "2.99.0-cu999-slim", "--batch", "0%"], "--batch '0%' is not a host count"),
    (["-l", "gpu", "--to", "2.99.0-cu999-slim", "--batch", "abc"], "--batch 'abc' is not a host count"),
    (["-l", "nosuchgroup", "--to", "2.99.0-cu999-slim"], "nosuchgroup"),
    (["-l", "gpu", "--to", "2.99.0-cu999-slim"], "2.99.0-cu999-slim is not built on this machine"),
    (["-l", "gpu", "--to", "UPPER CASE"], "--to"),
])
def test_bad_input_is_one_line_naming_it_and_nothing_is_written(project, flags, said):
    (project / "inventory").mkdir(exist_ok=True)
    (project / "inventory" / "hosts.yaml").write_text(FLEET)
    proc = gpurig(project, "rollout", "--variant", "slim", *flags)
    assert_one_line_error(proc, said)
    assert not (project / ".gpurig").exists()


def test_a_variant_that_is_a_path_is_blamed_on_the_flag_not_the_inventory(project):
    (project / "inventory").mkdir(exist_ok=True)
    (project / "inventory" / "hosts.yaml").write_text(FLEET)
    proc = gpurig(project, "rollout", "--variant", "../../x", "-l", "gpu", "--to", "2.99.0-cu999-slim")
    assert_one_line_error(proc, "--variant '../../x': no such variant")
    assert "hosts.yaml" not in proc.stderr and not (project / ".gpurig").exists()
