"""The errors a user can meet, each carrying the fix to print beside it.

Everything below the CLI raises these; the CLI prints ``str(error)`` as one
line on stderr and exits with ``error.exit_code``. Nothing else should reach
the user as a traceback. ``problem``, ``fix`` and ``host`` stay separate
fields all the way to a report, which shows them side by side.
"""

from __future__ import annotations

import re


class GpurigError(Exception):
    """A problem the user can fix. ``problem`` says what is wrong, ``fix`` what to do, ``host`` where (if on one)."""

    exit_code = 2

    def __init__(self, problem: str, fix: str = "", host: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
        self.host = host

    def __str__(self) -> str:
        return explain(self.problem, self.fix, self.host)


class Finished(Exception):
    """A run that has said what it had to (its table, its recap, or ``message``) and ends with exit ``code``.

    How the library ends a task with a code without knowing Invoke: the CLI (gpurig.cli.base) makes it Invoke's
    Exit; a Python caller of gpurig.flows reads ``code``.
    """

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message or f"exit {code}")
        self.code = code
        self.message = message


class SpecError(GpurigError):
    """An image spec (images/*.yaml) that cannot be loaded or is invalid."""


class CompatError(SpecError):
    """A combination of versions that does not exist (torch x CUDA x Python x driver)."""


class RenderError(GpurigError):
    """A template that cannot be rendered into a build context."""


class LintError(GpurigError):
    """hadolint missing, or reporting problems in a rendered Dockerfile."""


class DockerError(GpurigError):
    """Docker missing, its daemon down, no BuildKit-capable client, or a failed build."""


class InventoryError(GpurigError):
    """An inventory file that cannot be loaded, or a host selection that matches nothing."""


class ConfigError(GpurigError):
    """A setting (flag, GPURIG_* variable or gpurig.yaml value) that is out of range or of the wrong type."""


class HostError(GpurigError):
    """A host that cannot be reached, authenticated, trusted or commanded."""


def explain(problem: str, fix: str = "", host: str = "") -> str:
    """The one line a person reads for a problem: ``host: problem; fix: fix``, each part only when there is one."""
    text = f"{host}: {problem}" if host else problem
    return f"{text}; fix: {fix}" if fix else text


def did_you_mean(word: str, choices) -> str:
    """' (did you mean X?)' for the closest of ``choices``, or ''."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def counted(n: int, noun: str, plural: str = "") -> str:
    """A count and its noun in one grammar everywhere: ``1 host``, ``2 hosts``, ``0 hosts`` (``plural`` when not noun+s)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def last_line(*texts: str | None, default: str = "") -> str:
    """The last non-empty line (stripped) of the first text that has one: ``last_line(stderr, stdout)``."""
    for text in texts:
        for line in reversed((text or "").splitlines()):
            if line.strip():
                return line.strip()
    return default


_ERROR_START = re.compile(r"^(E: |Error|ERROR|error:|fatal:|FATAL)|: (error|fatal)( error)?: ", re.IGNORECASE)


def error_line(text: str, skip: frozenset[str] = frozenset()) -> str:
    """The line of a tool's output that says what went wrong: the last one that starts an error, else the last one.

    Tools wrap a long note over lines after their error (dpkg's lock error is
    followed by "Note: removing the lock file ..." in two lines), so the last
    line alone is often the end of another sentence. Lines in ``skip`` are
    generic trailers that never say why.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip() and line.strip() not in skip]
    for i in range(len(lines) - 1, -1, -1):
        if _ERROR_START.search(lines[i]):
            return (_DPKG_SUMMARY.match(lines[i]) and _dpkgs_cause(lines[:i])) or _with_its_list(lines, i)
    return lines[-1] if lines else ""


_DPKG_FAILED = re.compile(r"^dpkg: error processing (package|archive) .+:$")
# What dpkg, and apt after it, end with when a package failed: a summary, not the reason.
_DPKG_SUMMARY = re.compile(r"^(Errors were encountered while processing:|E: Sub-process /usr/bin/dpkg returned an error code)")


def _dpkgs_cause(before: list[str]) -> str:
    """dpkg ends "Errors were encountered while processing:" and a list of packages, which says what failed but
    not why; the why is the line under its last "dpkg: error processing package X (--configure):"."""
    for j in range(len(before) - 2, -1, -1):
        if _DPKG_FAILED.match(before[j]):
            return f"{before[j].removesuffix(':')}: {before[j + 1]}"
    return ""


def _with_its_list(lines: list[str], i: int) -> str:
    """A line that ends with ':' names what follows it (dpkg's "Errors were encountered while processing:" and then the
    packages, a line each): those lines come along, or the reason would end at the colon."""
    if not lines[i].endswith(":") or i + 1 == len(lines):
        return lines[i]
    following = [line for line in lines[i + 1:i + 6] if not _ERROR_START.search(line)]
    return f"{lines[i]} {', '.join(following)}" if following else lines[i]


def permission_denied(text: str) -> bool:
    """Whether a tool's output says the system refused the user: cat's "Permission denied", docker's
    "permission denied while trying to connect to the Docker daemon socket", sudo'd commands' EACCES."""
    return "permission denied" in text.lower()
