"""``idle_stop`` enforced on this machine's Docker: real containers made as deploy makes them, a recorded GPU run replayed.

Three containers from deploy's own create bodies (gpurig_containers through load_containers: its labels, the idle_stop one
among them): ``jupyter`` with idle_stop 4h on GPUs 0 and 2, ``busy`` with idle_stop 4h on GPU 1, ``keep`` without idle_stop
on GPUs 0 and 2. The samples are tests/fixtures/monitor/runs/slurm_jobs (GPU 0 at 2%, 1 at 97%, 2 at 0%) read into the
monitor's Run, one every 10 minutes (4h50m). What this machine cannot have is stood in, and only that: Docker refuses to
start a container with a GPU request where NVIDIA's runtime is missing, so the request is left out of the create body
and the GPUs each container was given are what the engine's answer is read as holding (and the workspace folder deploy
makes under /srv first is left out too). The enforcer lists, inspects and
stops through gpurig's Engine on the real engine; the test checks the engine's own state after. Every container made here
carries the session's test label and is removed at the end.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest

from gpurig.connect import engine as engine_module
from gpurig.connect.connector import Connector
from gpurig.connect.engineopen import local_engine
from gpurig.connect.ssh import SSHSettings
from gpurig.dashboard.history import read_history
from gpurig.deploy.containers import IDLE_STOP_LABEL, load_containers
from gpurig.image.spec import load_spec
from gpurig.inventory import Host
from gpurig.monitor.idlestop import IDLE_STOP_LOG, IdleStop
from gpurig.monitor.session import Run

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "tests" / "fixtures" / "monitor" / "runs" / "slurm_jobs" / "samples.jsonl"
STRETCH = 600.0
IMAGE = "debian:bookworm-slim"
HOST = "this-machine"
# dockerd here may not raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE): the containers ask for what the host allows, as deploy's tests do
HOST_ULIMITS = {"memlock": 8388608}


def replay(run: Run) -> None:
    """The recorded run into ``run`` as this machine's samples, one every STRETCH seconds."""
    records = [json.loads(line) for line in RUN.read_text().splitlines()]
    t0 = next(r["t"] for r in records if r.get("type") == "sample")
    for r in records:
        run.add(HOST, {**r, "host": HOST, **({"t": t0 + (r["t"] - t0) * STRETCH} if "t" in r else {})})


@pytest.fixture
def deployed(docker_engine, container_kit, monkeypatch):
    """name -> container id: the three containers, running, as deploy creates them (less the GPU request); removed afterwards."""
    tag = uuid.uuid4().hex[:6]
    entries = [
        {"name": f"jupyter-{tag}", "variant": "slim", "image": IMAGE, "gpus": [0, 2], "share": True, "idle_stop": "4h",
         "command": ["sleep", "infinity"]},
        {"name": f"busy-{tag}", "variant": "slim", "image": IMAGE, "gpus": [1], "idle_stop": "4h", "command": ["sleep", "infinity"]},
        {"name": f"keep-{tag}", "variant": "slim", "image": IMAGE, "gpus": [0, 2], "share": True, "command": ["sleep", "infinity"]},
    ]
    host = Host(HOST, (), {"gpurig_containers": [{**e, "ulimits": HOST_ULIMITS} for e in entries]}, connection="local")
    specs, _ = load_containers(host, load_spec(ROOT / "images" / "pytorch.yaml"), source=str(ROOT / "inventory" / "hosts.yaml"))
    held = {s.name: s.gpus.ids for s in specs}
    real_info = engine_module.container_info

    def info(data):  # the GPUs deploy gave it, where Docker was not asked for them
        found = real_info(data)
        return found if found.name not in held else dataclasses.replace(found, device_ids=tuple(str(i) for i in held[found.name]))

    monkeypatch.setattr(engine_module, "container_info", info)
    ids = {}
    with local_engine() as engine:
        try:
            for spec in specs:
                body = spec.create_body(IMAGE, labels={container_kit.label: container_kit.session})
                assert body["HostConfig"].pop("DeviceRequests")  # deploy asks for the GPUs; this machine has none to give
                body["HostConfig"]["Mounts"] = []  # deploy makes /srv/gpurig/NAME/workspace first; nothing is written under /srv here
                ids[spec.name] = engine.create(body, spec.name)
                engine.start(ids[spec.name])
            yield host, ids
        finally:
            for cid in ids.values():
                engine.remove(cid)


def test_the_idle_container_is_said_stopped_and_kept_and_the_others_run_on(deployed, tmp_path):
    host, ids = deployed
    jupyter, busy, keep = ids
    said: list[str] = []
    settings = SSHSettings(project_known_hosts=tmp_path / "known_hosts", user_known_hosts=None, ssh_config=None)
    stopper = IdleStop([host], lambda: Connector(settings), said.append, tmp_path, STRETCH, list_every=0)
    run = Run(listeners=(stopper.quiet,))
    replay(run)
    done = stopper.check()
    assert said == [f"{HOST} {jupyter}: GPUs 0,2 idle 4h50m (idle_stop 4h): stopping", f"{HOST} {jupyter}: stopped"]
    with local_engine() as engine:
        states = {name: engine.container(cid) for name, cid in ids.items()}
    assert not states[jupyter].running and states[jupyter].status == "exited"
    assert states[busy].running and states[keep].running  # GPU 1 busy; no idle_stop
    assert states[jupyter].labels[IDLE_STOP_LABEL] == "14400" and IDLE_STOP_LABEL not in states[keep].labels
    assert [(e["container"], e["stopped"], e["gpus"], e["idle_s"]) for e in done] == [(jupyter, True, ["0", "2"], 29 * STRETCH)]
    kept = [json.loads(line) for line in (tmp_path / IDLE_STOP_LOG).read_text().splitlines()]
    assert [(e["host"], e["container"], e["stopped"]) for e in kept] == [(HOST, jupyter, True)]
    shown = [e for e in read_history(tmp_path).entries if e["kind"] == "idle-stop"]
    assert [(e["host"], e["container"], e["idle_stop_s"]) for e in shown] == [(HOST, jupyter, 14400)]
    assert stopper.check() == [] and len(said) == 2  # stopped once: nothing more to say
