"""Shared test helpers: the project root and a scratch copy of it for CLI runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# tests/tools/ holds scripts run on demand (the mutation audit), not tests.
collect_ignore = ["tools"]
# No test may hang: pytest-timeout stops any test after pyproject's default (900 s). These folders' first tests
# also pay for session fixtures that build images or provision hosts from scratch (up to an hour on 2 cores).
LONG_FOLDERS = ("integration/images", "integration/deploy", "integration/verify", "integration/hosts_systemd", "integration/hosts_containers",
                "integration/slurm")
LONG_TIMEOUT_S = 3600
# Run with pytest-xdist (`-n 3 --dist loadfile`, the README's test command), each test module runs whole on one worker:
# its tests share module fixtures (a booted cluster the first test provisions and the next ones use). Not xdist's
# groups (--dist loadgroup): pytest 9.2 ignores the group xdist writes into a test's id, and every test became a group
# of its own, spread over the workers away from its module's first test.
# These folders go to one worker whole (SuiteScheduling): their modules share what is costly to make (each image
# built once, not once per worker), or may not run beside each other (one Slurm cluster at a time, the SSH tests'
# timing); one worker then runs them in turn instead of the other sitting idle on a run-wide lock.
ONE_WORKER_FOLDERS = ("integration/images", "integration/slurm", "integration/hosts")
# The work in the order it is handed out (--no-loadscope-reorder keeps it), longest first, so that no long one starts
# last while the other workers sit idle; a path here is a folder or a module (the longest match places a test).
# Measured with GPURIGTEST_TIMELINE (tests/tools/timeline.py) on 2 cores, a run whose machine had run the suite before:
# test_delivery ~320 s, slurm ~350 s, images ~300 s, test_fabric_faults ~190 s, test_fanout ~170 s, test_deploy ~130 s,
# each of the rest under 90 s; the unit tier fills the gaps.
LONGEST_FIRST = ("integration/images", "integration/deploy/test_delivery.py", "integration/slurm",
                 "integration/deploy/test_fabric_faults.py", "integration/deploy/test_fanout.py",
                 "integration/deploy/test_deploy.py", "integration/hosts_systemd/test_provision_docker.py", "integration/deploy",
                 "integration/hosts_systemd", "integration/installed", "integration/verify", "integration/monitor", "integration/hosts",
                 "integration/hosts_containers")


# pytest-xdist's workers start with COLUMNS=80 and LINES=24 in their environment where the run itself has none, so
# every table gpurig printed there (in-process, or in a gpurig a test started) was 80 columns wide and cut what a
# test reads. The controller says what the run had (pytest_configure), and each worker puts that back here, before
# anything reads them.
TERMINAL_VARS = ("COLUMNS", "LINES")
if os.environ.get("PYTEST_XDIST_WORKER") and "GPURIGTEST_RUN_COLUMNS" in os.environ:
    for _name in TERMINAL_VARS:
        if os.environ.get(f"GPURIGTEST_RUN_{_name}"):
            os.environ[_name] = os.environ[f"GPURIGTEST_RUN_{_name}"]
        else:
            os.environ.pop(_name, None)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        for name in TERMINAL_VARS:
            os.environ[f"GPURIGTEST_RUN_{name}"] = os.environ.get(name, "")
    # A suite started in the background of a script (`cmd &`, nohup) inherits SIGINT ignored, and every gpurig a test
    # starts would inherit that too: the Ctrl-C tests would wait for a stop that never comes. A handled SIGINT here
    # is reset to the default in each child at exec, as a terminal gives it.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _xdist_controller(config) and config.getoption("testrunuid", None) is None:
        config.option.testrunuid = uuid.uuid4().hex  # known here too, to remove what the run's workers shared
    if not config.pluginmanager.hasplugin("timeout"):
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            "pytest-timeout is not installed, so a hung test is never stopped: pip install -e '.[test]'"), stacklevel=2)


def _xdist_controller(config: pytest.Config) -> bool:
    """This process hands tests to pytest-xdist workers (and runs none itself)."""
    return bool(config.getoption("numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_sessionfinish(session: pytest.Session) -> None:
    # What the workers of an xdist run shared (tests/integration/systemd_kit.py's host images and their bases, labelled
    # with the run's id) is removed once all of them are done; a worker's own teardown removes only what it alone made.
    if not _xdist_controller(session.config):
        return
    run = session.config.option.testrunuid[:12]
    docker = shutil.which("docker") or shutil.which("docker", path="/usr/bin:/usr/local/bin")
    if docker:
        found = subprocess.run([docker, "image", "ls", "-q", "--no-trunc", "--filter", f"label=io.gpurig.test.run={run}"],
                               capture_output=True, text=True, timeout=60)
        ids = sorted(set(found.stdout.split()))
        if ids:
            subprocess.run([docker, "image", "rm", "-f", *ids], capture_output=True, timeout=300)
        # the run's names for the kept bases (systemd_kit.kept_base): the names go, the bases stay for the next run
        names = subprocess.run([docker, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "--filter", f"reference=gpurig-test-base-*:{run}"],
                               capture_output=True, text=True, timeout=60).stdout.split()
        if names:
            subprocess.run([docker, "image", "rm", *names], capture_output=True, timeout=300)
    for lock in Path(tempfile.gettempdir()).glob(f"gpurig-test-{run}-*.lock"):
        lock.unlink(missing_ok=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # GPURIGTEST_TIMELINE=FILE: one JSON line per phase of each test (its worker, start and stop), for
    # tests/tools/timeline.py to show where a run's time went and whether the workers ended together.
    path = os.environ.get("GPURIGTEST_TIMELINE")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller writes, once per report
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else "main"
        with open(path, "a") as out:
            out.write(json.dumps({"worker": worker, "test": report.nodeid, "when": report.when,
                                  "start": report.start, "stop": report.stop, "outcome": report.outcome}) + "\n")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    places = {}
    for item in items:
        where = item.path.relative_to(ROOT / "tests").as_posix() if item.path.is_relative_to(ROOT / "tests") else ""
        if where.startswith(LONG_FOLDERS) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT_S))
        found = [f for f in LONGEST_FIRST if where == f or where.startswith(f + "/")]
        places[item] = LONGEST_FIRST.index(max(found, key=len)) if found else len(LONGEST_FIRST)
    items.sort(key=places.__getitem__)  # stable: within a folder, the order pytest collected


@pytest.hookimpl(optionalhook=True)  # the suite also runs without xdist (-p no:xdist, -n 0)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """--dist loadfile, with each of ONE_WORKER_FOLDERS one unit of work (None: xdist's own for any other --dist)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SuiteScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return next((f"tests/{f}" for f in ONE_WORKER_FOLDERS if module.startswith(f"tests/{f}/")), module)

    return SuiteScheduling(config, log)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the project's images/, templates/ and checks/ to render into without touching the checkout."""
    for name in ("images", "templates", "checks"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / ".hadolint.yaml", tmp_path / ".hadolint.yaml")
    return tmp_path
