"""Deploy on one host: read it, refuse what would fail, move the images it lacks, (re)create only what changed.

``deploy_host(conn, job)`` is the work the fleet runner calls per host. In
order: open the host's engine (over SSH), read facts, the engine's info, its
containers and the listening sockets; pre-flight every container (any refusal
leaves the host untouched); plan each container as ``ok`` (same image id, same
settings, running: not touched), ``start``, ``create`` or ``recreate`` (with
the old and new settings for ``--diff``); in check mode stop there; else move
the images, then replace and start the containers and collect their access
lines. A container that exits at start is reported with its exit code and its
last log lines.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpurig.connect.connection import Connection
from gpurig.connect.engine import Engine, EngineError, open_engine
from gpurig.connect.engineinfo import ContainerInfo, ImageInfo
from gpurig.deploy import access
from gpurig.deploy.hoststate import HostState, check_memlock, make_workspaces, read_host
from gpurig.deploy.preflight import Planned, Refusal, check_disk, check_driver, check_ports, check_runtime
from gpurig.errors import GpurigError
from gpurig.facts import gather

NAME_LABEL = "io.gpurig.deploy.name"
HASH_LABEL = "io.gpurig.deploy.hash"
SETTINGS_LABEL = "io.gpurig.deploy.settings"
IMAGE_LABEL = "io.gpurig.deploy.image"
SECRETS_DIR = "run/secrets"


@dataclass(frozen=True)
class Target:
    """One container of one host, resolved: its spec and the image it runs."""

    spec: Any  # gpurig.deploy.containers.ContainerSpec
    image_ref: str
    image: ImageInfo | None  # on the build machine; None when only a registry has it
    login: str = "gpurig"  # the image's user, for the ssh lines
    uid: int = 1000  # and its uid, which owns the workspace folders deploy makes


@dataclass(frozen=True)
class DeployJob:
    targets: dict[str, list[Target]]  # host name -> its containers
    assign_gpus: Callable  # (specs, host gpus [(index, uuid)]) -> {name: device ids | None}
    deliver: Callable  # (engine, conn, target, progress) -> Delivery
    matrix_cudas: tuple[str, ...] = ()
    check: bool = False
    settle_s: float = 3.0  # how long a container without a healthcheck must stay up to count as started
    health_s: float = 180.0  # how long a healthcheck may take to say healthy
    progress: Callable[[str, str], None] = lambda host, text: None
    show_token: bool = False  # Jupyter's token in the access lines (a person at a terminal, or --show-token)


@dataclass
class ContainerOutcome:
    name: str
    status: str = "ok"  # ok | changed | failed
    action: str = "none"  # none | create | recreate | start
    image: str = ""
    delivery: str = ""
    bytes_moved: int = 0
    diff: list = field(default_factory=list)  # [(key, old, new)]
    access: list = field(default_factory=list)  # lines for a person (may hold the Jupyter token: terminal only)
    reason: str = ""
    logs: str = ""  # the last log lines of a container that did not start
    exit_code: int | None = None

    def to_dict(self) -> dict:
        """The JSON report's view: no access lines (they carry the token)."""
        data = {k: v for k, v in self.__dict__.items() if k != "access"}
        data["diff"] = [{"key": k, "old": o, "new": n} for k, o, n in self.diff]
        return data


def deploy_host(conn: Connection, job: DeployJob) -> list[ContainerOutcome]:
    targets = job.targets[conn.name]
    with open_engine(conn) as engine:
        info = engine.info()
        facts = gather(conn)
        state = read_host(conn, [v.source for t in targets for v in t.spec.volumes if not v.create])
        ours = engine.containers(label=NAME_LABEL)
        refusals, devices = preflight(engine, targets, facts, info, state, ours, job)
        if refusals:
            return [refused(t, refusals) for t in targets]
        outcomes = [plan(engine, t, devices.get(t.spec.name, ())) for t in targets]
        if job.check:
            return outcomes
        moved: dict[str, Any] = {}
        for t, out in zip(targets, outcomes):
            if out.action == "none":  # untouched, and still worth saying how to reach it
                running = engine.container(t.spec.name)
                if running is not None:
                    out.access = access.lines(engine, conn, t.spec, running, t.login, job.show_token)
                continue
            try:
                if t.image_ref not in moved:
                    job.progress(conn.name, f"image {t.image_ref}")
                    moved[t.image_ref] = job.deliver(engine, conn, t, lambda text: job.progress(conn.name, text))
                d = moved[t.image_ref]
                out.delivery, out.bytes_moved = d.method, d.bytes_moved
                make_workspaces(conn, t)
                run_container(engine, conn, t, devices.get(t.spec.name), out, job)
            except GpurigError as err:
                out.status, out.reason = "failed", str(err)
        return outcomes


def refused(t: Target, refusals: list[Refusal]) -> ContainerOutcome:
    mine = [r for r in refusals if t.spec.name in r.container.split(", ")]
    reason = "; ".join(f"{r.problem} (fix: {r.fix})" for r in mine) or "not started: another container of this host was refused"
    return ContainerOutcome(t.spec.name, "failed", image=t.image_ref, reason=reason)


def preflight(engine: Engine, targets: list[Target], facts, info, state: HostState, ours, job: DeployJob):
    specs = [t.spec for t in targets]
    refusals: list[Refusal] = []
    devices: dict = {}
    names = {s.name for s in specs}
    held = {c.name: (c.device_ids or (), bool(_old_settings(c).get("share"))) for c in ours if c.name not in names and c.device_ids}
    current = {c.name: c.device_ids for c in ours if c.name in names and c.device_ids}
    try:
        devices = job.assign_gpus(specs, [(g.index, g.uuid) for g in facts.gpus], held=held, current=current)
    except GpurigError as err:
        refusals.append(Refusal(", ".join(s.name for s in specs if wants_gpus(s)) or ", ".join(s.name for s in specs), err.problem, err.fix))
    planned = [Planned(t.spec.name, t.image_ref, t.image, wants_gpus(t.spec), host_ports(t.spec)) for t in targets]
    for t in targets:
        other = engine.container(t.spec.name)
        if other is not None and NAME_LABEL not in other.labels:
            refusals.append(Refusal(t.spec.name, f"a container named {t.spec.name} exists and was not made by gpurig", "remove or rename it, or give this one another name in gpurig_containers"))
        for v in t.spec.volumes:
            if not v.create and not state.exists.get(v.source, True):
                refusals.append(Refusal(t.spec.name, f"the volume source {v.source!r} does not exist on the host", "create it there (datasets are mounted read-only, never made), or fix the path"))
        refusals += check_memlock(t.spec, state)
        if t.spec.cpus and info.cpus and t.spec.cpus > info.cpus:
            refusals.append(Refusal(t.spec.name, f"cpus: {t.spec.cpus:g} but the host has {info.cpus}", f"set cpus to at most {info.cpus}"))
    for p in planned:
        refusals += check_driver(p, facts, job.matrix_cudas)
    refusals += check_runtime(planned, info)
    refusals += check_ports(planned, state.listening, ours)
    to_move = [p for p in planned if p.image is not None and engine.image(p.image.id) is None]
    refusals += check_disk(to_move, facts, info.root_dir)
    return refusals, devices


def wants_gpus(spec) -> bool:
    return not spec.gpus.none


def host_ports(spec) -> tuple[tuple[str, int], ...]:
    return tuple((p.bind, p.host) for p in spec.ports)


def labels_for(t: Target) -> dict[str, str]:
    """Labels beside the spec's own (name, hash, settings): the image reference asked for, for `gpurig status`."""
    return {IMAGE_LABEL: t.image_ref}


def plan(engine: Engine, t: Target, devices: tuple[str, ...] | None = ()) -> ContainerOutcome:
    """What to do with this container: nothing, start it, create it, or replace it (with the settings that differ).

    ``devices`` are the GPUs it is to get (None: all): a count (gpus: 1) resolved to
    other GPUs than the container holds is a change, though its settings are not.
    """
    out = ContainerOutcome(t.spec.name, image=t.image_ref)
    current = engine.container(t.spec.name)
    want_id = t.image.id if t.image else (engine.image(t.image_ref).id if engine.image(t.image_ref) else None)
    if current is None:
        out.status, out.action = "changed", "create"
        out.diff = [_masked(k, None, v) for k, v in sorted(t.spec.settings().items())]
        return out
    same_config = current.labels.get(HASH_LABEL) == t.spec.config_hash()
    same_image = want_id is not None and current.image_id == want_id
    want_devices = ("all",) if devices is None else tuple(devices) or None
    same_devices = current.device_ids == want_devices
    if same_config and same_image and same_devices:
        if current.running:
            return out
        out.status, out.action = "changed", "start"
        return out
    out.status, out.action = "changed", "recreate"
    old = _old_settings(current)
    new = t.spec.settings()
    out.diff = [_masked(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if not same_image:
        out.diff.append(("image id", _short(current.image_id), _short(want_id) if want_id else "(to be pulled)"))
    if not same_devices:
        out.diff.append(("gpu devices", ",".join(current.device_ids or ()) or "none", ",".join(want_devices or ()) or "none"))
    return out


def _masked(key: str, old, new) -> tuple:
    """A diff line fit for a report: env values (maybe secrets) by name only, never even their digests."""
    if key != "env":
        return key, old, new
    old, new = old or {}, new or {}
    before = ", ".join(sorted(old)) if old else None
    marks = [f"{n} (new)" if n not in old else f"{n} (changed)" if old[n] != new[n] else n for n in sorted(new)]
    marks += [f"{n} (removed)" for n in sorted(set(old) - set(new))]
    return key, before, ", ".join(marks) if marks else None


def _old_settings(current: ContainerInfo) -> dict:
    try:
        old = json.loads(current.labels.get(SETTINGS_LABEL) or "{}")
    except ValueError:
        return {}
    return old if isinstance(old, dict) else {}


def _short(image_id: str) -> str:
    return image_id.split(":", 1)[-1][:12]


def run_container(engine: Engine, conn: Connection, t: Target, devices, out: ContainerOutcome, job: DeployJob) -> None:
    """Make the container real: replace the old one, create, put the public keys, start, wait until it is up."""
    name = t.spec.name
    if out.action == "start":
        engine.start(name)
    else:
        if out.action == "recreate":
            engine.remove(name)
        engine.create(t.spec.create_body(t.image_ref, devices, labels_for(t)), name)
        if t.spec.ssh_keys:
            engine.put_archive(name, "/", _keys_archive(t.spec.ssh_keys))
        engine.start(name)
    started, exited = wait_started(engine, name, job)
    if exited is not None or started.health == "unhealthy":
        out.status = "failed"
        out.exit_code = exited
        out.logs = tail_logs(engine, name)
        try:
            engine.stop(name, timeout=5)  # no restart loop: it stays exited, for `gpurig logs` and `status`
        except EngineError:
            pass
        what = f"exited with code {exited}" if exited is not None else "is unhealthy"
        out.reason = f"the container {what} at start; last log lines: {out.logs.strip()[-400:] or '(none)'}"
        return
    out.access = access.lines(engine, conn, t.spec, started, t.login, job.show_token)


def wait_started(engine: Engine, name: str, job: DeployJob) -> tuple[ContainerInfo, int | None]:
    """(the container, its exit code if it exited while starting).

    Up means healthy (with a healthcheck) or still running after the settle
    time. An exit counts even when the restart policy has already started it
    again: a container that restarts at once is a failed start, not a running one.
    """
    has_health = bool(((engine.container(name) or _gone(name)).raw.get("Config") or {}).get("Healthcheck"))
    if not has_health:
        code = engine.wait(name, job.settle_s)  # None: still running after the settle time: started
        info = engine.container(name) or _gone(name)
        return info, code if code is not None else _restarted(info)
    deadline = time.monotonic() + job.health_s
    while True:
        info = engine.container(name) or _gone(name)
        restarted = _restarted(info)
        if restarted is not None or not info.running:
            return info, restarted if restarted is not None else info.exit_code
        if info.health in ("healthy", "unhealthy") or time.monotonic() > deadline:
            return info, None
        time.sleep(0.5)  # polling the engine's health state with a deadline, not a synchronisation sleep


def _restarted(info: ContainerInfo) -> int | None:
    """The exit code behind a restart the policy made, or None when it has not restarted."""
    if int(info.raw.get("RestartCount") or 0) > 0 or (info.raw.get("State") or {}).get("Restarting"):
        return info.exit_code
    return None


def _gone(name: str):
    raise EngineError(f"container {name} disappeared while starting", "check `docker events` on the host; something removed it")


def tail_logs(engine: Engine, name: str, lines: int = 20) -> str:
    try:
        return engine.logs(name, tail=lines)
    except EngineError:
        return ""


def _keys_archive(keys) -> bytes:
    """A tar with /run/secrets/authorized_keys (0644: public keys), which the ssh image's entrypoint installs at start."""
    buf = io.BytesIO()
    content = ("\n".join(keys) + "\n").encode()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        d = tarfile.TarInfo(SECRETS_DIR)
        d.type, d.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(d)
        f = tarfile.TarInfo(f"{SECRETS_DIR}/authorized_keys")
        f.size, f.mode = len(content), 0o644
        tar.addfile(f, io.BytesIO(content))
    return buf.getvalue()
