"""Jobs on the dashboard, end to end: real jobs started with `gpurig run` on this machine (an ``ansible_connection: local`` host,
its own Docker engine, no GPU), a real `gpurig dashboard --allow-actions` and real headless Chromium.

A job appears running, its log link shows its output in the page as text (the HTML it prints stays text), and once it ends
the page shows it failed with its exit code. A second, long-running job is cancelled from the page: the confirmation names
the job and its host (dismissed once: nothing happens), the page then shows it cancelled, and History shows the action,
which the project's .gpurig/history/actions.jsonl holds without the token. A job no host has is 404 with one line. Every
wait is on the page or on the job's state, bounded; the jobs' containers, supervisors and folders, and the image tag the
test made, are removed at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from .pagekit import ROOT, WAIT_S, run_dashboard

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs on this machine need root (/srv/gpurig/jobs, docker)")

JOBS = Path("/srv/gpurig/jobs")
SYNC = Path("/srv/gpurig/sync")
SHOWN = "<b>bold</b> & <script>alert(1)</script>"
FIRST = f"printf '%s\\n' '{SHOWN}'; echo step-1; while [ ! -e release ]; do sleep 0.1; done; echo finished; exit 7\n"
SECOND = "echo holding on; while [ ! -e release ]; do sleep 0.1; done\n"  # never released: cancelled from the page


@pytest.fixture
def job_image(docker_engine, container_kit):
    """A small Debian image (the integration tests' base: local, pulled or bootstrapped) under a tag of this session's own."""
    from gpurig.image.baseimage import ensure_base
    from gpurig.image.spec import Bootstrap

    base = ensure_base(docker_engine.engine, "debian:bookworm-slim", Bootstrap("bookworm", container_kit.mirror),
                       {container_kit.label: container_kit.session}, say=lambda _: None)
    tag = f"gpurig-test-dashboard-jobs:{container_kit.session}"
    docker_engine("tag", base.image_id, tag)
    try:
        yield tag
    finally:
        docker_engine("image", "rm", tag, check=False)  # the tag only: the base stays for whoever else uses it
        if base.source == "bootstrapped":
            docker_engine("image", "rm", "-f", base.image_id, check=False)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "gpurig.yaml").write_text("{}\n")
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "hosts.yaml").write_text("all:\n  hosts:\n    this-machine:\n      ansible_connection: local\n")
    return tmp_path


@pytest.fixture
def local_jobs(project, job_image, docker_engine):
    """submit(script) -> job id: `gpurig run` of ``sh job.sh`` on this machine; every job's container, supervisor and folder,
    and the sync folders the runs made, removed at the end."""
    made: list[str] = []
    sync_before = {p for p in SYNC.glob("*/*")} if SYNC.is_dir() else set()
    users_before = {p for p in SYNC.glob("*")} if SYNC.is_dir() else set()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def submit(script: str, name: str) -> str:
        work = project / name
        work.mkdir()
        (work / "job.sh").write_text(script)
        proc = subprocess.run([sys.executable, "-c", "from gpurig.cli import main; main()", "run", "--image", job_image, "--gpus", "none",
                               "--ulimit", "memlock=8388608", "--workdir", str(work), "--json", "-", "--", "sh", "job.sh"],
                              cwd=project, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        job = json.loads(proc.stdout)["job"]["id"]
        made.append(job)
        return job

    try:
        yield submit
    finally:
        for job in made:
            docker_engine("rm", "-f", f"gpurig-job-{job}", check=False)
            supervisors = [p for p in psutil.process_iter(["cmdline"]) if "job_agent.py" in " ".join(p.info["cmdline"] or ())
                           and job in (p.info["cmdline"] or ())]
            left = [c for p in supervisors for c in _children(p)] + supervisors
            for p in left:
                p.kill()
            psutil.wait_procs(left, timeout=10)
            subprocess.run(["rm", "-rf", str(JOBS / job)], check=False)
        for path in ({p for p in SYNC.glob("*/*")} - sync_before) | ({p for p in SYNC.glob("*")} - users_before):
            subprocess.run(["rm", "-rf", str(path)], check=False)


def _children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_a_job_shows_running_its_log_then_its_exit_code_and_another_is_cancelled_from_the_page(project, local_jobs, browser):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,))

    def click(css: str) -> None:
        """Click what ``css`` finds, again if the jobs table was redrawn under it (every read replaces its rows)."""
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, css).click() or True)

    def text(css: str) -> str:
        return wait.until(lambda d: d.find_element(By.CSS_SELECTOR, css).get_attribute("textContent"))

    first = local_jobs(FIRST, "first")
    with run_dashboard(project, "--allow-actions") as (proc, url):
        browser.get(url)
        assert wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-actions")) == "allowed"
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f'tr[data-job="{first}"][data-state="running"]'))

        click(f'tr[data-job="{first}"] a[data-log]')
        wait.until(lambda d: "step-1" in d.find_element(By.ID, "log-text").get_attribute("textContent"))
        assert SHOWN in text("#log-text")  # the HTML the job printed is text on the page
        assert not browser.find_elements(By.CSS_SELECTOR, "#log-text *")  # no element made of it: no <b>, no <script>
        assert f"log of job {first} on this-machine" == text("#log-title")

        (JOBS / first / "work" / "release").touch()  # the job's own copy of its folder: it finishes now
        row = f'tr[data-job="{first}"][data-state="failed"][data-exit="7"]'
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, row))
        cells = wait.until(lambda d: [td.text for td in d.find_elements(By.CSS_SELECTOR, f"{row} td")])
        assert cells[2] == "failed (exited 7)" and cells[3] == "7", cells
        assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-job="{first}"] button[data-cancel]')  # ended: nothing to cancel
        click("#log-refresh")
        wait.until(lambda d: "finished" in d.find_element(By.ID, "log-text").get_attribute("textContent"))

        second = local_jobs(SECOND, "second")
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f'tr[data-job="{second}"][data-state="running"]'))
        cancel = f'tr[data-job="{second}"] button[data-cancel]'
        click(cancel)
        asked = wait.until(expected_conditions.alert_is_present())
        assert second in asked.text and "this-machine" in asked.text
        asked.dismiss()  # not confirmed: nothing is sent
        assert browser.find_element(By.ID, "action-said").get_attribute("data-state") == ""
        assert browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{second}"]').get_attribute("data-state") == "running"

        click(cancel)
        wait.until(expected_conditions.alert_is_present()).accept()
        wait.until(lambda d: d.find_element(By.ID, "action-said").get_attribute("data-state") == "done")
        assert f"job {second} on this-machine: cancelled" in text("#action-said")
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f'tr[data-job="{second}"][data-state="cancelled"]'))
        action = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f'#history tr[data-kind="action"][data-job="{second}"]'))
        assert action.get_attribute("data-result") == "cancelled"
        assert f"cancel job {second} on this-machine" in action.text and "from the dashboard" in action.text

        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors  # under the CSP, with no inline script, and no request refused

        base, _, token = url.partition("?token=")
        request = urllib.request.Request(base + "api/jobs/zzz999/log", headers={"Authorization": f"Bearer {token}"})
        with pytest.raises(urllib.error.HTTPError) as unknown:
            urllib.request.urlopen(request, timeout=30)
        assert unknown.value.code == 404 and unknown.value.read() == b"no job zzz999 on the 1 host searched\n"
    [line] = (project / ".gpurig" / "history" / "actions.jsonl").read_text().splitlines()
    entry = json.loads(line)
    assert (entry["action"], entry["job"], entry["host"], entry["result"]) == ("cancel", second, "this-machine", "cancelled")
    assert token not in line
