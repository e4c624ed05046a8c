"""skeleton.shipped: the one way gpurig finds what it ships, in a checkout and in a wheel's layout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpurig.errors import GpurigError
from gpurig.skeleton import shipped

ROOT = Path(__file__).resolve().parents[2]


def test_in_the_checkout_the_top_level_folders_and_the_package_data():
    assert shipped("checks/verify_host.py") == ROOT / "checks" / "verify_host.py"
    assert shipped("templates") == ROOT / "templates"
    assert shipped("gpurig/monitor/grafana-dashboard.json") == ROOT / "gpurig" / "monitor" / "grafana-dashboard.json"


@pytest.mark.parametrize("path", ["/etc/passwd", "../README.md", "checks/../../x", "", "README.md", "tests/fakes.py"])
def test_only_what_gpurig_ships_can_be_asked_for(path):
    with pytest.raises(ValueError):
        shipped(path)


def test_a_file_this_gpurig_lacks_is_one_error_naming_it():
    with pytest.raises(GpurigError) as caught:
        shipped("checks/verify_nothing.py")
    assert "has no checks/verify_nothing.py" in caught.value.problem and "reinstall gpurig" in caught.value.fix


def test_in_a_wheels_layout_the_package_skeleton_wins(tmp_path):
    """gpurig/skeleton/ beside the code, as setup.py lays out a wheel, and no checkout around it."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "gpurig", site / "gpurig", ignore=shutil.ignore_patterns("__pycache__", "skeleton"))
    for name in ("images", "checks"):
        shutil.copytree(ROOT / name, site / "gpurig" / "skeleton" / name)
    code = ("from gpurig.skeleton import shipped\n"
            "for p in ('checks/verify_torch.py', 'gpurig/monitor/grafana-dashboard.json'): print(shipped(p))\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.splitlines() == [str(site / "gpurig" / "skeleton" / "checks" / "verify_torch.py"),
                                       str(site / "gpurig" / "monitor" / "grafana-dashboard.json")]
