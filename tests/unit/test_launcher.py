"""gpurig.connect.launcher: a standalone script run from the command line itself, its arguments intact through a shell."""

from __future__ import annotations

import json
import subprocess
import sys

from gpurig.connect.launcher import embedded, embedded_line

ECHO = "import sys, json; print(json.dumps([__name__, sys.argv[1:]]))"


def test_the_script_runs_as_main_with_its_arguments():
    out = subprocess.run(embedded(ECHO, "p.py", ["--json"], python=sys.executable), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '["__main__", ["--json"]]'


def test_hostile_arguments_and_name_reach_the_script_unchanged_through_sh():
    args = ["$(touch /tmp/gpurig-pwned)", "a'b\"c", "; rm -rf ~", "x\ny", ""]
    line = embedded_line(ECHO, "it's $(evil).py", args, python=sys.executable)
    out = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '["__main__", ' + json.dumps(args) + "]"


def test_a_traceback_names_the_script():
    out = subprocess.run(embedded("raise SystemExit(undefined)", "gpu_probe.py", python=sys.executable), capture_output=True, text=True)
    assert out.returncode == 1 and 'File "gpu_probe.py", line 1' in out.stderr
