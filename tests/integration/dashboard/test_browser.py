"""`gpurig dashboard` end to end: the CLI serving this machine (an ``ansible_connection: local`` host, no GPU), read by real headless
Chromium (Debian's chromium and chromium-driver, through selenium).

The page must list the host with the verify verdict a rollout recorded, its live CPU/memory chart must receive a new
sample from the monitor's agent, the build report must show in History, the page must load under its CSP without a
console error, a request without the token or with a wrong one must get 401 and an empty body, and, without
--allow-actions, the page offers no action and a POST from its own origin is refused: read-only. Every wait is on the
DOM or on a file appearing, never a sleep. Every process the test starts is stopped, and the dashboard's agents with it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpurig.deploy.rollplan import RolloutState, state_path

from .pagekit import ROOT, WAIT_S, run_dashboard


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose one host is this machine, with a rollout that verified it and a build report."""
    (tmp_path / "gpurig.yaml").write_text("{}\n")
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "hosts.yaml").write_text("all:\n  hosts:\n    this-machine:\n      ansible_connection: local\n")
    state = RolloutState.load(state_path(tmp_path, ["all"], "slim"), target="pytorch:test")
    state.record("this-machine", state="done", image_ref="pytorch:2.13.0-cu130-slim", image_id="sha256:1", verify="passed", level="quick")
    builds = tmp_path / "reports" / "builds" / "pytorch"
    builds.mkdir(parents=True)
    (builds / "2.13.0-cu130-slim.json").write_text(json.dumps({
        "image": "pytorch:2.13.0-cu130-slim", "image_id": "sha256:abc", "built_at": "2026-12-01T09:00:00+00:00",
        "variant": "slim", "torch": "2.13.0", "cuda": "13.0", "duration_s": 95.0}))
    return tmp_path


@pytest.fixture
def dashboard(project: Path):
    """`gpurig dashboard` in the project (stderr no terminal: the URL with its token lands in a 0600 file); Ctrl-C at teardown."""
    with run_dashboard(project) as (proc, url):
        yield proc, url, project


def _status(url: str, headers: dict[str, str], method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_the_page_shows_the_host_its_verdict_and_live_samples_and_refuses_without_the_token(dashboard, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    proc, url, project = dashboard
    base, _, token = url.partition("?token=")

    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": "gpurig_dashboard=wrong"}):
        for path in ("", "api/snapshot", "api/events", "static/dashboard.js"):
            assert _status(base + path, headers) == (401, b""), (path, headers)
    assert _status(f"{base}?token=wrong", {})[0] == 401
    own = {"Cookie": f"gpurig_dashboard={token}", "Origin": base.rstrip("/"), "Sec-Fetch-Site": "same-origin"}
    assert _status(base + "api/jobs/abc123/cancel", own, "POST") == (403, b"read-only: start the dashboard with --allow-actions\n")

    browser.get(url)
    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.1)
    assert "token=" not in browser.current_url  # the redirect took it out of the address bar
    row = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, 'tr[data-host="this-machine"][data-reach="ok"]'))
    assert row.get_attribute("data-verify") == "passed"
    assert "passed (quick)" in row.text

    chart = 'svg[data-series="this-machine:host"]'
    first = wait.until(lambda d: int(d.find_element(By.CSS_SELECTOR, chart).get_attribute("data-count") or 0))
    seen_t = float(browser.find_element(By.CSS_SELECTOR, chart).get_attribute("data-last-t"))
    wait.until(lambda d: float(d.find_element(By.CSS_SELECTOR, chart).get_attribute("data-last-t") or 0) > seen_t)
    assert int(browser.find_element(By.CSS_SELECTOR, chart).get_attribute("data-count")) > first
    assert browser.find_element(By.CSS_SELECTOR, f"{chart} polyline.util").get_attribute("points")
    assert browser.find_element(By.ID, "conn").get_attribute("data-state") == "live"

    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-kind="build"]'))
    assert "pytorch:2.13.0-cu130-slim" in browser.find_element(By.ID, "history").text
    status, body = _status(base + "api/snapshot", {"Authorization": f"Bearer {token}"})
    snapshot = json.loads(body)
    assert status == 200 and [h["host"] for h in snapshot["fleet"]["hosts"]] == ["this-machine"]
    jobs = snapshot["jobs"]
    assert jobs["state"] in ("known", "partial") or jobs["why"], jobs  # read, or saying why not; never a silent empty table

    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-actions") == "read-only"
    assert not browser.find_elements(By.CSS_SELECTOR, "button[data-cancel]")  # read-only: no action offered
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # a CSP refusal (inline script, an outside asset) is a console error

    shot = tmp_path / "dashboard.png"
    browser.save_screenshot(str(shot))
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert shot.stat().st_size > 10_000 and pixels.shape[0] > 500 and pixels.std() > 0.05, "the screenshot is blank"


class RecordedFeeds:
    """The feeds' surface over recorded monitor runs (real H100 samples, a Slurm node's job mapping): the page's GPU rows
    drawn from what ``gpurig monitor --replay`` reads."""

    interval = 0.5

    def __init__(self) -> None:
        import threading

        from gpurig.monitor.record import load_run
        from gpurig.monitor.session import Run

        self.stopping = threading.Event()
        self.run = Run()
        for case in ("healthy", "slurm_jobs"):
            recorded = load_run(ROOT / "tests" / "fixtures" / "monitor" / "runs" / case)
            for host in recorded.hosts():
                self.run.add(host, {"type": "hello", **recorded.state(host).hello})
                self.run.state(host).samples.extend(recorded.series(host))

    def document(self):
        from gpurig.dashboard import snapshot
        from gpurig.monitor.idle import IdleTracker

        idle = IdleTracker()
        for host in self.run.hosts():
            for sample in self.run.series(host):
                idle(host, {}, sample)
        live = snapshot.live_section(self.run, "running", "", self.interval, {}, idle=idle, idle_after=20)
        hosts = self.run.hosts()
        doc = snapshot.document(selection=hosts, inventory="recorded runs", live=live,
                                fleet={"state": "unknown", "why": "recorded runs: no facts",
                                       "hosts": snapshot.fleet_rows(hosts, None, "recorded run", {}, "", {})},
                                jobs=snapshot.jobs_section(None, [], "recorded run", None), history=snapshot.history_section(None, "recorded run"))
        return doc, snapshot.cursor_of(live), {}

    def delta(self, cursor, versions):
        return {"live": {"hosts": {}}}, cursor, versions


def test_gpu_rows_draw_recorded_samples_name_who_holds_each_gpu_and_flag_the_idle_one_at_80_columns_and_wide(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from gpurig.dashboard.webserver import Dashboard

    token = "recorded-" + "t" * 40
    server = Dashboard(RecordedFeeds(), token, "127.0.0.1", 0)  # type: ignore[arg-type]
    server.serve()
    try:
        wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.1)
        for width in (1600, 660):  # a wide screen, and about 80 columns
            browser.set_window_size(width, 1000)
            browser.get(server.url(token))
            row = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '[data-gpu="gpu-healthy:0"]'))
            assert int(row.find_element(By.CSS_SELECTOR, "svg").get_attribute("data-count")) == 30
            assert "°C" in row.text and "W" in row.text and "sm 86%" in row.text
            assert "python (alice) 48128 MiB" in row.text
            shared = browser.find_element(By.CSS_SELECTOR, '[data-gpu="gpu-slurm-jobs:1"]')
            assert "slurm job 43 (bob)" in shared.text and "slurm job 44" in shared.text
            assert shared.get_attribute("data-idle") == "no" and row.get_attribute("data-idle") == "no"
            idle = browser.find_element(By.CSS_SELECTOR, '[data-gpu="gpu-slurm-jobs:0"]')  # 2% for 29 s under job 42: past 20 s
            assert idle.get_attribute("data-idle") == "yes" and "idle 29s under 5%, held by slurm job 42 (alice)" in idle.text
            fleet = browser.find_element(By.CSS_SELECTOR, 'tr[data-host="gpu-healthy"]')
            assert fleet.get_attribute("data-reach") == "unknown" and "unknown" in fleet.text  # no facts: never "ok"
            assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth"), f"the page overflows at {width}px"
            browser.save_screenshot(str(tmp_path / f"gpus-{width}.png"))
    finally:
        server.close()
