"""A run as asked for (``RunRequest``, every flag checked before a host is contacted) and the job document the host's agent runs.

The job's container is deploy's: the same ``ContainerSpec`` (the host's
``gpurig_containers`` entry of that variant, else the variant's defaults),
so /dev/shm, ulimits, env, datasets, cpus and memory are what deploy would
give it. A job changes only what a run needs: its own name, the command,
no published ports, no restart, and its copy of the working directory as
/workspace (its cwd). GPUs are chosen by the host's agent when the job's
turn comes, so the body goes without DeviceRequests and the request beside it.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from gpurig.deploy import fields
from gpurig.deploy.compare import JOB_LABEL
from gpurig.deploy.compare import JOB_SHARE_LABEL as SHARE_LABEL
from gpurig.deploy.containers import ContainerSpec
from gpurig.deploy.fields import Gpus, Ulimit
from gpurig.errors import ConfigError
from gpurig.files import output_dir
from gpurig.strict import validate
from gpurig.strict.yamlnode import Node

WORKSPACE = "/workspace"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_RETRY = 100
MAX_KEEP = 10_000


@dataclass(frozen=True)
class RunRequest:
    """What ``gpurig run`` was asked, validated: the command, where it runs, on which GPUs, and for how long."""

    argv: tuple[str, ...]
    workdir: Path
    variant: str | None = None
    image: str | None = None
    container: str | None = None  # run in this deployed container (docker exec) instead of a fresh one
    gpus: Gpus | None = None  # None: one GPU for a CUDA image on a GPU host, else none
    share: bool = False
    name: str = ""
    artifacts: tuple[str, ...] = ()
    keep: int | None = 10
    retry: int = 0
    timeout: float | None = None
    grace: float = 10.0
    env: tuple[tuple[str, str], ...] = dataclasses.field(default=(), repr=False)
    ulimits: tuple[Ulimit, ...] = ()  # over the container's own (deploy's defaults or its gpurig_containers entry)
    shm_size: int | None = None  # None: the container's own

    @property
    def mode(self) -> str:
        return "exec" if self.container else "container"


def run_request(argv: tuple[str, ...], *, variant=None, image=None, container=None, gpus=None, share=False, workdir=None, name=None,
                artifacts=None, keep=10, retry=0, timeout=None, grace=10, env=None, ulimit=None, shm_size=None, wait=False, junit=None,
                into=None, cancel_on_interrupt=False) -> tuple[RunRequest, Path | None]:
    """``gpurig run``'s flags checked, in the order a person meets them, before a host is contacted: the request, and --into's folder."""
    if not argv:
        raise ConfigError("no command given", "gpurig run -l HOST -- python train.py --epochs 3")
    if any("\0" in a for a in argv):
        raise ConfigError("the command holds a NUL byte", "remove it: no process can receive one")
    if sum(bool(x) for x in (variant, image, container)) > 1:
        raise ConfigError("--variant, --image and --container each say where the job runs", "give one of them")
    if junit and not wait:
        raise ConfigError("--junit needs --wait (the result is known only at the end)", "add --wait")
    if cancel_on_interrupt and not wait:
        raise ConfigError("--cancel-on-interrupt needs --wait (without it, gpurig leaves as soon as the job is submitted)", "add --wait")
    # checked as given, before anything resolves it: resolving first followed another user's link unchecked
    chosen_into = output_dir(into, "--into") if into else None
    request = RunRequest(
        argv=argv, workdir=Path(workdir or ".").resolve(), variant=None if image or container else (variant or "slim"),
        image=image, container=container, gpus=gpus_flag(gpus), share=bool(share), name=job_name(argv, name),
        artifacts=artifact_flags(artifacts), keep=whole(keep, "--keep", 0, MAX_KEEP, "10"),
        retry=whole(retry, "--retry", 0, MAX_RETRY, "2"),
        timeout=duration(timeout, "--timeout") if timeout is not None else None,
        grace=float(whole(grace, "--grace", 0, 3600, "30")), env=env_flags(env),
        ulimits=ulimit_flags(ulimit), shm_size=shm_flag(shm_size),
    )
    return request, chosen_into


def new_job_id() -> str:
    """Eight hex digits, the first a letter: short to type (a unique prefix will do), random enough that two hosts never
    draw the same, and never all digits, which are Slurm's job ids (``gpurig run --scheduler slurm``)."""
    return "abcdef"[secrets.randbelow(6)] + secrets.token_hex(4)[1:]


def job_name(argv: tuple[str, ...], name: str | None) -> str:
    """The name shown in `gpurig jobs`: the flag, else the script's stem (python train.py -> train)."""
    if name:
        return check_name(name)
    words = [a for a in argv if not a.startswith("-")]
    script = next((w for w in words[1:] if w.endswith((".py", ".sh"))), words[0] if words else "job")
    stem = PurePosixPath(script).stem
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:64].lstrip("._-") or "job"


def check_name(name: str) -> str:
    if not validate.matches(_NAME, name):
        raise ConfigError(f"--name {validate.excerpt(name)} is not a job name", "use letters, digits, '.', '_' and '-' (at most 64), e.g. --name train-bert")
    return name


def gpus_flag(text: str | None) -> Gpus | None:
    """``--gpus``: a count, all, none, or device ids / GPU UUIDs separated by commas, ``device=0`` for one (docker run's spelling)."""
    if text is None:
        return None
    value: Any
    ids = str(text).startswith("device=")
    words = [w.strip() for w in str(text).removeprefix("device=").split(",")]
    numbers = [validate.whole_number(w) for w in words]  # bounded: a 5,000-digit "count" is not a number
    if str(text).strip() in ("all", "none"):
        value = str(text).strip()
    elif len(words) == 1 and numbers[0] is not None and not ids:
        value = numbers[0]
    else:
        value = [n if n is not None else w for n, w in zip(numbers, words)]
    if value == 0:
        return fields.NO_GPUS
    return fields.gpus(Node("--gpus", "", value, ConfigError))


def env_flags(items: list[str] | tuple[str, ...] | None) -> tuple[tuple[str, str], ...]:
    """``--env NAME=VALUE`` (repeatable); the value reaches the engine byte for byte (never a shell)."""
    found: list[tuple[str, str]] = []
    for item in items or ():
        name, sep, value = str(item).partition("=")
        if not sep or not validate.matches(_ENV_NAME, name):
            raise ConfigError(f"--env {validate.excerpt(item)} is not NAME=VALUE", "write e.g. --env WANDB_MODE=offline")
        if "\0" in value:
            raise ConfigError(f"--env {name}: the value holds a NUL byte", "remove it: no process can receive one")
        found.append((name, value))
    return tuple(found)


def artifact_flags(items: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``--artifacts PATH`` (repeatable): paths inside the working directory, never leaving it."""
    found: list[str] = []
    for item in items or ():
        text = str(item).strip()
        parts = PurePosixPath(text).parts
        if not text or text.startswith("/") or ".." in parts or "\0" in text or any(ord(c) < 32 for c in text):
            raise ConfigError(f"--artifacts {validate.excerpt(item)} is not a path inside the working directory",
                              "give a relative path such as checkpoints/ or results.json")
        found.append(str(PurePosixPath(text)))
    return tuple(dict.fromkeys(found))


def ulimit_flags(items: list[str] | tuple[str, ...] | None) -> tuple[Ulimit, ...]:
    """``--ulimit NAME=N`` or ``NAME=SOFT:HARD`` (repeatable, -1 unlimited), as docker run writes it; deploy's rules."""
    given: dict[str, Any] = {}
    for item in items or ():
        name, sep, value = str(item).partition("=")
        soft, _, hard = value.partition(":")
        numbers = [int(v) if v == "-1" else validate.whole_number(v) for v in ((soft, hard) if hard else (soft,))]
        if not sep or None in numbers:
            raise ConfigError(f"--ulimit {validate.excerpt(item)} is not NAME=N or NAME=SOFT:HARD",
                              "write e.g. --ulimit memlock=-1 or --ulimit nofile=1024:65536")
        given[name] = {"soft": numbers[0], "hard": numbers[1]} if len(numbers) == 2 else numbers[0]
    if not given:
        return ()
    chosen = fields.ulimits(Node("--ulimit", "", given, ConfigError))
    return tuple(u for u in chosen if u.name in given)


def shm_flag(value: str | None) -> int | None:
    """``--shm-size 16g``: the job's /dev/shm, deploy's grammar and floor (PyTorch's DataLoader needs more than Docker's 64m)."""
    if value is None:
        return None
    from gpurig.deploy.containers import MIN_SHM

    size = fields.size(Node("--shm-size", "", validate.whole_number(value) or value, ConfigError), "16g")
    if size < MIN_SHM:
        raise ConfigError(f"--shm-size {validate.excerpt(value)} is below Docker's 64m default, too small for PyTorch's DataLoader", "write --shm-size 16g")
    return size


def whole(value: Any, flag: str, low: int, high: int, example: str) -> int:
    number = validate.whole_number(str(value)) if value is not None else None
    if number is None or not low <= number <= high:
        raise ConfigError(f"{flag} {validate.excerpt(value)} is not a whole number from {low} to {high}", f"write e.g. {flag} {example}")
    return number


def duration(value: Any, flag: str) -> float:
    """A duration flag: seconds, or with a unit (90s, 30m, 2h, 1d)."""
    text = str(value).strip()
    match = re.fullmatch(r"(\d{1,9})([smhd]?)", text)
    if not match or int(match.group(1)) == 0:
        raise ConfigError(f"{flag} {validate.excerpt(value)} is not a duration", f"write e.g. {flag} 2h, {flag} 30m or {flag} 90 (seconds)")
    return float(int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)])


def job_container(template: ContainerSpec, job: str, request: RunRequest) -> ContainerSpec:
    """Deploy's container made a job's: its name, the command, no ports, no restart, no workspace of its own; --ulimit/--shm-size over it."""
    ulimits = {u.name: u for u in template.ulimits} | {u.name: u for u in request.ulimits}
    return dataclasses.replace(
        template, name=f"gpurig-job-{job}", cmd=request.argv, gpus=fields.NO_GPUS, share=request.share, ports=(), restart="no",
        volumes=tuple(v for v in template.volumes if not v.create and v.target != WORKSPACE), ssh_keys=(),
        ulimits=tuple(ulimits[n] for n in sorted(ulimits)), shm_size=request.shm_size or template.shm_size,
        env=(*template.env, *request.env),
    )


def create_body(spec: ContainerSpec, image_ref: str, job: str, work: str, share: bool) -> dict[str, Any]:
    """The engine's create body for the job's container: deploy's, with the job's labels, its copy as /workspace, its cwd there."""
    body = spec.create_body(image_ref, None, {JOB_LABEL: job, SHARE_LABEL: "true" if share else "false"}, deployed=False)
    host = body["HostConfig"]
    host["Mounts"] = [*host.get("Mounts", []), {"Type": "bind", "Source": work, "Target": WORKSPACE, "ReadOnly": False}]
    host["RestartPolicy"] = {"Name": "no", "MaximumRetryCount": 0}
    body["WorkingDir"] = WORKSPACE
    return body


def gpu_request(gpus: Gpus) -> dict[str, Any]:
    """The request as the agent reads it: {"all": true} | {"count": N} | {"ids": [...]} | {} (none)."""
    if gpus.all:
        return {"all": True}
    if gpus.count:
        return {"count": gpus.count}
    if gpus.ids:
        return {"ids": list(gpus.ids)}
    return {}


def describe_gpus(gpus: Gpus) -> str:
    return str(gpus.describe()) if not gpus.none else "none"
