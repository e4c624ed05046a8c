"""Shared test helpers: the project root and a scratch copy of it for CLI runs."""

from __future__ import annotations

import shutil
import signal
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


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background of a script (`cmd &`, nohup) inherits SIGINT ignored, and every gpurig a test
    # starts would inherit that too: the Ctrl-C tests would wait for a stop that never comes. A handled SIGINT here
    # is reset to the default in each child at exec, as a terminal gives it.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not config.pluginmanager.hasplugin("timeout"):
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            "pytest-timeout is not installed, so a hung test is never stopped: pip install -e '.[test]'"), stacklevel=2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.relative_to(ROOT / "tests").as_posix() if item.path.is_relative_to(ROOT / "tests") else ""
        if where.startswith(LONG_FOLDERS) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT_S))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the project's images/, templates/ and checks/ to render into without touching the checkout."""
    for name in ("images", "templates", "checks"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / ".hadolint.yaml", tmp_path / ".hadolint.yaml")
    return tmp_path
