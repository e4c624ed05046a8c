"""The habits that keep the tree readable, as tests CI runs: ruff and mypy clean, no module grown past ~400 lines.

The tools come with the test extras (`pip install -e '.[test]'`); a missing
tool fails here rather than skipping, so a CI that lost it cannot pass silently.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 420  # "none much over 400": the probes in checks/ are exempt, they must stay single files


def _tool(*argv: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_finds_nothing():
    proc = _tool("ruff", "check", "--no-cache", "--output-format", "concise", ".", timeout=120)
    assert "No module named ruff" not in proc.stderr, "ruff is not installed: pip install -e '.[test]'"
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_finds_nothing():
    proc = _tool("mypy", timeout=600)
    assert "No module named mypy" not in proc.stderr, "mypy is not installed: pip install -e '.[test]'"
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_no_module_is_much_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "gpurig").rglob("*.py"))
            if "skeleton" not in p.parts and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by what they do: {long}"


def test_deploys_apply_and_host_reads_say_what_they_take():
    # mypy checks a parameter only when it is typed: an untyped spec (or one typed Any) let a wrong object through unseen.
    # compare's other helpers take settings' values, which are any JSON value.
    loose = []
    for name in ("apply", "compare", "hoststate", "rollhost", "access"):
        for node in ast.walk(ast.parse((ROOT / "gpurig" / "deploy" / f"{name}.py").read_text())):
            if isinstance(node, ast.AnnAssign) and ast.unparse(node.annotation) == "Any":  # a field such as Target.spec
                loose.append(f"deploy/{name}.py line {node.lineno}")
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            if name == "compare" and node.name != "plan" or name == "access" and node.name != "lines":
                continue
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            loose += [f"deploy/{name}.py {node.name}({a.arg})" for a in args if a.arg not in ("self", "cls")
                      and (a.annotation is None or ast.unparse(a.annotation) == "Any")]
    assert not loose, f"type these parameters: {loose}"
