"""The loopback sshd hosts of tests/integration/hosts, for the installed-package test (loaded from that file, not copied)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hosts_fixtures import hosts_conftest as load_hosts_conftest

hosts_conftest = load_hosts_conftest()

# The sshd fixtures, shared by name.
client_key = hosts_conftest.client_key
login_user = hosts_conftest.login_user
farm = hosts_conftest.farm
SSHD = hosts_conftest.SSHD


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.wheel)
            if SSHD is None:
                item.add_marker(pytest.mark.skip(reason="sshd not installed (apt-get install openssh-server)"))
            elif os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(reason="the sshd test host needs root (to create its sudo user)"))
