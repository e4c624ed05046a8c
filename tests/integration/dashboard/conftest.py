"""The dashboard's integration tests: a real `gpurig dashboard` over the machine itself, and real headless Chromium reading it."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def browser(tmp_path: Path):
    """Headless Chromium (pagekit.chromium), quit at the end."""
    from .pagekit import chromium

    with chromium(tmp_path) as driver:
        yield driver
