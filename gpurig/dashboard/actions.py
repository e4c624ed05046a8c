"""What the page may ask beyond its snapshot: the tail of a job's log, and (``--allow-actions``) cancelling a job or stopping a
container deploy made, each action kept.

Each goes through the library the CLI uses (gpurig.flows.jobact: ``gpurig logs
--job ID --tail N`` and ``gpurig cancel ID``; gpurig.flows.containerlife:
``gpurig stop -l HOST --name NAME``, which touches only containers deploy made). Every answer is one plain
``Reply``: the log as text/plain (the page puts it in as text, never as HTML),
an error as one line with its status (404: no such job; 502: the host could
not be asked, never an empty log). Every cancel the gate let through, done or
not, becomes a line of ``.gpurig/history/actions.jsonl``, kept as the verify
history is (gpurig.verify.verdictlog): what, which job or container, on which host, the
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
from gpurig.strict.validate import container_name_problem, excerpt
from gpurig.verify.verdictlog import HISTORY_DIR, VerifyHistory, append_lines, now, read_lines

if TYPE_CHECKING:
    from gpurig.flows.containerlife import Stopped
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


def action_entry(action: str, job: str, host: str, result: str, detail: str, client: str, *, time: str | None = None,
                 container: str | None = None) -> dict[str, Any]:
    """One action taken from the page, as a history line (a stop names its container, and no job)."""
    return {"schema": SCHEMA, "time": time or now(), "action": action, "job": job, "host": host, "result": result,
            "detail": detail[:400], "by": "dashboard", "client": client, "gpurig": __version__,
            **({"container": container} if container is not None else {})}


def record_action(root: Path, entry: dict[str, Any]) -> Path:
    return append_lines(Path(root) / ACTIONS_LOG, [entry])


def read_actions(root: Path) -> VerifyHistory:
    """The actions taken from dashboards in the project (the rotated file first); a foreign or torn line is skipped."""
    return read_lines(Path(root) / ACTIONS_LOG, lambda e: e.get("schema") == SCHEMA and isinstance(e.get("time"), str)
                      and isinstance(e.get("action"), str))


def _attempt(call: Callable[[], Any], missing: type[GpurigError], missing_result: str) -> tuple[int, str, str, Any]:
    """An action's (status, result, detail, what ``call`` returned): 200 and its answer; 404 and ``missing_result`` for ``missing``
    (no such job or container); 502 for a host that could not be asked; 500 for a bug, which must answer the page too."""
    try:
        return 200, "", "", call()
    except missing as err:
        return 404, missing_result, err.problem, None
    except GpurigError as err:
        return 502, "failed", str(err), None
    except Exception as err:
        return 500, "failed", f"{type(err).__name__}: {err}", None


class Desk:
    """The page's requests that reach a host: ``read_log(job, lines)``, ``cancel(job)`` (jobact) and ``stop(host, name)``
    (containerlife) are the library's calls,
    ``root`` the project whose history records every action, ``allow`` whether actions are on, ``changed`` what to poke after
    one (the feeds: the page shows the job's new state without waiting for the next read)."""

    def __init__(self, read_log: Callable[[str, int], LogTail], cancel: Callable[[str], Cancelled], root: Path | None,
                 allow: bool = False, changed: Callable[[], None] = lambda: None, *,
                 stop: Callable[[str, str], Stopped] | None = None, stopped: Callable[[str], None] = lambda host: None) -> None:
        if allow and root is None:
            raise ConfigError("--allow-actions records every action in the project's history, and this is no gpurig project",
                              "run the dashboard in a gpurig project (gpurig.yaml, images/ or tasks.py), or leave out --allow-actions")
        self.read_log = read_log
        self.cancel_call = cancel
        self.root = root
        self.allow = allow
        self.changed = changed
        self.stop_call = stop
        self.stopped = stopped
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
        host = ""
        status, result, detail, done = _attempt(lambda: self.cancel_call(wanted), NoSuchJob, "failed")
        if status == 200:
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


    def stop(self, host: str, name: str, client: str) -> Reply:
        """Stop the container deploy made as ``gpurig stop -l HOST --name NAME`` does and record it; JSON {host, container,
        result, detail}, or one line saying why not (404: no such host or no container of that name deploy made there)."""
        if self.stop_call is None:
            return Reply.line(404, "this dashboard stops no containers")
        if container_name_problem(name) or not host or len(host) > 255 or not host.isprintable():
            return Reply.line(404, f"no container {excerpt(name)} on host {excerpt(host)}")
        from gpurig.flows.containerlife import NoSuchContainer

        stop_call = self.stop_call
        status, result, detail, done = _attempt(lambda: stop_call(host, name), NoSuchContainer, "refused")
        if status == 200:
            result = "stopped" if done.changed else "not running"
            detail = done.detail
        assert self.root is not None  # a Desk that allows actions has a project (checked when it was made)
        with self._lock:
            record_action(self.root, action_entry("stop", "", host, result, detail, client, container=name))
        self.stopped(host)
        if status != 200:
            return Reply.line(status, f"container {name} on {host} was not stopped: {detail}")
        return Reply.json({"host": host, "container": name, "result": result, "detail": detail})


def desk_for(opts: HostOptions, allow: bool, changed: Callable[[], None] = lambda: None,
             stopped: Callable[[str], None] = lambda host: None) -> Desk:
    """The desk of a dashboard over ``opts``' hosts: logs read, jobs cancelled and deployed containers stopped as the CLI does it."""
    from gpurig.flows.containerlife import stop_container
    from gpurig.flows.jobact import cancel_job, log_tail

    return Desk(lambda job, lines: log_tail(opts, job, lines), lambda job: cancel_job(opts, job), opts.settings.root, allow, changed,
                stop=lambda host, name: stop_container(opts, host, name), stopped=stopped)
