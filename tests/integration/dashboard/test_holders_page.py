"""Who holds a GPU, end to end: real containers on this machine's Docker, the monitor's real agent reading their cgroups, a
real `gpurig dashboard --allow-actions` naming them through the engine, and real headless Chromium stopping one.

Only NVML is stood in (no GPU here): the agent's ``import pynvml`` finds a module that replays
tests/fixtures/monitor/nvml-h100-a100.json (tests/unit/nvml_replay.FakeNvml, the unit tests' replay), whose GPU processes'
pids are pointed at the containers' real processes: GPU 0 (at 2%) at ``jupyter-*``, made as deploy makes it (its labels, from
gpurig_containers through load_containers), GPU 1 at ``stranger-*``, a plain `docker run`. Everything else is real: the
agent reads /proc/PID/cgroup, the dashboard inspects the ids on this machine's engine, and the stop goes through
`gpurig stop`'s library code. The page must name both containers with the processes' user and since when, flag the idle
GPU naming its container, offer a stop for the deployed one only (the other says why in its title), ask before stopping
(dismissed once: nothing happens), stop it, and show it in History; the engine must then say it exited, and
.gpurig/history/actions.jsonl hold the action without the token. Every container made here is removed at the end.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from gpurig.connect.engineopen import local_engine
from gpurig.deploy.containers import load_containers
from gpurig.image.spec import load_spec
from gpurig.inventory import Host

from .pagekit import ROOT, WAIT_S, run_dashboard

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="reading other users' /proc/PID/cgroup and Docker need root here")

IMAGE = "debian:bookworm-slim"
FIXTURE = ROOT / "tests" / "fixtures" / "monitor" / "nvml-h100-a100.json"
# pynvml for the agent: the real binding loaded under its name for nvml_replay's constants, then this module replaced by the replay.
SHIM = '''import importlib.machinery, importlib.util, json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.machinery.PathFinder.find_spec("pynvml", [p for p in sys.path if os.path.abspath(p or ".") != here])
real = importlib.util.module_from_spec(spec)
sys.modules["pynvml"] = real
spec.loader.exec_module(real)
sys.path.insert(0, {unit!r})
from nvml_replay import FakeNvml
sys.modules["pynvml"] = FakeNvml(json.loads({data!r}))
'''


@pytest.fixture
def containers(docker_engine, container_kit, tmp_path):
    """(deployed name, stranger name, {name: (id, host pid)}): the two containers running; removed afterwards."""
    tag = uuid.uuid4().hex[:6]
    deployed, stranger = f"jupyter-{tag}", f"stranger-{tag}"
    entry = {"name": deployed, "user": "alice", "variant": "slim", "image": IMAGE, "gpus": [0], "command": ["sleep", "infinity"],
             "ulimits": {"memlock": 8388608}}
    host = Host("this-machine", (), {"gpurig_containers": [entry]}, connection="local")
    [spec], _ = load_containers(host, load_spec(ROOT / "images" / "pytorch.yaml"), source=str(ROOT / "inventory" / "hosts.yaml"))
    made = []
    with local_engine() as engine:
        try:
            body = spec.create_body(IMAGE, labels={container_kit.label: container_kit.session})
            assert body["HostConfig"].pop("DeviceRequests")  # deploy asks for the GPU; this machine has none to give
            body["HostConfig"]["Mounts"] = []  # deploy makes /srv/gpurig/NAME/workspace first; nothing is written under /srv here
            made.append(engine.create(body, deployed))
            engine.start(made[-1])
            docker_engine("run", "-d", "--name", stranger, "--label", f"{container_kit.label}={container_kit.session}", IMAGE, "sleep", "infinity")
            made.append(stranger)
            found = {}
            for name in (deployed, stranger):
                info = engine.container(name)
                assert info is not None and info.running
                found[name] = (info.id, int(info.raw["State"]["Pid"]))
            yield deployed, stranger, found
        finally:
            for ref in made:
                engine.remove(ref)


def test_the_sampler_reads_the_container_of_a_real_process(containers):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_sampler_under_test", ROOT / "checks" / "gpu_sampler.py")
    assert spec is not None and spec.loader is not None
    sampler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sampler)
    deployed, stranger, found = containers
    for cid, pid in found.values():
        assert sampler.process_container(pid) == cid
    assert sampler.process_container(os.getpid()) != found[deployed][0]  # this test runs in neither


@pytest.fixture
def project(tmp_path: Path, containers) -> tuple[Path, Path]:
    """The project (this machine its one host) and a folder whose pynvml replays the fixture with the containers' pids."""
    deployed, stranger, found = containers
    (tmp_path / "gpurig.yaml").write_text("{}\n")
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "hosts.yaml").write_text("all:\n  hosts:\n    this-machine:\n      ansible_connection: local\n")
    data = json.loads(FIXTURE.read_text())
    data["devices"][0]["utilization"]["gpu"] = 2  # idle while jupyter holds it
    data["devices"][0]["processes"][0]["pid"] = found[deployed][1]
    data["devices"][1]["processes"][0]["pid"] = found[stranger][1]
    shim = tmp_path / "nvml-shim"
    shim.mkdir()
    (shim / "pynvml.py").write_text(SHIM.format(unit=str(ROOT / "tests" / "unit"), data=json.dumps(data)))
    return tmp_path, shim


def test_the_page_names_the_containers_holding_gpus_and_stops_the_deployed_one(project, containers, browser):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    root, shim = project
    deployed, stranger, found = containers
    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,))

    def attr(css: str, name: str) -> str:
        return wait.until(lambda d: d.find_element(By.CSS_SELECTOR, css).get_attribute(name))

    mine = f'[data-gpu="this-machine:0"] [data-container="{deployed}"]'
    theirs = f'[data-gpu="this-machine:1"] [data-container="{stranger}"]'
    with run_dashboard(root, "--allow-actions", "--idle-after", "0", path=(shim,)) as (proc, url):
        browser.get(url)
        assert attr("body", "data-actions") == "allowed"
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f"{mine} button[data-stop-name]"))
        text = attr(mine, "textContent")
        assert text.startswith(f"{deployed} (root) ") and " since " in text, text
        row = attr('[data-gpu="this-machine:0"]', "textContent")
        assert f"under 5%, held by {deployed} (root)" in row, row  # the idle flag names the container
        assert attr('[data-gpu="this-machine:0"]', "data-idle") == "yes"
        assert f"image {IMAGE}" in attr(mine, "title") and f"gpurig_containers entry {deployed} (user alice)" in attr(mine, "title")
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, theirs))
        assert attr(theirs, "textContent").startswith(f"{stranger} (root) since")
        assert "not deployed by gpurig" in attr(theirs, "title")
        assert not browser.find_elements(By.CSS_SELECTOR, f"{theirs} button")  # not gpurig's: no button

        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f"{mine} button").click() or True)
        asked = wait.until(expected_conditions.alert_is_present())
        assert deployed in asked.text and "this-machine" in asked.text
        asked.dismiss()  # not confirmed: nothing is sent
        assert browser.find_element(By.ID, "gpu-action-said").get_attribute("data-state") == ""
        with local_engine() as engine:
            assert engine.container(deployed).running  # type: ignore[union-attr]

        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f"{mine} button").click() or True)
        wait.until(expected_conditions.alert_is_present()).accept()
        wait.until(lambda d: d.find_element(By.ID, "gpu-action-said").get_attribute("data-state") in ("done", "refused"))
        assert attr("#gpu-action-said", "textContent") == f"container {deployed} on this-machine: stopped"
        entry = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f'#history tr[data-action="stop"][data-container="{deployed}"]'))
        assert entry.get_attribute("data-result") == "stopped"
        assert f"stop container {deployed} on this-machine" in entry.text and "from the dashboard" in entry.text
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
        token = url.partition("?token=")[2]
    with local_engine() as engine:
        after = {name: engine.container(name) for name in (deployed, stranger)}
    assert after[deployed] is not None and after[deployed].status == "exited"
    assert after[stranger] is not None and after[stranger].running  # only what deploy made is ever stopped
    [line] = (root / ".gpurig" / "history" / "actions.jsonl").read_text().splitlines()
    entry = json.loads(line)
    assert (entry["action"], entry["container"], entry["host"], entry["result"]) == ("stop", deployed, "this-machine", "stopped")
    assert token not in line

