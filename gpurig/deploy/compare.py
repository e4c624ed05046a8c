"""What to do with one container, as a ``Plan``: nothing, start it, create it, or replace it (with the settings that differ).

Pure apart from asking the engine what it has (``engine.container``,
``engine.image``): the plan's one ``Change`` is named by its action
(``start``, ``create``, ``recreate``), carries the settings that differ as
``(key, old, new)`` for the JSON report and as ``- key: old`` / ``+ key: new``
lines for --diff, and runs through the command objects ``apply`` gives it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpurig.connect.engine import ContainerInfo, Engine
from gpurig.deploy.fields import docker_size as size
from gpurig.steps.commands import Command
from gpurig.steps.plan import Change, Plan

if TYPE_CHECKING:
    from gpurig.deploy.apply import Target

NAME_LABEL = "io.gpurig.deploy.name"
HASH_LABEL = "io.gpurig.deploy.hash"
SETTINGS_LABEL = "io.gpurig.deploy.settings"
IMAGE_LABEL = "io.gpurig.deploy.image"
# A job's container (gpurig run): never deploy's to adopt, but the GPUs it holds are taken.
JOB_LABEL = "io.gpurig.job.id"
JOB_SHARE_LABEL = "io.gpurig.job.share"

Setting = tuple[str, Any, Any]  # (key, old, new); None: absent on that side


def plan(engine: Engine, t: Target, devices: tuple[str, ...] | None = (), commands: Callable[[str], tuple[Command, ...]] = lambda action: ()) -> Plan:
    """What to do with the container of target ``t``; ``commands(action)`` make the change when it is applied.

    ``devices`` are the GPUs it is to get (None: all): a count (gpus: 1) resolved to
    other GPUs than the container holds is a change, though its settings are not.
    """
    current = engine.container(t.spec.name)
    found = t.image or engine.image(t.image_ref)  # the build machine's image, else the host's (from a registry); asked once
    want_id = found.id if found else None
    if current is None:
        return _change("create", "not on the host", [masked(k, None, v) for k, v in sorted(t.spec.settings().items())], commands)
    same_config = current.labels.get(HASH_LABEL) == t.spec.config_hash()
    same_image = want_id is not None and current.image_id == want_id
    want_devices = ("all",) if devices is None else tuple(devices) or None
    same_devices = current.device_ids == want_devices
    if same_config and same_image and same_devices:
        if current.running:
            return Plan.ok("running with the same image and settings")
        return _change("start", f"{current.status}, same image and settings", [], commands)
    old = old_settings(current)
    new = t.spec.settings()
    diff = [masked(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if not same_image:
        diff.append(("image id", _short(current.image_id), _short(want_id) if want_id else "(to be pulled)"))
    if not same_devices:
        diff.append(("gpu devices", ",".join(current.device_ids or ()) or "none", ",".join(want_devices or ()) or "none"))
    return _change("recreate", "its image or settings differ", diff, commands)


def _change(action: str, why: str, diff: list[Setting], commands: Callable[[str], tuple[Command, ...]]) -> Plan:
    return Plan.change(why, Change(action, commands(action), diff_lines(diff), settings=tuple(diff)))


def diff_lines(diff: list[Setting]) -> str:
    """The settings that differ as a person reads them: ``- key: old`` and ``+ key: new`` lines."""
    lines = []
    for key, old, new in diff:
        if old is not None:
            lines.append(f"- {key}: {shown(key, old)}")
        if new is not None:
            lines.append(f"+ {key}: {shown(key, new)}")
    return "".join(line + "\n" for line in lines)


def shown(key: str, value) -> str:
    """A setting as a person writes it: sizes as 16g, lists and mappings as JSON."""
    if key in ("shm_size", "memory") and isinstance(value, int):
        return size(value)
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def masked(key: str, old, new) -> Setting:
    """A diff line fit for a report: env values (maybe secrets) by name only, never even their digests."""
    if key != "env":
        return key, old, new
    old, new = old or {}, new or {}
    before = ", ".join(sorted(old)) if old else None
    marks = [f"{n} (new)" if n not in old else f"{n} (changed)" if old[n] != new[n] else n for n in sorted(new)]
    marks += [f"{n} (removed)" for n in sorted(set(old) - set(new))]
    return key, before, ", ".join(marks) if marks else None


def old_settings(current: ContainerInfo) -> dict:
    try:
        old = json.loads(current.labels.get(SETTINGS_LABEL) or "{}")
    except ValueError:
        return {}
    return old if isinstance(old, dict) else {}


def _short(image_id: str) -> str:
    return image_id.split(":", 1)[-1][:12]
