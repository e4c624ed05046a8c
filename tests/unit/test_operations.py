"""Every step's plan from recorded facts, with no host (pyinfra's tests/operations style).

Each ``tests/operations/<step>/<case>.json`` names a recorded facts file
(tests/fixtures/facts/<name>.txt), the inventory vars the host has
(``wanted``), the step's own arguments where it takes some (``step_args``:
--reboot, the spec's default CUDA), and what the plan must be: its status, a fragment of its
reason (for a failed plan, the problem) and of its fix, the human line of each change, and for
a file the new content and the exact unified diff.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpurig.facts import parse_facts
from gpurig.inventory import Host
from gpurig.inventory.profile import host_profile
from gpurig.steps import STEPS

TESTS = Path(__file__).resolve().parents[1]
CASES = sorted(p for p in (TESTS / "operations").glob("*/*.json") if p.parent.name != "deploy")  # deploy: tests/unit/deploy/test_plan.py


@pytest.mark.parametrize("case_file", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_plan_from_recorded_facts(case_file: Path):
    case = json.loads(case_file.read_text())
    facts = parse_facts((TESTS / "fixtures" / "facts" / f"{case['facts']}.txt").read_text())
    step = STEPS[case_file.parent.name](**case.get("step_args", {}))
    plan = step.plan(facts, host_profile(Host("h", (), case["wanted"]), case_file))
    assert plan.status == case["status"]
    assert case["reason"] in plan.reason
    assert case.get("fix", "") in plan.fix and "fix:" not in plan.reason
    assert [c.summary for c in plan.changes] == case["changes"]
    written = [c for c in plan.changes if c.content is not None]
    if "content" in case:
        expected = case["content"]
        assert (json.loads(written[0].content) if isinstance(expected, dict) else written[0].content) == expected
        assert written[0].diff.splitlines() == case["diff"]
    else:
        assert not written
    if plan.status != "changed":
        assert not plan.changes


def test_every_step_has_cases():
    assert {p.parent.name for p in CASES} == set(STEPS)
