"""What the dashboard's browser tests share: a real `gpurig dashboard` in a project, headless Chromium driven by selenium, and a
bounded wait on a condition.

``run_dashboard`` starts the CLI with stderr no terminal (the URL with its token lands in a 0600 file) and ends it with Ctrl-C,
checking that it stopped cleanly, left none of its agents and never wrote the token where it logs. ``chromium`` starts Debian's
chromium through chromium-driver and quits it (and what it started) at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT_S = 60


def wait_for(what: str, found, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.1)  # polling a condition, not waiting for time to pass
    raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def run_dashboard(project: Path, *flags: str, interval: str = "0.5", env: dict[str, str] | None = None,
                  path: tuple[Path, ...] = ()) -> Iterator[tuple[subprocess.Popen, str]]:
    """`gpurig dashboard --interval INTERVAL FLAGS` in ``project``: (the process, the URL with its token); Ctrl-C at the end.

    ``env``: the environment to run it in (default: this one); ``path``: folders put before the checkout on its PYTHONPATH
    (the dashboard's and its local agents')."""
    log = open(project / "dashboard.log", "w")
    env = {**(os.environ if env is None else env), "PYTHONPATH": os.pathsep.join(str(p) for p in (*path, ROOT))}
    proc = subprocess.Popen([sys.executable, "-c", "from gpurig.cli import main; main()", "dashboard", "--interval", interval, *flags],
                            cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    folder = project / ".gpurig" / "dashboard"
    try:
        url_file = wait_for("the dashboard's URL file", lambda: next(folder.glob("*.url"), None) if folder.is_dir() else None)
        assert url_file.stat().st_mode & 0o777 == 0o600
        url = wait_for("the URL written whole", lambda: url_file.read_text().strip() if url_file.read_text().endswith("\n") else None)
        yield proc, url
    finally:
        agents = []
        try:
            agents = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, to the whole foreground group as a terminal sends it
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
        gone, alive = psutil.wait_procs(agents, timeout=10)
        for p in alive:
            p.kill()
        assert not alive, f"the dashboard left its agents running: {[p.pid for p in alive]}"
        said = (project / "dashboard.log").read_text()
        assert proc.returncode == 0 and "dashboard stopped" in said, said
        assert "token=" not in said  # the token went to the 0600 file only
        assert not list(folder.glob("*.url"))


@contextmanager
def chromium(tmp_path: Path):
    """Headless Chromium under chromium-driver, its console kept (a CSP refusal is a SEVERE entry); quit with all it started."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install -e '.[test]' (scripts/setup.sh does)")
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("chromium and chromium-driver are not installed: apt-get install chromium chromium-driver (scripts/setup.sh does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-dev-shm-usage", "--window-size=1280,1000", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver_pid = service.process.pid if service.process else None
    try:
        yield driver
    finally:
        left = psutil.Process(driver_pid).children(recursive=True) if driver_pid and psutil.pid_exists(driver_pid) else []
        driver.quit()
        gone, alive = psutil.wait_procs(left, timeout=10)
        for p in alive:
            p.kill()
