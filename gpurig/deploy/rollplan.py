"""A rollout's plan and its memory: canary and batches, when to stop, and the state file a re-run resumes from.

Pure except for the state file. ``plan_batches`` splits the hosts as
Ansible's ``serial`` does (a canary batch first, then batches of a count or
a percentage of all hosts); ``should_stop`` is ``max_fail`` (how many hosts
may fail before the rest are left untouched). The state file
(``.gpurig/rollouts/<selection>-<variant>.json`` under the project) records
each host as it moves, atomically, so an interrupted rollout (Ctrl-C,
SIGTERM, a crash) knows on a re-run which hosts are done on the target
image id and, for one caught mid-change, which image id it ran before.
``verified_hosts`` answers for other tasks (promote): which hosts passed
verify on an image id.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpurig.errors import ConfigError
from gpurig.files import atomic_write, to_json
from gpurig.strict.reader import load_json
from gpurig.strict.yamlnode import Node

STATE_DIR = ".gpurig/rollouts"
STATE_SCHEMA = "gpurig.rollout-state/1"
# A host's state in the file: started (it may be mid-change: ``previous`` says what to roll back to), done (on the
# target, verify passed), rolled-back (verify failed: back on ``previous``), failed (deploy or rollback failed).
STARTED, DONE, ROLLED_BACK, FAILED = "started", "done", "rolled-back", "failed"
_BATCH = re.compile(r"^([0-9]{1,9})(%?)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
# What a host's entry holds as text: read back by a re-run, promote (gpurig/image/promote.py) and the table.
_TEXT_FIELDS = ("host", "state", "image_id", "image_ref", "verify", "level", "time", "reason", "tried")


def batch_size(text: str, total: int) -> int:
    """Hosts per batch from ``--batch``: a count (5) or a percentage of all the hosts (20%, rounded up, at least one)."""
    match = _BATCH.match(str(text).strip())
    value = int(match.group(1)) if match else 0
    if not match or value == 0 or (match.group(2) and value > 100):
        raise ConfigError(f"--batch {text!r} is not a host count or a percentage from 1% to 100%",
                          "give --batch a count (--batch 5) or a share of the hosts (--batch 20%)")
    if match.group(2):
        return max(1, math.ceil(total * value / 100))
    return value


def plan_batches(hosts: Sequence[str], canary: int, batch: str) -> list[list[str]]:
    """The hosts in the order they move: ``canary`` hosts alone first (none with 0), then batches of ``--batch``.

    The percentage is of every host given (Ansible's ``serial``), so the
    batches keep their size whatever the canary took.
    """
    if canary < 0:
        raise ConfigError(f"--canary {canary} is negative", "give --canary the number of hosts to try first (0: none)")
    size = batch_size(batch, len(hosts))
    order = list(hosts)
    batches = [order[:canary]] if canary and order else []
    rest = order[canary:]
    batches += [rest[i:i + size] for i in range(0, len(rest), size)]
    return batches


def should_stop(failures: int, max_fail: int) -> bool:
    """``--max-fail N``: N hosts may fail; one more and the batches not started yet are left untouched."""
    return failures > max_fail


def check_max_fail(max_fail: int) -> int:
    if max_fail < 0:
        raise ConfigError(f"--max-fail {max_fail} is negative", "give --max-fail how many hosts may fail (0: stop at the first)")
    return max_fail


def state_path(root: Path, selection: Sequence[str], variant: str) -> Path:
    """``<root>/.gpurig/rollouts/<selection>-<variant>.json``: one file per selection and variant, its name safe for any pattern."""
    chosen = "_".join(selection) or "all"
    name = _UNSAFE.sub("_", f"{chosen}-{variant}").strip("._") or "rollout"
    return Path(root) / STATE_DIR / f"{name}.json"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RolloutState:
    """The state file of one rollout: read once, then each host's entry written (whole file, atomically) as it changes."""

    def __init__(self, path: Path, doc: dict[str, Any]) -> None:
        self.path = path
        self.doc = doc
        self._lock = threading.Lock()  # hosts of a batch finish on the fleet's threads

    @classmethod
    def load(cls, path: Path, **meta: Any) -> RolloutState:
        """The file at ``path`` (its hosts kept), with this run's ``meta`` (target, level...) on top; a new one if absent."""
        doc: dict[str, Any] = {"schema": STATE_SCHEMA, "hosts": {}}
        found = read_state(path, "remove it to start the rollout afresh (hosts already moved are then moved again)")
        if found is not None:
            doc["hosts"] = found
        doc.update(meta)
        return cls(Path(path), doc)

    def entry(self, host: str) -> dict[str, Any]:
        return dict(self.doc["hosts"].get(host) or {})

    def done_on(self, host: str, image_id: str, ref: str = "") -> bool:
        """Whether ``host`` already runs the target with verify passed (a re-run skips it)."""
        return is_done(self.entry(host), image_id, ref)

    def previous(self, host: str) -> dict[str, str | None] | None:
        """What a host caught mid-change ran before it (container -> image id), to roll back to; None when not mid-change."""
        e = self.entry(host)
        return dict(e.get("previous") or {}) if e.get("state") == STARTED else None

    def record(self, host: str, **entry: Any) -> None:
        """Replace ``host``'s entry (with the time) and write the file, atomically."""
        with self._lock:
            self.doc["hosts"][host] = {"host": host, **entry, "time": now()}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, to_json(self.doc))


def verified_hosts(root: str | Path, image_id: str) -> list[dict[str, Any]]:
    """The hosts whose verify passed on ``image_id``, from every rollout's state under ``root`` (each entry as recorded)."""
    found: list[dict[str, Any]] = []
    for path in sorted((Path(root) / STATE_DIR).glob("*.json")):
        # A state gpurig cannot read hides proofs, so it stops the promotion rather than being passed over.
        hosts = read_state(path, "remove it (its hosts' proofs go with it) or restore it") or {}
        for e in hosts.values():
            if e.get("image_id") == image_id and e.get("verify") == "passed" and e.get("state") == DONE:
                found.append(e)
    return found


def read_state(path: str | Path, fix: str) -> dict[str, dict[str, Any]] | None:
    """A state file's hosts (host -> entry), each entry checked to be a mapping of the right fields; None when there is no file.

    Read by gpurig's bounded reader: a FIFO, a device or a huge file there is refused at once, and
    every wrong type is one line naming the file and the key.
    """
    doc = Node(f"the rollout state {path}", "", load_json(path, error=ConfigError, what="rollout state", fix=fix, missing_ok=True),
               ConfigError)
    if doc.value is None:
        return None
    fields = doc.of_type(dict, "a mapping with schema and hosts", fix)
    hosts = doc.child("hosts", fields.get("hosts", {})).of_type(dict, "a mapping of host names to entries", fix)
    node = doc.child("hosts", hosts)
    for name, entry in hosts.items():
        host = node.child(name, entry)
        host.of_type(dict, "a host's entry (a mapping)", fix)
        for key in _TEXT_FIELDS:
            host.child(key, entry.get(key)).of_type((str, type(None)), "text", fix)
        previous = host.child("previous", entry.get("previous"))
        for container, ran in (previous.of_type((dict, type(None)), "a mapping of container to image", fix) or {}).items():
            # what a rollback recreates the container on: a null, or an id that is not text, broke it mid-rollback
            image = previous.child(container, ran)
            image.of_type(dict, "the image it ran (a mapping)", fix)
            for key in ("image_id", "image_ref"):
                image.child(key, ran.get(key)).of_type((str, type(None)), "text", fix)
    return hosts


# --- what the table says ----------------------------------------------------------------------------------------------------


def batch_label(index: int, canary: int) -> str:
    return "canary" if canary and index == 0 else str(index if canary else index + 1)


# How a host's row reads: it would move (--check), was done earlier, was not reached, moved, or failed (and was rolled back).
WOULD, SKIPPED, NOT_REACHED, MOVED, NOT_MOVED = "would move", "skipped", "not reached", "moved", "not moved"


def host_row(host: str, batch: str, entry: dict[str, Any] | None, how: str, reason: str = "") -> list[str]:
    """[host, batch, runs, why] of one host: the image it runs now and why; ``reason`` is the fleet's for a host not moved."""
    e = entry or {}
    if how == WOULD:
        return [host, batch, "", "would move (check: nothing changed)"]
    if how == SKIPPED:
        return [host, batch, str(e.get("image_ref") or ""), "new image, verify passed earlier (skipped)"]
    if how == NOT_REACHED:
        return [host, batch, "unchanged", "not reached: rollout stopped"]
    if how == MOVED:
        return [host, batch, str(e.get("image_ref") or ""), "new image, verify passed"]
    runs = str(e.get("image_ref") or "unchanged") if e.get("state") in (ROLLED_BACK, FAILED) else "unchanged"
    why = reason if reason.startswith("rolled back") else f"failed: {reason}"
    if e.get("state") == STARTED:  # stopped mid-change (a crash in gpurig, a lost connection): the entry keeps what it ran
        why += "; a re-run rolls it back or moves it on"
    return [host, batch, runs, why]


def is_done(entry: dict[str, Any], image_id: str, ref: str = "") -> bool:
    """Done on the target: its image id (or, where only a registry has the image and its id is not known here, its reference)."""
    if entry.get("state") != DONE:
        return False
    return entry.get("image_id") == image_id if image_id else bool(ref) and entry.get("image_ref") == ref


def on_target(entries: Iterable[dict[str, Any]], image_id: str, ref: str = "") -> bool:
    """Whether every host's entry says it is done on the target (the exit code's question)."""
    listed = list(entries)
    return bool(listed) and all(is_done(e, image_id, ref) for e in listed)
