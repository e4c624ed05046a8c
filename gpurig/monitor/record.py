"""A monitoring run kept on disk (--record DIR) as the agent's JSON lines, and read back for plots and diagnosis.

DIR/samples.jsonl holds every record as it arrives, each with its ``host``
(so a run cut short keeps what it saw; a torn last line is skipped on
reading). DIR/run.json says how the run went, written atomically at the end.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpurig.files import output_dir, write_report
from gpurig.monitor import MonitorError
from gpurig.monitor.session import Run
from gpurig.strict.reader import load_json, open_regular

SAMPLES = "samples.jsonl"
META = "run.json"


class Recorder:
    """A Run listener that appends each record to DIR/samples.jsonl."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = output_dir(directory, "--record")  # no other user's link on the way
        if os.path.lexists(self.dir / SAMPLES):  # a link there, dangling or not, is not ours to follow
            raise MonitorError(f"{self.dir} already holds a recorded run ({SAMPLES})", "record into a new directory, or remove the old run")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.dir / SAMPLES, "x", encoding="utf-8")
        except OSError as err:
            raise MonitorError(f"cannot record into {self.dir}: {err.strerror}", "choose a directory you can write") from None
        self._lock = threading.Lock()

    def __call__(self, host: str, record: Mapping[str, Any], sample: object = None) -> None:
        line = json.dumps({**record, "host": host}, separators=(",", ":"))
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line + "\n")
                self._fh.flush()

    def close(self, meta: Mapping[str, Any] | None = None) -> None:
        with self._lock:
            self._fh.close()
        write_report(self.dir / META, dict(meta or {}))


# A day of 1 s samples from a few 8-GPU hosts is a few hundred MiB; an agent record is a few KiB.
MAX_RUN_BYTES = 1024 * 2**20
MAX_LINE = 2**20


def load_run(directory: str | Path) -> Run:
    """The Run recorded in ``directory``: a regular file, bounded in size and line length; one clear error when there is none."""
    path = Path(directory) / SAMPLES
    fix = "record one with 'gpurig monitor --record DIR'"
    if not path.exists() and not path.is_symlink():
        raise MonitorError(f"no recorded run in {directory} ({SAMPLES} is missing)", fix)
    run = Run()
    with open_regular(path, error=MonitorError, what="recorded run", fix_missing=f"{fix} (--replay takes that DIR)",
                      limit=MAX_RUN_BYTES, kind=f"a directory holding {SAMPLES}") as fh:
        for number, raw in enumerate(iter(lambda: fh.readline(MAX_LINE + 1), b""), 1):
            if len(raw) > MAX_LINE:
                raise MonitorError(f"{path}: line {number} is over {MAX_LINE // 1024} KiB", f"{fix}; gpurig's own lines are a few KiB")
            record = _record(raw)
            if record is not None:
                run.add(record.pop("host"), record)
    if not run.hosts():
        raise MonitorError(f"{path} holds no samples", fix)
    return run


def _record(raw: bytes) -> dict[str, Any] | None:
    """One recorded line as a record with a host name; None for a torn last line (the run was killed mid-write) or a foreign line."""
    try:
        record = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None
    host = record.get("host") if isinstance(record, dict) else None
    if not isinstance(host, str) or not 0 < len(host) <= 255:  # any text: it is shown escaped, never obeyed
        return None
    return record


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number gpurig records")


def load_meta(directory: str | Path) -> dict[str, Any]:
    try:
        meta = load_json(Path(directory) / META, error=MonitorError, what="recorded run's", fix="record it again", limit=2**20)
    except MonitorError:
        return {}  # the samples are the run; a missing or foreign meta file only loses its labels
    return meta if isinstance(meta, dict) else {}
