"""The package's shape: every module in a layer folder, no two modules with one name, no import that climbs a layer.

A newcomer should be able to tell from the tree where a change goes: image
building under image/, reaching hosts under connect/, and so on. These tests
keep the tree that way as it grows.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gpurig"

# Lowest first. A module may import its own layer and the layers below it; layers of one rank are
# siblings and import neither each other nor anything above them.
LAYERS: list[tuple[str, ...]] = [
    ("gpurig", "gpurig.errors", "gpurig.status"),
    ("gpurig.files", "gpurig.process", "gpurig.skeleton"),
    ("gpurig.results",),
    ("gpurig.strict",),
    ("gpurig.config",),
    ("gpurig.inventory",),
    ("gpurig.connect",),
    ("gpurig.image",),
    ("gpurig.facts",),
    ("gpurig.steps",),
    ("gpurig.deploy",),
    ("gpurig.verify", "gpurig.monitor"),
    ("gpurig.jobs",),
    ("gpurig.slurm",),
    ("gpurig.report",),
    ("gpurig.flows",),
    ("gpurig.dashboard",),
    ("gpurig.cli",),
]
TOP_LEVEL_MODULES = {"__init__.py", "errors.py", "status.py", "files.py", "process.py", "config.py", "skeleton.py", "results.py"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "skeleton" in path.relative_to(PACKAGE).parts[:-1]:
            continue  # a wheel build's copy of the project folders, not code
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _layer_of(module: str) -> tuple[int, str]:
    best: tuple[int, str] | None = None
    for rank, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (rank, name)
    assert best is not None, f"{module} is in no layer: add its folder to LAYERS"
    return best


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("gpurig"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("gpurig"):
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in MODULES)
    return names


MODULES = _modules()


def test_top_level_holds_only_the_shared_basics():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in TOP_LEVEL_MODULES)
    assert not loose, f"modules outside a layer folder: {loose}"


def test_no_two_modules_share_a_name():
    by_name = defaultdict(list)
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            by_name[path.stem].append(module)
    clashes = {name: mods for name, mods in by_name.items() if len(mods) > 1}
    assert not clashes


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_never_climb_a_layer(module):
    rank, layer = _layer_of(module)
    climbing = []
    for imported in sorted(_imports(MODULES[module])):
        other_rank, other_layer = _layer_of(imported)
        if other_layer == layer or other_rank < rank:
            continue
        climbing.append(f"{imported} ({other_layer})")
    assert not climbing, f"{module} ({layer}) imports from above or beside it: {climbing}"


def test_the_layer_check_sees_a_climbing_import(tmp_path):
    # The rule itself: a module low in the tree that reaches up is caught.
    assert _layer_of("gpurig.connect.engine")[0] < _layer_of("gpurig.steps.plan")[0]
    assert _layer_of("gpurig.monitor.agent")[0] == _layer_of("gpurig.verify.runner")[0]
    assert _layer_of("gpurig.monitor.agent")[1] != _layer_of("gpurig.verify.runner")[1]


def _readme_layers() -> list[set[str]]:
    """The README's Layout list: each line's leading names (``image/ inventory/``), one rank a line, lowest first."""
    text = (PACKAGE.parent / "README.md").read_text()
    block = text.split("`gpurig/` is one folder per layer", 1)[1].split("\n\n", 2)[1]
    ranks = []
    for line in block.splitlines():
        if not line.startswith("    ") or line.startswith("     "):
            continue  # a continuation line: the description goes on
        names = []
        for word in line.split():
            if not (word.endswith(".py") or word.endswith("/")):
                break
            names.append("gpurig." + word.removesuffix(".py").removesuffix("/"))
        ranks.append(set(names))
    return ranks


def test_the_readme_states_the_same_layers():
    stated = [set(names) - {"gpurig"} for names in LAYERS]
    assert _readme_layers() == stated


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("gpurig.cli.")))
def test_a_task_module_imports_no_other_task_module(module):
    shared = {"gpurig.cli", "gpurig.cli.base", "gpurig.cli.options"}
    others = sorted(m for m in _imports(MODULES[module]) if m.startswith("gpurig.cli") and m not in shared | {module})
    assert not others, f"{module} imports {others}: move what they share into the library, or into cli/base or cli/options"


def _third_party(path: Path) -> set[str]:
    """The top-level names of what a module imports from outside gpurig (at any depth: lazy imports count)."""
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names - {"gpurig"}


@pytest.mark.parametrize(("package", "doors"), [("paramiko", ("gpurig.connect",)), ("invoke", ("gpurig.cli", "gpurig.config"))])
def test_a_third_party_package_is_used_behind_its_doors(package, doors):
    # paramiko only under connect/ (one door to SSH). Invoke only in the task layer and in config.py (the settings'
    # layering is Invoke's Config), so that the library, flows/ included, runs from Python without the task layer: a
    # flow ends with gpurig.errors.Finished, which the CLI makes Invoke's Exit.
    users = sorted(m for m, path in MODULES.items()
                   if package in _third_party(path) and not any(m == door or m.startswith(door + ".") for door in doors))
    assert not users, f"{users} import {package}: only {', '.join(doors)} may"
