"""Facts fail closed: a host whose probe printed nothing, something else, or was cut short is not ``ok``.

The host is a ScriptedConnection answering with what such a host prints (the
recorded cut-short output from tests/fixtures/facts), then the real ``gpurig
facts`` on this machine with a ``sh`` that is cut short or silent. ``deploy``
gathers through ``gather_complete`` too; provision refuses such facts in
gpurig.steps.converge.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import ScriptedConnection

from gpurig.errors import HostError
from gpurig.facts import PROBES, gather, gather_complete

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "facts"


@pytest.mark.parametrize(("answer", "said"), [
    ((0, "", ""), "it printed nothing and exited 0"),
    ((0, "hello\n", ""), "it printed 'hello' and exited 0"),
    ((1, "", "sh: 1: Syntax error\n"), "exited 1"),
])
def test_a_probe_that_printed_nothing_of_its_own_is_a_host_error(answer, said):
    for call in (gather, gather_complete):
        with pytest.raises(HostError) as caught:
            call(ScriptedConnection("gpu-01", [answer]))
        assert caught.value.host == "gpu-01" and said in caught.value.problem
        assert "\n" not in str(caught.value)


def test_facts_cut_short_are_not_ok():
    cut = (FIXTURES / "h100-cut-short.txt").read_text()
    facts = gather(ScriptedConnection("gpu-01", [(0, cut, "")]))  # the library hands them over, with what is missing
    assert facts.missing and facts.incomplete.startswith("facts incomplete: no output for ")
    with pytest.raises(HostError) as caught:
        gather_complete(ScriptedConnection("gpu-01", [(0, cut, "")]))
    assert caught.value.problem == facts.incomplete and all(name in caught.value.problem for name in facts.missing)


def test_complete_facts_pass():
    full = (FIXTURES / "debian12-root.txt").read_text()
    facts = gather_complete(ScriptedConnection("gpu-01", [(0, full, "")]))
    assert facts.missing == () and facts.incomplete == "" and len(PROBES) > 10


@pytest.mark.parametrize(("sh", "said"), [
    ('/bin/sh "$@" | head -n 30', "facts incomplete: no output for "),  # the host stopped answering mid-probe
    ("exit 0", "it printed nothing and exited 0"),  # a probe that printed nothing at all
])
def test_the_facts_task_fails_such_a_host_in_one_line(tmp_path, sh, said):
    """The real CLI on this machine, whose `sh` (found on PATH, as on a host) is cut short or silent."""
    fake = tmp_path / "bin" / "sh"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/bash\n{sh}\n")
    fake.chmod(0o755)
    (tmp_path / "hosts.yaml").write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n")
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
    proc = subprocess.run([sys.executable, "-c", "from gpurig.cli import main; main()", "facts", "-i", "hosts.yaml", "--json", "facts.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    [host] = json.loads((tmp_path / "facts.json").read_text())["hosts"]
    assert host["status"] == "failed" and said in host["reason"]
    failed = [line for line in proc.stderr.splitlines() if line.startswith("failed")]
    assert len(failed) == 1 and said in failed[0]
