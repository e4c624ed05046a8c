"""A fact is a declared probe: its name, the fixed shell text that reads it, and a pure parser of what that printed.

Every probe of a gather goes out in one script, one exec: ``facts_script``
prints each probe's output between ``@@gpurig-fact NAME`` and
``@@gpurig-rc CODE`` lines, ``split_sections`` cuts the output apart again
and ``read`` hands each probe its own section. The probes themselves are
declared beside their parsers (gpurig/facts/parsers.py, system.py); flags
derived from a probe's output (the Docker socket refused the user, the
nouveau module loaded) are fields of what its parser returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MARK = "@@gpurig-fact"
RC_MARK = "@@gpurig-rc"


@dataclass(frozen=True)
class Section:
    """One probe's output (stderr folded in) and exit code. 127 means the command does not exist."""

    rc: int
    text: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


ABSENT = Section(127, "")  # what a probe whose section never arrived is parsed from


@dataclass(frozen=True)
class Probe:
    """One fact: ``name`` (its section), ``shell`` (fixed text, never built from host data) and ``parse`` (pure)."""

    name: str
    shell: str
    parse: Callable[[Section], Any]


def facts_script(probes: Iterable[Probe]) -> str:
    """Every probe as one POSIX sh script (stdin closed, C locale, stderr folded into each section)."""
    lines = ["export LC_ALL=C PATH=\"$PATH:/usr/sbin:/sbin:/usr/local/bin\"", "exec </dev/null"]
    for probe in probes:
        lines.append(f"printf '\\n{MARK} {probe.name}\\n'; ( {probe.shell} ) 2>&1; printf '\\n{RC_MARK} %s\\n' \"$?\"")
    return "\n".join(lines) + "\n"


def split_sections(output: str) -> dict[str, Section]:
    """Cut the script's output into sections by marker; a section cut short (host died) is left out."""
    sections: dict[str, Section] = {}
    name: str | None = None
    body: list[str] = []
    for line in output.splitlines():
        if line.startswith(MARK + " "):
            name, body = line[len(MARK) + 1:].strip(), []
        elif line.startswith(RC_MARK + " ") and name is not None:
            try:
                rc = int(line[len(RC_MARK) + 1:].strip())
            except ValueError:
                rc = 1
            # The script prints a newline before the rc marker; a command whose output
            # ended with its own newline leaves one empty line, which is not output.
            sections[name] = Section(rc, "\n".join(body[:-1] if body and body[-1] == "" else body))
            name = None
        elif name is not None:
            body.append(line)
    return sections


def read(probes: Iterable[Probe], sections: Mapping[str, Section]) -> dict[str, Any]:
    """Each probe's parsed value by name; a probe whose section is missing is parsed from ``ABSENT``."""
    return {probe.name: probe.parse(sections.get(probe.name, ABSENT)) for probe in probes}
