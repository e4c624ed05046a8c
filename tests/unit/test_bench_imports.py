"""The bench scripts are not run by the suite (they print figures), so their gpurig imports are checked here.

A name a bench imports from gpurig inside a function (where `--help` never
reaches it) that moved or was renamed would otherwise surface only when
someone re-measures: bench_monitor's fleet part broke that way once.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(BENCH.glob("*.py"))


def test_there_are_bench_scripts_to_check():
    assert len(SCRIPTS) >= 8


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_gpurig_name_a_bench_imports_exists(script: Path):
    missing = []
    for node in ast.walk(ast.parse(script.read_text(), str(script))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "gpurig":
            module = importlib.import_module(node.module)
            missing += [f"{node.module}.{a.name} (line {node.lineno})" for a in node.names if not hasattr(module, a.name)
                        and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert not missing
