"""The probes gpurig sends to hosts are found, and are the checks/ files themselves.

verify and monitor carry checks/verify_host.py, checks/verify_torch.py and
checks/gpu_sampler.py to hosts inside the command line. Were the folder they
are looked up in wrong, verify would have nothing to send (a host with no
records) and monitor nothing to run; these tests fail then, whatever the
rest of the suite replays.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import zlib
from pathlib import Path

from gpurig.monitor.agent import agent_command
from gpurig.verify.runner import VerifyPlan

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ROOT / "checks"


def test_verify_sends_the_host_and_torch_probes_of_checks():
    plan = VerifyPlan.from_checks("full")
    assert plan.host_probe is not None, "verify found no checks/verify_host.py to send"
    assert plan.torch_probe is not None, "verify found no checks/verify_torch.py to send"
    assert plan.host_probe == (CHECKS / "verify_host.py").read_text()
    assert plan.torch_probe == (CHECKS / "verify_torch.py").read_text()


def test_monitor_runs_the_sampler_of_checks_and_it_samples():
    line = agent_command(0.05, 0.15)
    packed = re.search(r"b64decode\('([A-Za-z0-9+/=]+)'\)", shlex.split(line)[2])
    assert packed, line[:200]
    assert zlib.decompress(base64.b64decode(packed.group(1))).decode() == (CHECKS / "gpu_sampler.py").read_text()
    proc = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60)
    records = [json.loads(x) for x in proc.stdout.splitlines()]
    assert proc.returncode == 0, proc.stderr
    assert records[0]["type"] == "hello" and records[-1]["type"] == "end" and records[-1]["samples"] >= 1
