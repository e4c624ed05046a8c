"""The fleet table's Slurm and provision cells and History's idle stops, as real headless Chromium draws them from the snapshot.

The rows are the snapshot's own (gpurig.dashboard.snapshot over provision's StepResults and sinfo's answer, read by
gpurig.slurm.health), the history entry the one gpurig.dashboard.history makes of a kept idle stop; the page must show a
drained node's reason and since when, unknown with why where nothing was read, the steps provision would change, and the
stop, without a console error, at 80 columns as on a wide screen.
"""

from __future__ import annotations

import threading

from gpurig.dashboard import snapshot
from gpurig.dashboard.history import History, _idle_stop_entry
from gpurig.flows.fleetprovision import drift
from gpurig.monitor.session import Run
from gpurig.results import HostResult
from gpurig.slurm.health import node_line
from gpurig.status import Status
from gpurig.steps.plan import StepResult

from .pagekit import WAIT_S

REASON = "gpurig: host.driver: no NVIDIA driver loaded"


class FleetFeeds:
    interval = 0.5

    def __init__(self) -> None:
        self.stopping = threading.Event()

    def document(self):
        drained = HostResult("n1", Status.OK, data=node_line(f"drained|{REASON}|2026-12-04T10:31:12\n"))
        extra = {
            "n1": {"slurm": snapshot.slurm_cell(drained, "", 1.0),
                   "drift": {**drift(HostResult("n1", Status.CHANGED, data=(
                       StepResult("docker", Status.OK), StepResult("daemon", Status.CHANGED, "would change (check mode): x"),
                       StepResult("python3", Status.CHANGED, "would change (check mode): y")))), "read_at": 1.0}},
            "n2": {"slurm": snapshot.slurm_cell(HostResult("n2", Status.UNREACHABLE, "connection refused"), ""),
                   "drift": {**drift(HostResult("n2", Status.UNREACHABLE, "connection refused")), "read_at": 1.0}},
            "web": {"drift": {**drift(HostResult("web", Status.OK, data=(StepResult("docker", Status.OK),))), "read_at": 1.0}},
        }
        rows = snapshot.fleet_rows(["n1", "n2", "web"], None, "recorded", {}, "", {}, extra)
        stop = _idle_stop_entry({"time": "2026-12-05T08:00:00+00:00", "host": "a100-01", "container": "jupyter", "user": "alice",
                                 "image": "pytorch:2.13.0-cu130-jupyter", "gpus": ["0", "1"], "idle_s": 14520, "idle_stop_s": 14400,
                                 "stopped": True})
        live = snapshot.live_section(Run(), "running", "", self.interval, {})
        doc = snapshot.document(selection=["n1", "n2", "web"], inventory="recorded", live=live,
                                fleet={"state": "known", "why": "", "hosts": rows, "drift": {"checked": True, "read_at": 1.0, "why": ""}},
                                jobs=snapshot.jobs_section(None, [], "recorded", None),
                                history=snapshot.history_section(History(entries=[stop], idle_stop_files=1), ""))
        return doc, {}, {}

    def delta(self, cursor, versions):
        return {"live": {"hosts": {}}}, cursor, versions


def test_slurm_state_drift_and_idle_stops_are_drawn_at_80_columns_and_wide(browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from gpurig.dashboard.webserver import Dashboard

    token = "fleet-" + "t" * 40
    server = Dashboard(FleetFeeds(), token, "127.0.0.1", 0)  # type: ignore[arg-type]
    server.serve()
    try:
        wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.1)
        for width in (1600, 660):
            browser.set_window_size(width, 1000)
            browser.get(server.url(token))
            n1 = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, 'tr[data-host="n1"]'))
            slurm = n1.find_element(By.CSS_SELECTOR, "td[data-slurm]")
            assert slurm.get_attribute("data-slurm") == "drained" and REASON in slurm.text and "since 2026-12-04T10:31:12" in slurm.text
            assert n1.find_element(By.CSS_SELECTOR, "td[data-drift]").text.startswith("2 steps would change: daemon, python3")
            n2 = browser.find_element(By.CSS_SELECTOR, 'tr[data-host="n2"]')
            assert "connection refused" in n2.text and n2.find_element(By.CSS_SELECTOR, "td[data-drift]").get_attribute("data-drift") == "unknown"
            web = browser.find_element(By.CSS_SELECTOR, 'tr[data-host="web"]')
            assert web.find_element(By.CSS_SELECTOR, "td[data-drift]").text.startswith("in step") and not web.find_elements(By.CSS_SELECTOR, "td[data-slurm]")
            stop = browser.find_element(By.CSS_SELECTOR, 'tr[data-kind="idle-stop"]')
            assert "idle stop a100-01 jupyter" in stop.text and "stopped: GPUs 0,1 idle 4h02m (idle_stop 4h00m)" in stop.text
            assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth"), f"the page overflows at {width}px"
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        server.close()
