"""The job agent's verbs on one host (checks/job_agent.py): each one command line carrying the agent, its answer parsed.

The agent travels inside the command line, as the probes and the sampler do
(``gpurig.connect.launcher``). Verbs that touch the host-wide job folders run
with the rights the inventory grants (``Connection.admin``); the sync folder
is the login user's own, so ``apply`` (which reads a tar on stdin) runs as
the login user and never needs sudo to pass stdin through. A refusal the
agent prints (``gpurig-agent-error: {...}``) becomes one ``HostError`` with
its problem and fix; an agent that could not even start (no python3) says so.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpurig.connect.connection import Connection, Result
from gpurig.connect.launcher import embedded_line
from gpurig.connect.streams import Feed, Streams
from gpurig.errors import GpurigError, HostError, last_line
from gpurig.skeleton import shipped_text

AGENT = "checks/job_agent.py"
SAMPLER = "checks/gpu_sampler.py"
JOBS_ROOT = "/srv/gpurig/jobs"
_ERROR = "gpurig-agent-error: "
_STATE = "gpurig-job-state: "
_WAIT = "gpurig-job-wait: "  # while a followed job is pending: its state and why, once and again when why changes
_NO_PYTHON = (127,)


class JobError(HostError):
    """A job verb the host's agent refused, or one that could not run there."""


@dataclass(frozen=True)
class LogEnd:
    """How a job stood when its log was read to the end: its state, exit code and why."""

    state: str | None
    exit_code: int | None
    reason: str = ""


def agent_source() -> str:
    """The agent's source as this gpurig ships it; missing or empty is one clear error before any host."""
    try:
        return shipped_text(AGENT)
    except GpurigError as err:
        raise JobError(err.problem, err.fix) from None


class JobAgent:
    """The verbs of the job agent on ``conn``'s host."""

    def __init__(self, conn: Connection, source: str | None = None, root: str = JOBS_ROOT) -> None:
        self.conn = conn
        self.source = source if source is not None else agent_source()
        self.root = root

    # --- the synced working directory ------------------------------------------------------------

    def manifest(self, key: str, create: bool = True) -> dict[str, list]:
        """What the host's sync folder ``key`` holds: path -> [kind, size, mtime, mode(, link target)]; made when missing (``create``)."""
        said = self._json("manifest", "--cache", key, *([] if create else ["--no-create"]))
        try:
            entries = json.loads(zlib.decompress(base64.b64decode(said.get("z") or "")))
        except (ValueError, zlib.error):
            raise JobError("the job agent's listing of the sync folder is unreadable", "run again; report it with -vv if it persists",
                           host=self.conn.name) from None
        return entries if isinstance(entries, dict) else {}

    def apply(self, key: str, feed: Feed, timeout: float | None = None) -> dict[str, Any]:
        """Send the tar ``feed`` writes: the host stages it and moves it into place (files, bytes, deleted)."""
        result = self._call("apply", "--cache", key, admin=False, streams=Streams(feed=feed), timeout=timeout)
        return self._parse(result)

    def submit(self, key: str, job: str) -> dict[str, Any]:
        """Make job ``job`` from the bundle ``apply`` left in the sync folder, and start its supervisor."""
        return self._json("submit", "--root", self.root, "--cache", key, "--id", job)

    # --- reading and acting on jobs --------------------------------------------------------------

    def jobs(self, ids: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Every job on the host (or those whose id starts with one of ``ids``), states made true (a dead supervisor: failed)."""
        args = [a for i in ids for a in ("--id", i)]
        return list(self._json("list", "--root", self.root, *args).get("jobs") or ())

    def cancel(self, job: str, grace: float) -> dict[str, Any]:
        return self._json("cancel", "--root", self.root, "--id", job, "--grace", f"{grace:g}", timeout=grace + 90)

    def logs(self, job: str, on_text: Callable[[str], None], *, follow: bool = False, tail: int = 0,
             on_wait: Callable[[str, str], None] | None = None) -> LogEnd:
        """The job's log to ``on_text`` (with ``follow`` until the job ends); how the job stood at the end.

        ``on_wait(state, reason)``: while a followed job is pending, why it waits (when it starts waiting and when why changes),
        then its state once it stops waiting.
        """
        import codecs

        decoder = codecs.getincrementaldecoder("utf-8")("replace")

        def text(data: bytes) -> None:
            shown = decoder.decode(data)
            if shown:
                on_text(shown)

        args = ["--root", self.root, "--id", job, *(["--follow"] if follow else []), *(["--tail", str(tail)] if tail else [])]
        result = self._call("logs", *args, streams=Streams(on_bytes=text), on_output=_wait_lines(on_wait) if on_wait else None)
        rest = decoder.decode(b"", True)
        if rest:
            on_text(rest)
        self._raise_refusal(result)
        for line in result.stderr.splitlines():
            if line.startswith(_STATE):
                doc = json.loads(line[len(_STATE):])
                return LogEnd(doc.get("state"), doc.get("exit_code"), doc.get("reason") or "")
        return LogEnd(None, None)

    def artifacts(self, job: str) -> dict[str, list]:
        """The job's artifact files: path -> [size, sha256, mode, mtime]."""
        return self._json("artifacts", "--root", self.root, "--id", job).get("files") or {}

    def pack(self, job: str, paths: list[str], on_bytes: Callable[[bytes], None]) -> None:
        """A tar of the job's artifact ``paths`` to ``on_bytes``."""
        result = self._call("pack", "--root", self.root, "--id", job, "--", *paths, streams=Streams(on_bytes=on_bytes))
        self._raise_refusal(result)

    def samples(self, job: str) -> list[dict[str, Any]]:
        """The sampler's records over the job's run (hello, notes, at most 2000 samples)."""
        return list(self._json("samples", "--root", self.root, "--id", job).get("records") or ())

    # --- one call --------------------------------------------------------------------------------

    def line(self, verb: str, *args: str) -> str:
        return embedded_line(self.source, "job_agent.py", [verb, *args])

    def _call(self, verb: str, *args: str, admin: bool = True, streams: Streams | None = None, timeout: float | None = None,
              on_output: Callable[[str, str], None] | None = None) -> Result:
        run = self.conn.admin if admin else self.conn.run
        return run(self.line(verb, *args), warn=True, timeout=timeout, streams=streams, on_output=on_output)

    def _json(self, verb: str, *args: str, timeout: float | None = 300) -> dict[str, Any]:
        return self._parse(self._call(verb, *args, timeout=timeout))

    def _parse(self, result: Result) -> dict[str, Any]:
        self._raise_refusal(result)
        try:
            doc = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise JobError(f"the job agent answered nothing readable ({last_line(result.stdout) or 'no output'})",
                           "run again; if it persists, report it with the output of -vv", host=self.conn.name) from None
        if not isinstance(doc, dict):
            raise JobError("the job agent's answer is not a JSON object", "report it with the output of -vv", host=self.conn.name)
        return doc

    def _raise_refusal(self, result: Result) -> None:
        for line in result.stderr.splitlines():
            if line.startswith(_ERROR):
                try:
                    said = json.loads(line[len(_ERROR):])
                except ValueError:
                    said = {"problem": line[len(_ERROR):]}
                raise JobError(str(said.get("problem") or "the job agent refused"), str(said.get("fix") or ""), host=self.conn.name)
        if result.exited in _NO_PYTHON:
            raise JobError("python3 is not installed on the host, and the job agent needs it",
                           "run `gpurig provision` (its python3 step), or install python3 there", host=self.conn.name)
        if result.exited != 0:
            said = last_line(result.stderr) or last_line(result.stdout) or f"exit status {result.exited}"
            raise JobError(f"the job agent failed: {said}", "run again with -vv and report what it says", host=self.conn.name)


def _wait_lines(on_wait: Callable[[str, str], None]) -> Callable[[str, str], None]:
    """An output handler that hands each whole gpurig-job-wait line on the command's stderr to ``on_wait(state, reason)``."""
    held = [""]

    def on_output(stream: str, text: str) -> None:
        if stream != "stderr":
            return
        *lines, held[0] = (held[0] + text).split("\n")
        for line in lines:
            if not line.startswith(_WAIT):
                continue
            try:
                doc = json.loads(line[len(_WAIT):])
            except ValueError:
                continue
            if isinstance(doc, dict):
                on_wait(str(doc.get("state") or ""), str(doc.get("reason") or ""))

    return on_output
