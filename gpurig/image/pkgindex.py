"""Which torch releases a package index offers, asked through pip's own index command.

pip speaks to the index the way a build will: its proxy handling, TLS
(``--cert``), authentication and mirror URLs, plain folders as find-links.
It runs ``--isolated`` so that the build machine's own pip.conf (an index or
a wheel folder the image build never sees) cannot add versions the image
could not get. The answer is filtered the way the image's pip would filter
it: CPython of the spec's Python on manylinux x86_64, releases only.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

PLATFORM = "manylinux_2_28_x86_64"  # pip also accepts the older manylinux tags below it
_AVAILABLE = re.compile(r"^Available versions: (.*)$", re.MULTILINE)
_NOT_FOUND = "No matching distribution found"
_FETCH_PROBLEMS = (
    re.compile(r"Failed to establish a new connection: ([^'\")]+)"),
    re.compile(r"Could not fetch URL \S+: (.+)"),
    re.compile(r"(\d{3} Server Error.*)"),
    re.compile(r"WARNING: Retrying .* after connection broken by '(\w+)"),
)


@dataclass(frozen=True)
class Source:
    """One place pip looks: an index URL, or find-links folders with no index."""

    label: str  # what a person reads: the URL, or the folder
    args: tuple[str, ...]  # pip's options that select it


@dataclass(frozen=True)
class Listing:
    """What one source offers: versions as pip prints them ('2.15.0+cu130'), or why pip could not read it."""

    source: Source
    versions: tuple[str, ...] = ()
    error: str = ""


def index_source(url: str) -> Source:
    return Source(url, ("--index-url", url))


def links_source(folders: Iterable[str]) -> Source:
    folders = tuple(folders)
    return Source(", ".join(folders), ("--no-index", *(a for f in folders for a in ("--find-links", f))))


def pip_argv(package: str, python: str, source: Source, cert: str | None = None, timeout_s: float = 15) -> list[str]:
    argv = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "index", "versions", package,
            "--python-version", python, "--implementation", "cp", "--platform", PLATFORM, "--only-binary=:all:",
            "--timeout", str(int(timeout_s)), "--retries", "1", *source.args]
    return argv + (["--cert", cert] if cert else [])


def parse_versions(output: str) -> tuple[str, ...]:
    """The versions of pip's 'Available versions:' line, newest first as pip lists them."""
    found = _AVAILABLE.search(output)
    return tuple(v.strip() for v in found.group(1).split(",") if v.strip()) if found else ()


def list_versions(package: str, python: str, source: Source, cert: str | None = None,
                  run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Listing:
    """One source's versions of ``package``; a source that has none is an empty listing, not an error."""
    try:
        proc = run(pip_argv(package, python, source, cert), capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Listing(source, error=str(e))
    versions = parse_versions(proc.stdout)
    problem = fetch_problem(proc.stderr)
    if versions or (_NOT_FOUND in proc.stderr and not problem):
        return Listing(source, versions)  # an index without the package answers 404: pip says 'not found' and nothing else
    return Listing(source, error=problem or _last_line(proc.stderr) or f"pip exited {proc.returncode}")


def fetch_problem(stderr: str) -> str:
    """Why pip could not read an index (refused, DNS, TLS, HTTP 5xx), from the warnings it logs; '' when it read it."""
    for pattern in _FETCH_PROBLEMS:
        found = pattern.search(stderr)
        if found:
            return found.group(1).strip()
    return ""


def _last_line(stderr: str) -> str:
    return next((line.strip() for line in reversed(stderr.splitlines()) if line.strip() and "experimental" not in line), "")


def list_all(package: str, python: str, sources: Iterable[Source], cert: str | None = None, workers: int = 8,
             run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[Listing]:
    """Every source asked at once (each pip start costs about half a second)."""
    sources = list(sources)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(sources)))) as pool:
        return list(pool.map(lambda s: list_versions(package, python, s, cert, run), sources))
