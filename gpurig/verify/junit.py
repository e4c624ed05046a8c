"""A fleet's verdicts as JUnit XML for CI: one testsuite per host, one testcase per probe record.

The shape is the common JUnit schema that Jenkins, GitLab and GitHub
reporters read: ``testsuites`` > ``testsuite`` (name, tests, failures,
errors, skipped, time, timestamp, hostname) > ``testcase`` (classname, name,
time) with a ``failure`` or ``skipped`` child. A ``fail`` record is a
failure, a ``skip`` skipped, a ``warn`` passes with its detail in
``system-out``; a host that could not be verified at all (unreachable, or
the run broke) is one testcase with an ``error``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable

from gpurig.results import FleetReport, HostResult
from gpurig.verify.records import HostVerdict, Record


def junit_xml(report: FleetReport) -> str:
    """The report as a JUnit XML document (UTF-8 text with its declaration)."""
    root = ET.Element("testsuites", name="gpurig verify")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for result in report.results:
        suite = _suite(result, report.started)
        root.append(suite)
        for key in totals:
            totals[key] += int(suite.get(key, "0"))
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{report.duration_s:.3f}")
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _suite(result: HostResult, started: str) -> ET.Element:
    suite = ET.Element("testsuite", name=result.host, hostname=result.host, timestamp=started, time=f"{result.duration_s:.3f}")
    verdict = result.data if isinstance(result.data, HostVerdict) else None
    if verdict is None:
        case = ET.SubElement(suite, "testcase", classname=f"{result.host}.verify", name="verify", time=f"{result.duration_s:.3f}")
        ET.SubElement(case, "error", message=xml_text(result.reason or result.status), type=result.status).text = xml_text(result.reason)
        _count(suite, tests=1, errors=1)
        return suite
    seconds = verdict.seconds or {}
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for r in verdict.records:
        suite.append(_case(result.host, r, _share(seconds, r.probe, verdict.records)))
        counts["tests"] += 1
        counts["failures"] += r.status == "fail"
        counts["skipped"] += r.status == "skip"
    _count(suite, **counts)
    return suite


def _share(seconds: dict[str, float], probe: str, records: Iterable[Record]) -> float:
    """A probe's wall time spread evenly over its records (probes time themselves as a whole)."""
    n = sum(1 for r in records if r.probe == probe)
    return seconds.get(probe, 0.0) / n if n else 0.0


def _case(host: str, r: Record, seconds: float) -> ET.Element:
    case = ET.Element("testcase", classname=xml_text(f"{host}.{r.probe}"), name=xml_text(r.id), time=f"{seconds:.3f}")
    text = f"measured: {r.shown('measured')}\nexpected: {r.shown('expected')}\n{r.detail}"
    if r.status == "fail":
        failure = ET.SubElement(case, "failure", message=xml_text(r.detail or r.id), type="fail")
        failure.text = xml_text(text + (f"\nfix: {r.fix}" if r.fix else ""))
    elif r.status == "skip":
        ET.SubElement(case, "skipped", message=xml_text(r.detail or "skipped"))
    else:
        ET.SubElement(case, "system-out").text = xml_text(f"{r.status}: {text}" + (f"\nfix: {r.fix}" if r.fix else ""))
    return case


# What XML 1.0 cannot carry at all (Docker's and torch's output may hold escape sequences or NULs).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    return _NOT_XML.sub("?", text)


def _count(suite: ET.Element, **counts: int) -> None:
    for key in ("tests", "failures", "errors", "skipped"):
        suite.set(key, str(counts.get(key, 0)))
