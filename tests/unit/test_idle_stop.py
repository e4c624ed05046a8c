"""``idle_stop``: read from gpurig_containers, labelled on the container, and weighed against the monitor's samples.

The samples are a recorded run (tests/fixtures/monitor/runs/slurm_jobs: three GPUs, 0 at 2%, 1 at 97%, 2 at 0%) replayed
through the monitor's own record reader, its clock stretched to one sample every 10 minutes so the 30 samples span 4h50m (a
session sampling every 600 s). The engine stands in for a host's Docker engine (the enforcer asks it what runs, to inspect
and to stop); everything it decides is gpurig's.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpurig.dashboard.history import read_history
from gpurig.deploy.containers import IDLE_STOP_LABEL, LABEL, load_containers
from gpurig.errors import InventoryError
from gpurig.image.spec import load_spec
from gpurig.inventory import Host
from gpurig.monitor import idlestop
from gpurig.monitor.idlestop import IDLE_STOP_LOG, IdleStop, QuietGpus, decide, idle_stop_hosts, read_idle_stops
from gpurig.monitor.samples import sample_from_record
from gpurig.strict.validate import duration_seconds, duration_text

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_spec(ROOT / "images" / "pytorch.yaml")
RUN = ROOT / "tests" / "fixtures" / "monitor" / "runs" / "slurm_jobs" / "samples.jsonl"
STRETCH = 600.0  # seconds between replayed samples
UUID2 = "GPU-8b0d2f4a-6c8e-4b0d-a2f4-6c8e0b2d4f6a"


def records() -> list[dict]:
    """The run's sample records, one every STRETCH seconds from its first."""
    found = [json.loads(line) for line in RUN.read_text().splitlines()]
    samples = [r for r in found if r.get("type") == "sample"]
    t0 = samples[0]["t"]
    return [{**r, "t": t0 + (r["t"] - t0) * STRETCH} for r in samples]


SPAN = records()[-1]["t"] - records()[0]["t"]  # 29 x 600 s = 4h50m


def replayed(recs=None, clock=lambda: 0.0) -> QuietGpus:
    quiet = QuietGpus(max_gap=5 * STRETCH, clock=clock)
    for r in recs if recs is not None else records():
        quiet("gpu-slurm-jobs", r, sample_from_record("gpu-slurm-jobs", r))
    return quiet


# --- the grammar and the label ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("4h", 14400), ("90m", 5400), ("1h30m", 5400), ("2d", 172800), ("45s", 45)])
def test_durations_as_people_write_them(text, seconds):
    assert duration_seconds(text) == seconds
    assert duration_seconds(duration_text(seconds)) == seconds


@pytest.mark.parametrize("text", ["4", 4, "4 h", "4H", "1.5h", "0h", "h", "four hours", "", "400d", True])
def test_anything_else_is_no_duration(text):
    assert duration_seconds(text) is None


def load(**container) -> list:
    host = Host("a100-01", ("gpu",), {"gpurig_containers": [{"variant": "jupyter", "ssh_keys": [], **container}]})
    return load_containers(host, SPEC, source="inventory/hosts.yaml")[0]


def test_idle_stop_is_labelled_on_the_container_and_only_then_changes_its_settings():
    plain, timed = load()[0], load(idle_stop="4h")[0]
    assert (plain.idle_stop, timed.idle_stop) == (None, 14400)
    assert IDLE_STOP_LABEL not in plain.create_body("img:1")["Labels"]
    assert timed.create_body("img:1")["Labels"][IDLE_STOP_LABEL] == "14400"
    assert "idle_stop" not in plain.settings() and timed.settings()["idle_stop"] == 14400  # a container without it keeps its hash


def test_a_bad_idle_stop_is_one_line_with_the_fix():
    with pytest.raises(InventoryError) as err:
        load(idle_stop="4 hours")
    said = str(err.value)
    assert "\n" not in said and "gpurig_containers[0].idle_stop" in said and "'4 hours' is not a duration" in said
    assert "idle_stop: 4h" in err.value.fix
    with pytest.raises(InventoryError, match="without GPUs"):
        load(idle_stop="4h", gpus="none")


def test_only_hosts_whose_containers_have_an_idle_stop_are_enforced_on():
    timed = Host("a", (), {"gpurig_containers": [{"variant": "jupyter", "idle_stop": "4h"}]})
    plain = Host("b", (), {"gpurig_containers": [{"variant": "jupyter"}]})
    assert idle_stop_hosts([timed, plain, Host("c", (), {})], "inventory/hosts.yaml") == [timed]


# --- the decision ----------------------------------------------------------------------------------------------------------------


def test_gpus_idle_for_just_under_idle_stop_are_left_running():
    verdict = decide(["0", "2"], SPAN + 1, replayed().of("gpu-slurm-jobs"), 0.0, 5 * STRETCH)
    assert verdict.state == "busy" and verdict.idle_s == SPAN and verdict.why == "idle 4h50m of 4h50m"


def test_gpus_idle_for_idle_stop_are_stopped_with_the_line_that_says_so():
    verdict = decide(["0", UUID2], SPAN, replayed().of("gpu-slurm-jobs"), 0.0, 5 * STRETCH)
    assert (verdict.state, verdict.gpus, verdict.idle_s) == ("stop", ("0", "2"), SPAN)
    assert verdict.why == "GPUs 0,2 idle 4h50m (idle_stop 4h50m)"
    assert decide(["0", "2"], 4 * 3600, replayed().of("gpu-slurm-jobs"), 0.0, 5 * STRETCH).why == "GPUs 0,2 idle 4h50m (idle_stop 4h)"


def test_one_busy_gpu_keeps_the_container():
    verdict = decide(["0", "1"], 60, replayed().of("gpu-slurm-jobs"), 0.0, 5 * STRETCH)
    assert verdict.state == "busy" and "GPU 1 not idle" in verdict.why
    assert decide(["all"], 60, replayed().of("gpu-slurm-jobs"), 0.0, 5 * STRETCH).state == "busy"


def test_a_busy_sample_starts_the_streak_again():
    recs = records()
    busy = json.loads(json.dumps(recs[10]))
    busy["gpus"][0]["util_gpu"] = 5  # the rule's edge: 5% is not under 5%
    verdict = decide(["0"], 60, replayed([*recs[:10], busy, *recs[11:]]).of("gpu-slurm-jobs"), 0.0, 5 * STRETCH)
    assert verdict.idle_s == recs[-1]["t"] - recs[11]["t"]


def test_unknown_samples_are_never_idle():
    recs = records()
    blind = [{**r, "gpus": [{**g, "util_gpu": None} if g["index"] == 2 else g for g in r["gpus"]]} for r in recs]
    assert decide(["2"], 60, replayed(blind).of("gpu-slurm-jobs"), 0.0, 5 * STRETCH).state == "busy"  # no utilisation reported
    assert decide(["0"], 60, None, 0.0, 5 * STRETCH).state == "unknown"  # no sample of the host at all
    stale = decide(["0"], 60, replayed().of("gpu-slurm-jobs"), 5 * STRETCH + 1, 5 * STRETCH)
    assert stale.state == "unknown" and "no sample of the host for" in stale.why  # the samples stopped coming
    missing = decide(["7"], 60, replayed().of("gpu-slurm-jobs"), 0.0, 5 * STRETCH)
    assert missing.state == "unknown" and "GPU 7 is not in the host's samples" in missing.why
    gap = [*recs[:10], *({**r, "t": r["t"] + 6 * STRETCH} for r in recs[10:])]  # an hour unseen: the streak starts after it
    assert decide(["0"], 60, replayed(gap).of("gpu-slurm-jobs"), 0.0, 5 * STRETCH).idle_s == gap[-1]["t"] - gap[10]["t"]


# --- the enforcer ----------------------------------------------------------------------------------------------------------------


class Engine:
    """A host's engine as the enforcer uses it: the containers it lists, inspect, stop (each call kept)."""

    def __init__(self, *containers) -> None:
        self.by_id = {c.id: c for c in containers}
        self.calls: list[tuple] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def containers(self, label=None):
        self.calls.append(("list", label))
        return [c for c in self.by_id.values() if label in c.labels]

    def container(self, ref):
        self.calls.append(("inspect", ref))
        return self.by_id.get(ref)

    def stop(self, ref, timeout=10):
        self.calls.append(("stop", ref))
        self.by_id[ref] = SimpleNamespace(**{**vars(self.by_id[ref]), "running": False})


def container(cid, name, devices, idle_stop=None):
    labels = {f"{LABEL}.name": name, f"{LABEL}.user": "alice", **({IDLE_STOP_LABEL: str(idle_stop)} if idle_stop else {})}
    return SimpleNamespace(id=cid, name=name, image="pytorch:2.13.0-cu130-jupyter", running=True, labels=labels, device_ids=devices)


def enforce(monkeypatch, tmp_path, engine):
    monkeypatch.setattr("gpurig.connect.engineopen.open_engine", lambda conn: engine)
    connector = SimpleNamespace(open=lambda host: host, close=lambda: None)
    said: list[str] = []
    stopper = IdleStop([Host("gpu-slurm-jobs", (), {})], lambda: connector, said.append, tmp_path, STRETCH, list_every=0,
                       clock=lambda: 0.0)
    for r in records():
        stopper.quiet("gpu-slurm-jobs", r, sample_from_record("gpu-slurm-jobs", r))
    return stopper, said


def test_the_session_says_it_then_stops_the_idle_container_and_keeps_it_in_the_history(monkeypatch, tmp_path):
    engine = Engine(container("c1", "jupyter", ("0", "2"), idle_stop=4 * 3600), container("c2", "busy", ("1",), idle_stop=60),
                    container("c3", "no-policy", ("0",)))
    stopper, said = enforce(monkeypatch, tmp_path, engine)
    done = stopper.check()
    assert said == ["gpu-slurm-jobs jupyter: GPUs 0,2 idle 4h50m (idle_stop 4h): stopping", "gpu-slurm-jobs jupyter: stopped"]
    assert ("stop", "c1") in engine.calls and ("stop", "c2") not in engine.calls and ("stop", "c3") not in engine.calls
    assert engine.calls.index(("inspect", "c1")) < engine.calls.index(("stop", "c1"))  # looked at as it is now, first
    assert [(e["container"], e["stopped"], e["gpus"], e["idle_stop_s"]) for e in done] == [("jupyter", True, ["0", "2"], 14400)]
    kept, unread, files = read_idle_stops(tmp_path)
    assert (len(kept), unread, files) == (1, [], 1) and kept[0]["user"] == "alice"
    history = read_history(tmp_path)
    entry = next(e for e in history.entries if e["kind"] == "idle-stop")
    assert (entry["host"], entry["container"], entry["stopped"], entry["idle_s"]) == ("gpu-slurm-jobs", "jupyter", True, SPAN)
    assert history.idle_stop_files == 1 and (tmp_path / IDLE_STOP_LOG).is_file()
    assert stopper.check() == [] and said[2:] == []  # stopped: not stopped again


def test_a_container_without_idle_stop_is_never_stopped_and_its_engine_is_not_asked_when_nothing_is_idle(monkeypatch, tmp_path):
    engine = Engine(container("c3", "no-policy", ("0", "2")))
    stopper, said = enforce(monkeypatch, tmp_path, engine)
    assert stopper.check() == [] and said == [] and not [c for c in engine.calls if c[0] == "stop"]
    quiet_engine = Engine(container("c1", "jupyter", ("1",), idle_stop=60))
    busy, _ = enforce(monkeypatch, tmp_path, quiet_engine)
    busy.quiet._hosts["gpu-slurm-jobs"].gpus = {k: g for k, g in busy.quiet._hosts["gpu-slurm-jobs"].gpus.items() if g.since is None}
    assert busy.check() == [] and quiet_engine.calls == []  # no GPU idle: no engine asked


def test_a_stop_the_engine_refuses_is_said_kept_and_not_retried_every_check(monkeypatch, tmp_path):
    from gpurig.connect.engine import EngineError

    engine = Engine(container("c1", "jupyter", ("0",), idle_stop=60))

    def refuse(ref, timeout=10):
        engine.calls.append(("stop", ref))
        raise EngineError("stop c1: permission denied", host="gpu-slurm-jobs")

    engine.stop = refuse
    stopper, said = enforce(monkeypatch, tmp_path, engine)
    stopper.list_every = 3600
    done = stopper.check()
    assert said[-1] == "gpu-slurm-jobs jupyter: could not be stopped: stop c1: permission denied"
    assert done[0]["stopped"] is False and "permission denied" in done[0]["reason"]
    assert stopper.check() == [] and engine.calls.count(("stop", "c1")) == 1


def test_the_monitor_run_hands_every_sample_to_the_enforcer_and_ends_it_with_the_run(monkeypatch):
    from gpurig.monitor import agent
    from gpurig.monitor.session import Run
    from gpurig.results import FleetReport

    started = threading.Event()
    seen = []
    stopper = SimpleNamespace(quiet=lambda host, record, sample: seen.append(host), start=lambda ended: started.set() or seen.append(ended),
                              join=lambda: seen.append("joined"))

    def fleet(hosts, work, **kw):
        return FleetReport(results=(), started="", duration_s=0.0)

    monkeypatch.setattr(agent, "run_fleet", fleet)
    run = Run()
    agent.monitor_fleet([], SimpleNamespace(), run, 1.0, 1.0, source="x", idle_stop=stopper)
    run.add("h", {"type": "hello"})
    assert started.is_set() and seen[0].is_set() and seen[1] == "joined" and seen[2] == "h"
    assert idlestop.enforcer([Host("c", (), {})], "inventory/hosts.yaml", lambda: None, print, None, 1.0) is None


def test_an_idle_host_is_logged_in_to_only_to_list_again_or_to_stop(monkeypatch, tmp_path):
    engine = Engine(container("c2", "busy", ("1",), idle_stop=60))
    opened = []
    stopper, said = enforce(monkeypatch, tmp_path, engine)
    monkeypatch.setattr("gpurig.connect.engineopen.open_engine", lambda conn: opened.append(conn) or engine)
    stopper.list_every = 300
    assert stopper.check() == [] and stopper.check() == [] and len(opened) == 1  # listed once; nothing due: no second login
    now = [0.0]
    stopper.clock = lambda: now[0]
    now[0] = 301.0  # the list is stale: read again; GPU 1 is still busy: nothing stopped
    assert stopper.check() == [] and len(opened) == 2 and said == []


@pytest.mark.parametrize("task", ["monitor", "dashboard"])
def test_a_bad_idle_stop_stops_any_task_at_inventory_load_in_one_line_before_any_host(tmp_path, task):
    import os
    import subprocess
    import sys

    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    a100-01:\n      ansible_host: 192.0.2.1\n"
                         "      gpurig_containers:\n        - {variant: jupyter, idle_stop: 4hours}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", "from gpurig.cli import main; main()", task, "-i", str(inventory)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1, proc.stderr
    assert "gpurig_containers[0].idle_stop: '4hours' is not a duration" in proc.stderr and "idle_stop: 4h" in proc.stderr
