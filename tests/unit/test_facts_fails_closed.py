"""Facts fail closed: a host whose probe printed nothing, something else, or was cut short is not ``ok``.

The host is a ScriptedConnection answering with what such a host prints (the
recorded cut-short output from tests/fixtures/facts). ``gpurig facts`` and
``deploy`` gather through ``gather_complete``; provision refuses such facts in
gpurig.steps.converge.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import ScriptedConnection

from gpurig.errors import HostError
from gpurig.facts import PROBES, gather, gather_complete

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


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
