"""Start-up: `gpurig --version` and `gpurig TASK --help` load Invoke and little else.

A person types `gpurig facts -l a100-01` all day; what it pays before the
first byte goes to the host is Python, Invoke, and the modules that task
uses. These tests run a fresh interpreter and look at ``sys.modules``:

- `--version` imports no task module;
- `TASK --help` imports that task's module and nothing of the library
  behind it (docker, paramiko, requests, jinja2 and gpurig's own library
  load when a task body runs, not when its flags are read);
- a task run through `gpurig TASK` imports only its own task module.

bench/bench_startup.py measures the time this buys, beside Invoke's own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpurig.cli import TASK_MODULES, build_collection

# What a task module may import at its top level: the CLI's own plumbing and gpurig's small leaf modules.
LIGHT = {
    "gpurig", "gpurig.cli", "gpurig.cli.base", "gpurig.cli.options", "gpurig.config", "gpurig.errors",
    "gpurig.files", "gpurig.status", "gpurig.strict", "gpurig.strict.validate", "gpurig.report", "gpurig.report.tables",
    "gpurig.connect",  # the package alone: the SSH library's logger names, which report's logging set-up reads; it imports nothing
}
# Libraries no flag parsing needs (each costs 20-110 ms to import; Invoke itself brings asyncio, unittest.mock).
HEAVY = ("docker", "paramiko", "requests", "urllib3", "jinja2", "cryptography", "nacl", "rich.live", "rich.progress")


def _modules_after(code: str, *argv: str) -> set[str]:
    """The modules loaded once ``code`` ran in a fresh interpreter (with ``argv`` as its arguments)."""
    probe = f"import sys\ntry:\n    {code}\nexcept SystemExit:\n    pass\nprint('\\0' + __import__('json').dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(proc.stdout.rpartition("\0")[2]))


def _gpurig(loaded: set[str]) -> set[str]:
    return {m for m in loaded if m == "gpurig" or m.startswith("gpurig.")}


def _heavy(loaded: set[str]) -> set[str]:
    return {m for m in loaded if m in HEAVY or m.split(".")[0] in HEAVY}


def test_every_task_is_named_in_the_map_of_task_modules():
    tasks = build_collection().tasks
    assert {name: task.body.__module__.rpartition(".")[2] for name, task in tasks.items()} == TASK_MODULES


def test_version_imports_no_task_module():
    loaded = _modules_after("from gpurig.cli import main; main(['gpurig', '--version'])")
    assert _gpurig(loaded) <= LIGHT, sorted(_gpurig(loaded) - LIGHT)
    assert not _heavy(loaded), sorted(_heavy(loaded))


@pytest.mark.parametrize("module", sorted(set(TASK_MODULES.values())))
def test_a_task_module_imports_only_light_modules(module):
    loaded = _modules_after(f"import gpurig.cli.{module}")
    library = {m for m in _gpurig(loaded) - LIGHT if not m.startswith("gpurig.cli.")}
    assert not library, f"gpurig.cli.{module} imports these at its top level; import them where they are used: {sorted(library)}"
    assert not _heavy(loaded), f"gpurig.cli.{module} loads {sorted(_heavy(loaded))} at its top level"


@pytest.mark.parametrize("name", ["facts", "verify", "status", "build"])
def test_a_task_reads_its_flags_without_the_other_tasks(name):
    loaded = _modules_after("from gpurig.cli import main; main(sys.argv)", name, "--help")
    tasks = {m.rpartition(".")[2] for m in _gpurig(loaded) if m.startswith("gpurig.cli.")} - {"base", "options"}
    own = TASK_MODULES[name]
    assert own in tasks
    assert tasks <= {own, *_imported_task_modules(own)}, sorted(tasks)


def _imported_task_modules(module: str) -> set[str]:
    loaded = _modules_after(f"import gpurig.cli.{module}")
    return {m.rpartition(".")[2] for m in loaded if m.startswith("gpurig.cli.")}


def test_a_word_that_names_no_task_loads_them_all_for_the_error():
    proc = subprocess.run([sys.executable, "-c", "import sys; from gpurig.cli import main; main(sys.argv)", "fatcs"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "fatcs" in proc.stderr


def test_the_early_tcp_connects_go_out_before_paramiko_loads():
    # connect_early dials the hosts first; paramiko and the connection code then load during the connects' round trips.
    loaded = _modules_after(
        "from gpurig.connect.early import EarlyLogins; from gpurig.inventory import Host; "
        "EarlyLogins().dial([Host(name='h', groups=(), vars={}, address='127.0.0.1', port=9)], 1, 1.0, None)")
    assert "gpurig.connect.early" in loaded
    assert not _heavy(loaded), f"dialing loads {sorted(_heavy(loaded))}"
    assert not {"gpurig.connect.ssh", "gpurig.connect.transport", "gpurig.connect.fleet"} & loaded
