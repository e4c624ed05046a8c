"""What the page may ask beyond its snapshot: the tail of a job's log, and (``--allow-actions``) cancelling a job, each action kept.

Both go through the library the CLI uses (gpurig.flows.jobact: ``gpurig logs
--job ID --tail N`` and ``gpurig cancel ID``). Every answer is one plain
``Reply``: the log as text/plain (the page puts it in as text, never as HTML),
an error as one line with its status (404: no such job; 502: the host could
not be asked, never an empty log). Every cancel the gate let through, done or
not, becomes a line of ``.gpurig/history/actions.jsonl``, kept as the verify
history is (gpurig.verify.verdictlog): what, which job, on which host, the
outcome, from which client address; never the token or the anti-CSRF value.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurig import __version__
from gpurig.errors import ConfigError, GpurigError
from gpurig.jobs.views import NoSuchJob, check_job_id
from gpurig.verify.verdictlog import HISTORY_DIR, VerifyHistory, append_lines, now, read_lines

if TYPE_CHECKING:
    from gpurig.flows.fleettask import HostOptions
    from gpurig.flows.jobact import Cancelled, LogTail

ACTIONS_LOG = f"{HISTORY_DIR}/actions.jsonl"
SCHEMA = "gpurig.dashboard-action/1"
MAX_LINES = 10_000  # the most lines of a log one request may ask for
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Reply:
    """One answer to the page: status, body and its type."""

    status: int
    body: bytes
    kind: str = TEXT

    @classmethod
    def line(cls, status: int, text: str) -> Reply:
        return cls(status, (" ".join(text.split()) + "\n").encode())

    @classmethod
    def json(cls, doc: dict[str, Any], status: int = 200) -> Reply:
        return cls(status, json.dumps(doc, separators=(",", ":")).encode(), "application/json")


def action_entry(action: str, job: str, host: str, result: str, detail: str, client: str, *, time: str | None = None) -> dict[str, Any]:
    """One action taken from the page, as a history line."""
    return {"schema": SCHEMA, "time": time or now(), "action": action, "job": job, "host": host, "result": result,
            "detail": detail[:400], "by": "dashboard", "client": client, "gpurig": __version__}


def record_action(root: Path, entry: dict[str, Any]) -> Path:
    return append_lines(Path(root) / ACTIONS_LOG, [entry])


def read_actions(root: Path) -> VerifyHistory:
    """The actions taken from dashboards in the project (the rotated file first); a foreign or torn line is skipped."""
    return read_lines(Path(root) / ACTIONS_LOG, lambda e: e.get("schema") == SCHEMA and isinstance(e.get("time"), str)
                      and isinstance(e.get("action"), str))


class Desk:
    """The page's requests that reach a host: ``read_log(job, lines)`` and ``cancel(job)`` are the library's calls (jobact),
    ``root`` the project whose history records every action, ``allow`` whether actions are on, ``changed`` what to poke after
    one (the feeds: the page shows the job's new state without waiting for the next read)."""

    def __init__(self, read_log: Callable[[str, int], LogTail], cancel: Callable[[str], Cancelled], root: Path | None,
                 allow: bool = False, changed: Callable[[], None] = lambda: None) -> None:
        if allow and root is None:
            raise ConfigError("--allow-actions records every action in the project's history, and this is no gpurig project",
                              "run the dashboard in a gpurig project (gpurig.yaml, images/ or tasks.py), or leave out --allow-actions")
        self.read_log = read_log
        self.cancel_call = cancel
        self.root = root
        self.allow = allow
        self.changed = changed
        self._lock = threading.Lock()

    def log(self, job: str, lines: int) -> Reply:
        """The last ``lines`` lines of the job's log as text/plain, or one line saying why not (404, 502)."""
        try:
            wanted = check_job_id(job)
        except ConfigError as err:
            return Reply.line(404, err.problem)
        try:
            tail = self.read_log(wanted, max(0, min(lines, MAX_LINES)))
        except NoSuchJob as err:
            return Reply.line(404, err.problem)
        except GpurigError as err:
            return Reply.line(502, f"job {wanted}'s log could not be read: {err}")
        except Exception as err:  # a bug must answer the page, not leave it waiting
            return Reply.line(500, f"job {wanted}'s log could not be read: {type(err).__name__}: {err}")
        return Reply(200, tail.text.encode())

    def cancel(self, job: str, client: str) -> Reply:
        """Cancel the job as ``gpurig cancel`` does and record it; JSON {job, host, result, detail}, or one line saying why not."""
        try:
            wanted = check_job_id(job)
        except ConfigError as err:
            return Reply.line(404, err.problem)
        status, host = 200, ""
        try:
            done = self.cancel_call(wanted)
        except NoSuchJob as err:
            status, result, detail = 404, "failed", err.problem
        except GpurigError as err:
            status, result, detail = 502, "failed", str(err)
        except Exception as err:
            status, result, detail = 500, "failed", f"{type(err).__name__}: {err}"
        else:
            wanted, host = done.view.id, done.view.host
            result = "cancelled" if done.changed else "ended already"
            detail = done.detail
        assert self.root is not None  # a Desk that allows actions has a project (checked when it was made)
        with self._lock:
            record_action(self.root, action_entry("cancel", wanted, host, result, detail, client))
        self.changed()
        if status != 200:
            return Reply.line(status, f"job {wanted} was not cancelled: {detail}")
        return Reply.json({"job": wanted, "host": host, "result": result, "detail": detail})


def desk_for(opts: HostOptions, allow: bool, changed: Callable[[], None] = lambda: None) -> Desk:
    """The desk of a dashboard over ``opts``' hosts: logs read and jobs cancelled as the CLI does it."""
    from gpurig.flows.jobact import cancel_job, log_tail

    return Desk(lambda job, lines: log_tail(opts, job, lines), lambda job: cancel_job(opts, job), opts.settings.root, allow, changed)
