"""Facts keep /etc/docker/daemon.json itself: parsed, absent, invalid with the parser's message, or unreadable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpurig.facts import Section, parse_daemon_json, parse_facts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def facts(name: str):
    return parse_facts((FIXTURES / f"{name}.txt").read_text())


def test_recorded_files_are_kept_parsed_with_their_text():
    found = facts("debian12-daemon-user-keys").daemon_json
    assert found.state == "present"
    assert found.content["runtimes"] == {"custom": {"path": "/usr/local/bin/custom-runc"}}
    assert found.text.startswith('{\n  "data-root"')
    assert facts("h100-driver535-docker-nvidia").daemon_json.content["default-runtime"] == "nvidia"


def test_absent_invalid_and_unreadable_are_told_apart():
    assert facts("debian12-root").daemon_json.state == "absent"
    invalid = facts("debian12-daemon-invalid").daemon_json
    assert (invalid.state, invalid.content) == ("invalid", None)
    assert invalid.problem == "Expecting property name enclosed in double quotes (line 4, column 1)"
    assert facts("debian12-daemon-unreadable").daemon_json.state == "unreadable"


@pytest.mark.parametrize(
    "section, state, problem",
    [
        (Section(0, ""), "present", None),  # an empty file: dockerd's defaults
        (Section(0, '["a"]'), "invalid", "the top level is a JSON list, not an object"),
        (Section(1, "cat: /etc/docker/daemon.json: Is a directory"), "unknown", "cat: /etc/docker/daemon.json: Is a directory"),
    ],
)
def test_odd_files(section, state, problem):
    found = parse_daemon_json(section)
    assert (found.state, found.problem) == (state, problem)


def test_a_script_cut_short_is_unknown_not_absent():
    assert facts("h100-cut-short").daemon_json.state == "unknown"


def test_facts_report_holds_the_parsed_content_not_the_raw_text():
    data = facts("debian12-daemon-user-keys").to_dict()
    assert data["daemon_json"] == {
        "state": "present",
        "content": {"data-root": "/srv/docker", "log-driver": "json-file", "log-opts": {"max-size": "10m"},
                    "runtimes": {"custom": {"path": "/usr/local/bin/custom-runc"}}},
        "problem": None,
    }


def test_reports_carry_no_raw_daemon_json_and_no_proxy_credentials():
    from gpurig.results import FleetReport, HostResult

    text = (FIXTURES / "debian12-root.txt").read_text()
    secret = '{"proxies": {"http-proxy": "http://user:hunter2@proxy.example.invalid:3128"}}'
    start = text.index("@@gpurig-fact daemon_json")
    end = text.index("@@gpurig-rc", start)
    facts = parse_facts(text[:start] + "@@gpurig-fact daemon_json\n" + secret + "\n" + text[end:].replace("@@gpurig-rc 1", "@@gpurig-rc 0", 1))
    assert facts.daemon_json.content["proxies"]["http-proxy"].startswith("http://user:hunter2@")  # steps still see it
    report = FleetReport((HostResult("h", "ok", data=facts),), "now", 1.0).to_dict()
    assert "hunter2" not in json.dumps(report)
    assert report["hosts"][0]["data"]["daemon_json"]["content"]["proxies"]["http-proxy"] == "http://proxy.example.invalid:3128"
