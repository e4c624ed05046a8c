"""Submitting a job on one host: read it, refuse what would fail, move the image it lacks, sync, hand the job to its agent.

``submit_job(conn, job)`` is the work the fleet runner calls for the host
``gpurig run`` selected. In order: facts and the engine (GPUs, driver, the
nvidia runtime, the image); pre-flight with deploy's own checks (a driver
too old for the image's CUDA, no nvidia runtime, a MIG-mode GPU given whole,
more GPUs asked for than the host has, no disk for the image); with
``--check`` it stops there and says what would be synced. Else the image is
delivered as deploy delivers it, the working directory synced (only what
changed) together with the job's bundle, and the agent makes the job and
starts its supervisor, which outlives this connection.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpurig.connect.connection import Connection
from gpurig.connect.engine import Engine
from gpurig.connect.engineinfo import ImageInfo
from gpurig.connect.engineopen import open_engine
from gpurig.deploy.containers import ContainerSpec
from gpurig.deploy.fields import NO_GPUS, Gpus
from gpurig.deploy.hoststate import HostState, check_fits_host, read_host
from gpurig.deploy.preflight import Planned, Refusal, check_disk, check_driver, check_mig, check_runtime
from gpurig.errors import HostError, counted
from gpurig.facts import Facts, gather_complete
from gpurig.jobs import request as jobspec
from gpurig.jobs.remote import AGENT, JOBS_ROOT, SAMPLER, JobAgent
from gpurig.jobs.sync import SyncPlan, SyncResult, plan_sync, sync
from gpurig.jobs.tree import Tree
from gpurig.skeleton import shipped_text

SAMPLE_INTERVAL_S = 2.0
# What submit_job is doing, as it tells ``phase``: before SUBMITTING no job exists on the host (what moved is the image and the
# synced tree, which the next run reuses); from SUBMITTING the agent may have made the job, its answer not read; SUBMITTED: it did.
READING, DELIVERING, SYNCING = "reading the host", "delivering the image", "syncing the working directory"
SUBMITTING, SUBMITTED = "submitting the job", "submitted"
STARTING = (READING, DELIVERING, SYNCING)


@dataclass(frozen=True)
class JobTarget:
    """The job as this machine resolved it for one host: its container (fresh) or the deployed one (exec), its image."""

    request: jobspec.RunRequest
    job: str  # the id
    key: str  # the host's sync folder
    tree: Tree
    container: ContainerSpec | None = None  # fresh-container mode
    image_ref: str = ""
    image: ImageInfo | None = None  # on the build machine (None: the host has it or pulls it)
    uid: int | None = None  # the image's user, who owns the job's folders
    cuda: bool = True  # whether the image is built for CUDA (the default GPU request follows it)
    matrix_cudas: tuple[str, ...] = ()
    deliver: Callable[[Engine, Connection, str], Any] | None = None  # (engine, conn, ref) -> Delivery
    # nodes -> (a FanOut, the deliver its nodes use instead) where several nodes of one job (Slurm's) pass the image on; or None
    fan_out: Callable[[Any], Any] | None = None
    check: bool = False
    say: Callable[[str], None] = lambda text: None


@dataclass(frozen=True)
class Submitted:
    """What ``run`` did on the host: the job (or, in check mode, what it would do)."""

    job: str
    state: str  # pending (submitted) | "" (check mode)
    gpus: Any  # the request, as the agent reads it
    plan: SyncPlan
    sync: SyncResult | None = None
    delivery: str = ""
    bytes_moved: int = 0
    supervisor: str = ""
    details: dict = field(default_factory=dict)


def submit_job(conn: Connection, t: JobTarget, phase: Callable[[str], None] = lambda step: None) -> Submitted:
    """The job on ``conn``'s host; ``phase(step)`` hears each step as it begins (READING ... SUBMITTED), so an interrupt can say
    whether the job may exist."""
    agent = JobAgent(conn)
    phase(READING)
    facts = gather_complete(conn)
    with open_engine(conn) as engine:
        request = gpu_request(t, facts, conn.name)
        exec_target = engine.container(t.request.container) if t.request.container else None
        if t.request.container and exec_target is None:
            raise HostError(f"there is no container {t.request.container} on the host", "deploy it first (gpurig deploy), or run in a fresh one (--variant)",
                            host=conn.name)
        refuse(conn, engine, t, facts, request)
        if t.check:  # what a sync would move, read without making the host's folder
            return Submitted(t.job, "", jobspec.gpu_request(request), plan_sync(t.tree, agent.manifest(t.key, create=False)))
        delivery, moved = "", 0
        if t.container is not None and engine.image(t.image_ref) is None:
            if t.deliver is None:
                raise HostError(f"{t.image_ref} is not on the host", "build it here, or push it to the spec's registry", host=conn.name)
            phase(DELIVERING)
            done = t.deliver(engine, conn, t.image_ref)
            delivery, moved = done.method, done.bytes_moved
        uid = t.uid if t.container is not None else user_of(exec_target.raw if exec_target else {})
    document = job_document(t, facts, request, uid, exec_target)
    bundle = {"job.json": json.dumps(document).encode(), "job_agent.py": shipped_text(AGENT).encode(),
              "gpu_sampler.py": shipped_text(SAMPLER).encode()}
    phase(SYNCING)
    t.say(f"syncing {t.request.workdir} ({counted(len(t.tree.entries), 'entry', 'entries')})")
    synced = sync(agent, t.key, t.tree, job=t.job, job_files=bundle)
    phase(SUBMITTING)
    said = agent.submit(t.key, t.job)
    phase(SUBMITTED)
    return Submitted(t.job, str(said.get("state") or "pending"), document["gpus"], synced.plan, synced, delivery, moved,
                     str(said.get("supervisor") or ""), {"work": said.get("work")})


def gpu_request(t: JobTarget, facts: Facts, host_name: str):
    """The GPUs the job asks for, checked against the host's: a default of one GPU for a CUDA image on a GPU host."""
    asked = t.request.gpus
    host = [g.index for g in facts.gpus]
    if t.request.container:
        if asked is not None:
            raise HostError("--gpus is set with --container: the job runs on the GPUs that container holds",
                            "drop --gpus, or run the job in a fresh container (--variant / --image)", host=host_name)
        return NO_GPUS
    if asked is None:
        return Gpus(count=1) if t.cuda and host else NO_GPUS
    if asked.none:
        return asked
    if not host:
        raise HostError(f"the job asks for GPUs ({jobspec.describe_gpus(asked)}), but the host has none with a driver loaded",
                        "run it on a GPU host, or give --gpus none", host=host_name)
    if asked.count and asked.count > len(host):
        raise HostError(f"the job asks for {counted(asked.count, 'GPU')}; the host has {len(host)}",
                        f"ask for at most {len(host)} (--gpus {len(host)}), or pick a bigger host", host=host_name)
    uuids = {g.uuid.lower(): g.index for g in facts.gpus}
    for device in asked.ids:
        index = uuids.get(device.lower()) if device.startswith("GPU-") else int(device)
        if index not in host:
            listed = ", ".join(f"{g.index} ({g.uuid})" for g in facts.gpus)
            raise HostError(f"the job asks for GPU {device}, which the host does not have", f"use one of its GPUs: {listed}", host=host_name)
    return asked


def refuse(conn: Connection, engine: Engine, t: JobTarget, facts: Facts, request, runtime: bool = True) -> None:
    """Pre-flight on ``conn``'s host (``run``'s, or each node of a Slurm job's): every refusal in one HostError, with its fix.

    ``runtime``: GPUs need NVIDIA's runtime (a Slurm job's script passes the device files where there is none).
    """
    refusals = preflight(engine, t, facts, request, read_host(conn, [v.source for v in t.container.volumes]) if t.container else None, runtime)
    if refusals:
        raise HostError("; ".join(r.problem for r in refusals), "; ".join(r.fix for r in refusals), host=conn.name)


def preflight(engine: Engine, t: JobTarget, facts: Facts, request, state: HostState | None, runtime: bool = True) -> list[Refusal]:
    """Deploy's checks for the job's container: driver vs the image's CUDA, the nvidia runtime, MIG, dockerd's limits,
    the datasets it mounts, the disk for the image."""
    if t.container is None or state is None:
        return []
    info = engine.info()
    on_host = engine.image(t.image_ref)
    planned = Planned(t.container.name, t.image_ref, t.image or on_host, not request.none, ())
    refusals = check_driver(planned, facts, t.matrix_cudas) + (check_runtime([planned], info) if runtime else [])
    refusals += check_fits_host(t.container, state, info.cpus, by_flag=True)
    if request.all or request.ids:
        refusals += check_mig(planned.name, None if request.all else tuple(request.ids), facts)
    if on_host is None and t.image is not None:
        refusals += check_disk([planned], facts, info.root_dir)
    return refusals


def user_of(container: dict) -> int | None:
    """The numeric user a container runs as (its folders are handed to it), or None for root or a name."""
    user = str((container.get("Config") or {}).get("User") or "").split(":")[0]
    return int(user) if user.isdecimal() and int(user) != 0 else None


def job_document(t: JobTarget, facts: Facts, request, uid: int | None, exec_target) -> dict[str, Any]:
    """What the agent runs (job.json): the body or the exec, the GPU request, the limits, and the public ``meta``."""
    r = t.request
    gpus = jobspec.gpu_request(request)
    meta = {
        "name": r.name, "argv": list(r.argv), "mode": r.mode, "image": t.image_ref or (exec_target.image if exec_target else ""),
        "variant": r.variant, "container": r.container, "exec": bool(r.container), "gpus": gpus, "share": r.share,
        "artifacts": list(r.artifacts), "sync": t.key, "workdir": str(r.workdir), "client": socket.gethostname(),
        "user": os.environ.get("USER") or "", "retry": r.retry, "timeout": r.timeout, "keep": r.keep,
    }
    doc: dict[str, Any] = {
        "gpus": gpus, "share": r.share, "host_gpus": [[g.index, g.uuid] for g in facts.gpus], "retry": r.retry,
        "timeout": r.timeout, "grace": r.grace, "keep": r.keep, "sample_interval": SAMPLE_INTERVAL_S, "uid": uid, "meta": meta,
    }
    if r.container:
        doc["exec"] = {"container": r.container, "argv": list(r.argv), "env": [f"{k}={v}" for k, v in r.env]}
    else:
        assert t.container is not None
        doc["body"] = jobspec.create_body(t.container, t.image_ref, t.job, f"{JOBS_ROOT}/{t.job}/work", r.share)
    return doc
