"""Deploy on one host: read it, refuse what would fail, move the images it lacks, (re)create only what changed.

``deploy_host(conn, job)`` is the work the fleet runner calls per host. In
order: open the host's engine (over SSH), read facts, the engine's info, its
containers and the listening sockets; pre-flight every container (any refusal
leaves the host untouched); plan each container as ``ok`` (same image id, same
settings, running: not touched), ``start``, ``create`` or ``recreate`` (with
the old and new settings for ``--diff``); in check mode stop there; else move
the images, then replace and start the containers and collect their access
lines. Plans and results are provision's ``Plan``/``StepResult`` (one per
container, its name as the step); a change's engine actions are ``Call``s
run by the same ``run_change``. A container that exits at start fails with
its exit code and its last log lines.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from gpurig.connect.connection import Connection
from gpurig.connect.engine import Engine, EngineError
from gpurig.connect.engineinfo import ContainerInfo, EngineInfo, ImageInfo
from gpurig.connect.engineopen import open_engine
from gpurig.deploy import access
from gpurig.deploy.compare import IMAGE_LABEL, JOB_LABEL, JOB_SHARE_LABEL, NAME_LABEL, old_settings, plan
from gpurig.deploy.hoststate import HostState, check_fits_host, make_workspaces, read_host
from gpurig.deploy.preflight import Planned, Refusal, check_disk, check_driver, check_mig, check_ports, check_runtime
from gpurig.errors import GpurigError, HostError
from gpurig.facts import Facts
from gpurig.facts import gather_complete as gather
from gpurig.status import Status
from gpurig.steps.commands import Call, Command, run_change
from gpurig.steps.plan import Plan, StepResult

if TYPE_CHECKING:
    from gpurig.deploy.containers import ContainerSpec
    from gpurig.deploy.delivery import Delivery

Devices = tuple[str, ...] | None  # a container's GPU device ids as assign_gpus gives them; None: every GPU
SECRETS_DIR = "run/secrets"


@dataclass(frozen=True)
class Target:
    """One container of one host, resolved: its spec and the image it runs."""

    spec: ContainerSpec
    image_ref: str
    image: ImageInfo | None  # on the build machine; None when only a registry has it
    login: str = "gpurig"  # the image's user, for the ssh lines
    uid: int = 1000  # and its uid, which owns the workspace folders deploy makes


@dataclass(frozen=True)
class DeployJob:
    targets: dict[str, list[Target]]  # host name -> its containers
    assign_gpus: Callable[..., dict[str, Devices]]  # deploy.sharing.assign_gpus: (specs, host gpus [(index, uuid)], held=, current=)
    deliver: Callable[[Engine, Connection, Target, Callable[[str], None]], Delivery]  # (engine, conn, target, progress)
    matrix_cudas: tuple[str, ...] = ()
    check: bool = False
    settle_s: float = 3.0  # how long a container without a healthcheck must stay up to count as started
    health_s: float = 180.0  # how long a healthcheck may take to say healthy
    progress: Callable[[str, str], None] = lambda host, text: None
    show_token: bool = False  # Jupyter's token in the access lines (a person at a terminal, or --show-token)
    serving: Callable[[str], Collection[str]] = lambda host: ()  # fleet delivery: the images a host serves to others (FanOut.serves)


def deploy_host(conn: Connection, job: DeployJob) -> list[StepResult]:
    """One ``StepResult`` per container (its step name): ok, changed (start, create, recreate) or failed."""
    targets = job.targets[conn.name]
    with open_engine(conn) as engine:
        info = engine.info()
        facts = gather(conn)
        state = read_host(conn, [v.source for t in targets for v in t.spec.volumes if not v.create])
        ours = engine.containers(label=NAME_LABEL)
        jobs = [c for c in engine.containers(label=JOB_LABEL) if c.running and c.device_ids]
        refusals, devices = preflight(engine, targets, facts, info, state, ours, job, jobs, host=conn.name)
        if refusals:
            return [refused(t, refusals) for t in targets]
        moved: dict[str, Delivery] = {}
        runs = [ContainerRun(engine, t, devices.get(t.spec.name), job, moved) for t in targets]
        plans = [plan(engine, run.target, devices.get(run.target.spec.name, ()), run.commands) for run in runs]
        if job.check:
            return [run.result(p) for run, p in zip(runs, plans)]
        results = []
        for run, p in zip(runs, plans):
            if p.status == Status.OK:  # untouched, and still worth saying how to reach it
                running = engine.container(run.target.spec.name)
                if running is not None:
                    run.access = access.lines(engine, conn, run.target.spec, running, run.target.login, job.show_token)
                results.append(run.result(p))
                continue
            change = p.changes[0]
            try:
                run_change(conn, f"{change.summary} {run.target.spec.name}", change.commands)
            except GpurigError as err:
                results.append(run.result(p, err))
                continue
            results.append(run.result(p))
        return results


class ContainerRun:
    """The engine actions that make one container real, as ``Call``s of its change; what they learn stays here for the report."""

    def __init__(self, engine: Engine, target: Target, devices: Devices, job: DeployJob, moved: dict[str, Delivery]) -> None:
        self.engine, self.target, self.devices, self.job, self.moved = engine, target, devices, job, moved
        self.delivery = ""
        self.delivery_note = ""  # why faster paths were not taken (e.g. no docker-registry here, with the fix)
        self.delivery_source = ""  # fan-out: the build machine, or the host whose layer cache it pulled from
        self.bytes_moved = 0
        self.access: list[str] = []  # lines for a person (may hold the Jupyter token: terminal only)
        self.logs = ""  # the last log lines of a container that did not start
        self.exit_code: int | None = None

    def commands(self, action: str) -> tuple[Command, ...]:
        name = self.target.spec.name
        start = Call(f"{action} {name}", lambda conn: run_container(self.engine, conn, self.target, self.devices, action, self, self.job))
        if action == "start":
            return (start,)
        return (Call(f"move {self.target.image_ref} to the host", self.deliver), start)

    def deliver(self, conn: Connection) -> None:
        t, job = self.target, self.job
        if t.image_ref not in self.moved:
            job.progress(conn.name, f"image {t.image_ref}")
            self.moved[t.image_ref] = job.deliver(self.engine, conn, t, lambda text: job.progress(conn.name, text))
        d = self.moved[t.image_ref]
        self.delivery, self.bytes_moved, self.delivery_note, self.delivery_source = d.method, d.bytes_moved, d.note, d.source
        make_workspaces(conn, t)

    def result(self, p: Plan, error: GpurigError | None = None) -> StepResult:
        details = {"image": self.target.image_ref, "delivery": self.delivery, "delivery_note": self.delivery_note,
                   "delivery_source": self.delivery_source, "bytes_moved": self.bytes_moved,
                   "logs": self.logs, "exit_code": self.exit_code, "access": tuple(self.access)}
        if error is not None:
            return StepResult(self.target.spec.name, Status.FAILED, error.problem, p.changes, fix=error.fix, details=details)
        return StepResult(self.target.spec.name, p.status, "", p.changes, details=details)


def refused(t: Target, refusals: list[Refusal]) -> StepResult:
    mine = [r for r in refusals if t.spec.name in r.container.split(", ")]
    if not mine:
        return StepResult(t.spec.name, Status.FAILED, "not started: another container of this host was refused",
                          details={"image": t.image_ref})
    return StepResult(t.spec.name, Status.FAILED, "; ".join(r.problem for r in mine), fix="; ".join(r.fix for r in mine),
                      details={"image": t.image_ref})


def container_doc(r: StepResult) -> dict[str, Any]:
    """A container in the JSON report: no access lines (they carry the token); env values are masked already."""
    change = r.changes[0] if r.changes else None
    d = r.details
    return {"name": r.step, "status": r.status, "action": change.summary if change else "none", "image": d.get("image", ""),
            "delivery": d.get("delivery", ""), "delivery_note": d.get("delivery_note", ""), "delivery_source": d.get("delivery_source", ""),
            "bytes_moved": d.get("bytes_moved", 0),
            "diff": [{"key": k, "old": o, "new": n} for k, o, n in (change.settings if change else ())],
            "reason": r.reason, "fix": r.fix, "logs": d.get("logs", ""), "exit_code": d.get("exit_code")}


def preflight(engine: Engine, targets: list[Target], facts: Facts, info: EngineInfo, state: HostState, ours: list[ContainerInfo],
              job: DeployJob, jobs: Sequence[ContainerInfo] = (), host: str = "") -> tuple[list[Refusal], dict[str, Devices]]:
    """Refusals, and each container's GPUs; ``jobs``: the running job containers (gpurig run), whose GPUs are held too;
    ``host``: its name (the images it serves to others are counted on its disk)."""
    specs = [t.spec for t in targets]
    refusals: list[Refusal] = []
    devices: dict[str, Devices] = {}
    names = {s.name for s in specs}
    held = {c.name: (c.device_ids or (), bool(old_settings(c).get("share"))) for c in ours if c.name not in names and c.device_ids}
    held.update({f"job {c.labels[JOB_LABEL]}": (c.device_ids or (), c.labels.get(JOB_SHARE_LABEL) == "true") for c in jobs})
    current = {c.name: c.device_ids for c in ours if c.name in names and c.device_ids}
    try:
        devices = job.assign_gpus(specs, [(g.index, g.uuid) for g in facts.gpus], held=held, current=current)
    except GpurigError as err:
        refusals.append(Refusal(", ".join(s.name for s in specs if wants_gpus(s)) or ", ".join(s.name for s in specs), err.problem, err.fix))
    planned = [Planned(t.spec.name, t.image_ref, t.image, wants_gpus(t.spec), host_ports(t.spec)) for t in targets]
    for t in targets:
        other = engine.container(t.spec.name)
        if other is not None and NAME_LABEL not in other.labels:
            refusals.append(Refusal(t.spec.name, f"a container named {t.spec.name} exists and was not made by gpurig",
                                    "remove or rename it, or give this one another name in gpurig_containers"))
        refusals += check_fits_host(t.spec, state, info.cpus)
    for p in planned:
        refusals += check_driver(p, facts, job.matrix_cudas)
        if p.wants_gpus and p.name in devices:
            refusals += check_mig(p.name, devices[p.name], facts)  # GPU ids mean what the user meant, not a MIG-mode GPU
    refusals += check_runtime(planned, info)
    refusals += check_ports(planned, state.listening, ours)
    to_move = [p for p in planned if p.image is not None and engine.image(p.image.id) is None]
    refusals += check_disk(to_move, facts, info.root_dir, job.serving(host), state.home)
    return refusals, devices


def wants_gpus(spec: ContainerSpec) -> bool:
    return not spec.gpus.none


def host_ports(spec: ContainerSpec) -> tuple[tuple[str, int], ...]:
    return tuple((p.bind, p.host) for p in spec.ports)


def labels_for(t: Target) -> dict[str, str]:
    """Labels beside the spec's own (name, hash, settings): the image reference asked for, for `gpurig status`."""
    return {IMAGE_LABEL: t.image_ref}


def run_container(engine: Engine, conn: Connection, t: Target, devices: Devices, action: str, out: ContainerRun, job: DeployJob) -> None:
    """Make the container real: replace the old one, create, put the public keys, start, wait until it is up."""
    name = t.spec.name
    if action == "start":
        engine.start(name)
    else:
        if action == "recreate":
            engine.remove(name)
        engine.create(t.spec.create_body(t.image_ref, devices, labels_for(t)), name)
        if t.spec.ssh_keys:
            engine.put_archive(name, "/", _keys_archive(t.spec.ssh_keys))
        engine.start(name)
    started, exited = wait_started(engine, name, job)
    if exited is not None or started.health == "unhealthy":
        out.exit_code = exited
        out.logs = tail_logs(engine, name)
        try:
            engine.stop(name, timeout=5)  # no restart loop: it stays exited, for `gpurig logs` and `status`
        except EngineError:
            pass
        what = f"exited with code {exited}" if exited is not None else "is unhealthy"
        raise HostError(f"the container {what} at start; last log lines: {out.logs.strip()[-400:] or '(none)'}",
                        f"see `gpurig logs -l {conn.name} {name}`; fix the container's settings or image and deploy again")
    out.access = access.lines(engine, conn, t.spec, started, t.login, job.show_token)


def wait_started(engine: Engine, name: str, job: DeployJob) -> tuple[ContainerInfo, int | None]:
    """(the container, its exit code if it exited while starting).

    Up means healthy (with a healthcheck) or still running after the settle
    time. An exit counts even when the restart policy has already started it
    again: a container that restarts at once is a failed start, not a running one.
    """
    has_health = bool(((engine.container(name) or _gone(name)).raw.get("Config") or {}).get("Healthcheck"))
    if not has_health:
        for _ in range(2):
            code = engine.wait(name, job.settle_s)  # None: still running after the settle time: started
            info = engine.container(name) or _gone(name)
            code = code if code is not None else _restarted(info)
            # a 0 after the policy restarted it may be the new run's (a start resets the engine's ExitCode), not the failed
            # one's: its next exit says how it ends (ci25 saw "exited with code 0" for an `exit 3`)
            if code != 0 or not int(info.raw.get("RestartCount") or 0):
                break
        return info, code
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


def _gone(name: str) -> NoReturn:
    raise EngineError(f"container {name} disappeared while starting", "check `docker events` on the host; something removed it")


def tail_logs(engine: Engine, name: str, lines: int = 20) -> str:
    try:
        return engine.logs(name, tail=lines)
    except EngineError:
        return ""


def _keys_archive(keys: Sequence[str]) -> bytes:
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
