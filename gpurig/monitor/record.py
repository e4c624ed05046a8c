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


def load_run(directory: str | Path) -> Run:
    """The Run recorded in ``directory``; one clear error when there is none."""
    path = Path(directory) / SAMPLES
    if not path.is_file():
        raise MonitorError(f"no recorded run in {directory} ({SAMPLES} is missing)", "record one with 'invoke monitor --record DIR'")
    run = Run()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
                host = record.pop("host")
            except (ValueError, KeyError, AttributeError):
                continue  # a torn last line (the run was killed mid-write) or a foreign line
            if isinstance(host, str):
                run.add(host, record)
    if not run.hosts():
        raise MonitorError(f"{path} holds no samples", "record a run with 'invoke monitor --record DIR'")
    return run


def load_meta(directory: str | Path) -> dict[str, Any]:
    try:
        return json.loads((Path(directory) / META).read_text())
    except (OSError, ValueError):
        return {}
