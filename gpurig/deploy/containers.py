"""A host's ``gpurig_containers`` -> validated ``ContainerSpec``s, and each one's Engine API create body.

One entry per container (several per host: one per user, each on its own
GPUs, is the case this is built for); a host without ``gpurig_containers``
gets one container of the CLI's ``--variant``. Every field has a default per
variant (see ``inventory/hosts.yaml`` for a commented example), every
mistake is one ``InventoryError`` naming the inventory file, the host, the
key path, the rule and the fix. Across a host's containers, names and host
ports must be unique and GPU assignments must not overlap unless every
container sharing a GPU says ``share: true``; ``assign_gpus`` resolves
counts against the host's real GPUs.

``settings()`` is what deploy compares (its hash is a label on the
container) and what ``--diff`` shows: env values and SSH keys appear only as
hashes / fingerprints, so neither secrets nor long keys reach a report.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpurig.deploy import fields
from gpurig.deploy.fields import Gpus, Port, Ulimit, Volume
from gpurig.deploy.sharing import assign_gpus, check_together
from gpurig.errors import CompatError, InventoryError, SpecError, did_you_mean
from gpurig.image.spec import ImageSpec, MatrixEntry
from gpurig.inventory import Host
from gpurig.inventory.profile import HostProfile, host_profile
from gpurig.strict import validate
from gpurig.strict.yamlnode import Node

KEYS = ("name", "user", "variant", "torch", "cuda", "image", "gpus", "share", "ports", "volumes", "datasets", "env",
        "shm_size", "ipc", "ulimits", "cpus", "memory", "restart", "ssh_keys", "command", "idle_stop")
IPC_MODES = ("private", "shareable", "host")
DEFAULT_SHM = 16 * fields.GiB  # never Docker's 64 MB for a torch image (DataLoader workers pass tensors through it)
MIN_SHM, WARN_SHM = 64 * fields.MiB, fields.GiB
MIN_MEMORY = 6 * fields.MiB  # Docker refuses less
LABEL = "io.gpurig.deploy"
IDLE_STOP_LABEL = f"{LABEL}.idle_stop"  # seconds: the monitor stops the container once its GPUs sat idle that long
_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}")


@dataclass(frozen=True)
class ContainerSpec:
    """One container as deploy runs it. Built by ``load_containers``; every value already validated."""

    host: str
    name: str
    variant: str
    image: str  # the reference: spec.image_ref(entry, variant), or the entry's explicit image:
    entry: MatrixEntry | None  # None: an explicit image:
    user: str | None = None
    gpus: Gpus = fields.NO_GPUS
    share: bool = False
    ports: tuple[Port, ...] = ()
    volumes: tuple[Volume, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may hold secrets
    shm_size: int | None = DEFAULT_SHM  # None with ipc: host
    ipc: str = "private"
    ulimits: tuple[Ulimit, ...] = fields.DEFAULT_ULIMITS
    cpus: float | None = None
    memory: int | None = None
    restart: str = "unless-stopped"  # no | always | unless-stopped | on-failure[:N]
    ssh_keys: tuple[str, ...] = field(default=(), repr=False)
    cmd: tuple[str, ...] | None = None  # command: the image's CMD replaced (argv, no shell)
    idle_stop: int | None = None  # seconds its GPUs may sit idle (under 5%) before the monitor stops it; None: never

    @property
    def init(self) -> bool:
        """Docker's --init only for an explicit image: gpurig's images run tini as PID 1 themselves (two tinis warn)."""
        return self.entry is None

    @property
    def command(self) -> tuple[str, ...] | None:
        """The command given; else for slim, whose entrypoint serves an interactive bash that exits at once
        without a terminal, one that keeps it alive; else the image's own."""
        if self.cmd is not None:
            return self.cmd
        return ("sleep", "infinity") if self.variant == "slim" else None

    def settings(self) -> dict[str, Any]:
        """The canonical, JSON-able settings deploy compares and ``--diff`` shows; no env value or key in clear."""
        settings = {
            "command": list(self.command) if self.command else None,
            "cpus": self.cpus,
            "cuda": self.entry.cuda if self.entry else None,
            "env": {name: _digest(value) for name, value in self.env},
            "gpus": self.gpus.describe(),
            "image": self.image,
            "init": self.init,
            "ipc": self.ipc,
            "memory": self.memory,
            "name": self.name,
            "ports": sorted(str(p) for p in self.ports),
            "restart": self.restart,
            "share": self.share,
            "shm_size": self.shm_size,
            "ssh_keys": sorted(fields.fingerprint(k) for k in self.ssh_keys),
            "torch": self.entry.torch if self.entry else None,
            "ulimits": {u.name: [u.soft, u.hard] for u in sorted(self.ulimits, key=lambda u: u.name)},
            "user": self.user,
            "variant": self.variant,
            "volumes": [
                {"read_only": v.read_only, "source": v.source, "target": v.target}
                for v in sorted(self.volumes, key=lambda v: (v.target, v.source))
            ],
        }
        if self.idle_stop is not None:  # only when set: the hash of every container deployed without it stays as it was
            settings["idle_stop"] = self.idle_stop
        return dict(sorted(settings.items()))

    def config_hash(self) -> str:
        """A short sha256 of ``settings()``: equal exactly when the settings are."""
        text = json.dumps(self.settings(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def create_body(
        self, image_ref: str, device_ids: tuple[str, ...] | None = None, labels: Mapping[str, str] | None = None, *, deployed: bool = True
    ) -> dict[str, Any]:
        """The JSON body of ``POST /containers/create?name=<self.name>`` (Engine API v1.41+).

        ``device_ids``: what ``assign_gpus`` gave this container (None for gpus: all
        or none; an explicit id list is used as written when None). ``deployed``: it
        carries deploy's labels (a job's container does not: deploy never adopts it).
        """
        # ssh_keys are not here: deploy puts them at the image's secrets path (/run/secrets/authorized_keys) before start.
        env = [f"{name}={value}" for name, value in self.env]
        ours = {
            f"{LABEL}.hash": self.config_hash(),
            f"{LABEL}.name": self.name,
            f"{LABEL}.user": self.user or "",
            f"{LABEL}.variant": self.variant,
            f"{LABEL}.settings": json.dumps(self.settings(), sort_keys=True, separators=(",", ":")),
            **({IDLE_STOP_LABEL: str(self.idle_stop)} if self.idle_stop is not None else {}),
        } if deployed else {}
        bindings: dict[str, list[dict[str, str]]] = {}
        for port in sorted(self.ports, key=lambda p: (p.container, p.host, p.bind)):
            bindings.setdefault(f"{port.container}/tcp", []).append({"HostIp": port.bind, "HostPort": str(port.host)})
        host_config: dict[str, Any] = {
            "PortBindings": bindings,
            "Mounts": [
                {"Type": "bind", "Source": v.source, "Target": v.target, "ReadOnly": v.read_only} for v in self.volumes
            ],
            "IpcMode": self.ipc,
            "Ulimits": [{"Name": u.name, "Soft": u.soft, "Hard": u.hard} for u in self.ulimits],
            "RestartPolicy": _restart_policy(self.restart),
            "Init": self.init,
        }
        if self.shm_size is not None:
            host_config["ShmSize"] = self.shm_size
        if self.cpus is not None:
            host_config["NanoCpus"] = int(round(self.cpus * 1e9))
        if self.memory is not None:
            host_config["Memory"] = self.memory
        request = self._device_request(device_ids)
        if request:
            host_config["DeviceRequests"] = [request]
        body: dict[str, Any] = {
            "Image": image_ref,
            "Env": env,
            "Labels": {**{str(k): str(v) for k, v in (labels or {}).items()}, **ours},
            "ExposedPorts": {key: {} for key in bindings},
            "HostConfig": host_config,
        }
        if self.command:
            body["Cmd"] = list(self.command)
        return body

    def _device_request(self, device_ids: tuple[str, ...] | None) -> dict[str, Any] | None:
        request = {"Driver": "", "Count": 0, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}
        if self.gpus.none:
            if device_ids:
                raise ValueError(f"container {self.name} asks for no GPUs but was given devices {device_ids}")
            return None
        if device_ids is None and self.gpus.all:
            return {**request, "Count": -1}
        ids = device_ids if device_ids is not None else self.gpus.ids
        if not ids:
            raise ValueError(f"container {self.name}: resolve gpus: {self.gpus.count} with assign_gpus() first")
        return {**request, "DeviceIDs": [str(i) for i in ids]}


def _name_problem(value: str) -> str | None:
    return None if _NAME.fullmatch(value) else "is not a container name ([a-zA-Z0-9][a-zA-Z0-9_.-]*, at most 128)"


def _bare(text: str) -> str:
    """A version as written, escaped and cut like any excerpt but without the quotes around it."""
    return validate.excerpt(text).strip("'\"")


def _digest(value: str) -> str:
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _restart_policy(restart: str) -> dict[str, Any]:
    name, _, retries = restart.partition(":")
    return {"Name": name, "MaximumRetryCount": int(retries or 0)}


# --- reading one entry -------------------------------------------------------------


class _Entry:
    """Reads one container mapping into a ContainerSpec, collecting warnings.

    Without an image spec (``spec=None``) it checks every rule that needs none:
    keys, grammar, sizes, files; variants, matrix entries and what a variant
    runs are then left to deploy, which has the spec.
    """

    def __init__(self, node: Node, spec: ImageSpec | None, host: str, host_shm: int | None, base_dir: Path) -> None:
        self.node, self.spec, self.host, self.host_shm, self.base_dir = node, spec, host, host_shm, base_dir
        self.warnings: list[str] = []

    def read(self) -> ContainerSpec:
        keys = self.node.mapping(KEYS, required=("variant",))
        variant = self._variant(keys["variant"])
        user = keys["user"].text(validate.user_problem, "alice") if "user" in keys else None
        default_name = f"gpurig-{variant}-{user}" if user else f"gpurig-{variant}"
        name = keys["name"].text(_name_problem, "alice-jupyter") if "name" in keys else default_name
        entry, image = self._image(keys, variant)
        cpu = entry is not None and entry.is_cpu
        # without a spec, an unset gpus: is not known to be all of them (a cpu image gets none)
        gpus = fields.gpus(keys["gpus"]) if "gpus" in keys else (fields.NO_GPUS if cpu or not self.spec else fields.ALL_GPUS)
        if cpu and not gpus.none:
            raise keys["gpus"].fail(
                f"asks for GPUs, but the cpu image has no CUDA ({entry})", "remove gpus (or write gpus: none), or pick a CUDA entry with cuda:"
            )
        ports = fields.ports(keys["ports"]) if "ports" in keys else self._default_ports(variant)
        workspace = Volume(f"/srv/gpurig/{name}/workspace", "/workspace", False, create=True)
        volumes = fields.volumes(keys.get("volumes"), keys.get("datasets"), workspace)
        ipc = self._ipc(keys)
        shm = self._shm(keys, ipc, name)
        memory = fields.size(keys["memory"], "64g") if "memory" in keys else None
        if memory is not None and memory < MIN_MEMORY:
            raise keys["memory"].fail(f"{fields.docker_size(memory)} is below Docker's minimum of 6m", "write e.g. memory: 64g")
        if memory is not None and shm is not None and shm > memory:
            self.warn(name, f"shm_size {fields.docker_size(shm)} is above memory {fields.docker_size(memory)}: "
                      "/dev/shm counts against the limit, so the container is killed before it fills")
        if "idle_stop" in keys and gpus.none and ("gpus" in keys or cpu):  # without a spec, an unset gpus: is deploy's to decide
            raise keys["idle_stop"].fail("is set on a container without GPUs (their idleness decides the stop)", "give it gpus:, or remove idle_stop")
        ssh_keys = fields.ssh_keys(keys["ssh_keys"], self.base_dir) if "ssh_keys" in keys else ()
        kind = self.spec.variants[variant].kind if self.spec else None
        if kind and ssh_keys and not kind.ssh:
            raise keys["ssh_keys"].fail(f"the {variant} variant runs no sshd", "remove ssh_keys, or use variant: ssh or full")
        if kind and kind.ssh and not ssh_keys:
            self.warn(name, "no ssh_keys: nobody can log in to its sshd (keys only, no passwords)")
        env = fields.env(keys["env"]) if "env" in keys else ()
        if ssh_keys and any(n == "SSH_AUTHORIZED_KEYS" for n, _ in env):
            raise keys["env"].fail("sets SSH_AUTHORIZED_KEYS beside ssh_keys", "list the keys under ssh_keys only")
        return ContainerSpec(
            host=self.host, name=name, variant=variant, image=image, entry=entry, user=user, gpus=gpus,
            share=keys["share"].boolean("share: true") if "share" in keys else False,
            ports=ports, volumes=volumes, env=env, shm_size=shm, ipc=ipc,
            ulimits=fields.ulimits(keys["ulimits"]) if "ulimits" in keys else fields.DEFAULT_ULIMITS,
            cpus=self._cpus(keys["cpus"]) if "cpus" in keys else None,
            memory=memory,
            restart=fields.restart(keys["restart"]) if "restart" in keys else "unless-stopped",
            ssh_keys=ssh_keys,
            cmd=self._command(keys["command"]) if "command" in keys else None,
            idle_stop=keys["idle_stop"].duration("idle_stop: 4h") if "idle_stop" in keys else None,
        )

    def warn(self, name: str, text: str) -> None:
        self.warnings.append(f"host {self.host}: container {name}: {text}")

    def _variant(self, node: Node) -> str:
        value = node.value
        if self.spec is None:
            return node.text(lambda v: None, "jupyter")
        if not isinstance(value, str) or value not in self.spec.variants:
            raise node.fail(
                f"{validate.excerpt(value)} is not a variant of {self.spec.path}{did_you_mean(value, self.spec.variants)}",
                f"use one of {', '.join(self.spec.variants)}",
            )
        return value

    def _image(self, keys: dict[str, Node], variant: str) -> tuple[MatrixEntry | None, str]:
        if "image" in keys:
            for other in ("torch", "cuda"):
                if other in keys:
                    raise keys[other].fail("is set beside image:", "give either image: or torch:/cuda:, not both")
            return None, keys["image"].text(validate.image_ref_problem, "registry.example.com/ml/pytorch:2.14.1-cu130-slim")
        torch = keys["torch"].text(lambda v: None, "2.14.1") if "torch" in keys else None
        cuda = keys["cuda"].text(lambda v: None, "13.0") if "cuda" in keys else None
        if self.spec is None:
            return None, ""
        try:
            entry = self.spec.entry(torch, cuda)
        except CompatError as err:
            raise (keys.get("torch") or keys["cuda"]).fail(err.problem, err.fix) from None
        except SpecError as err:
            raise (keys.get("torch") or keys["cuda"]).fail(
                f"torch={_bare(torch) if torch else 'any'} cuda={_bare(cuda) if cuda else 'any'} "
                f"is not in the matrix of {self.spec.path}", err.fix) from None
        return entry, self.spec.image_ref(entry, variant)

    def _default_ports(self, variant: str) -> tuple[Port, ...]:
        if self.spec is None:
            return ()
        kind = self.spec.variants[variant].kind
        ports = []
        if kind.ssh:
            ports.append(Port(2222, 22, fields.default_bind(22)))
        if kind.jupyter:
            ports.append(Port(8888, 8888, fields.default_bind(8888)))
        return tuple(ports)

    def _ipc(self, keys: dict[str, Node]) -> str:
        if "ipc" not in keys:
            return "private"
        value = keys["ipc"].value
        if value not in IPC_MODES:
            raise keys["ipc"].fail(
                f"{validate.excerpt(value)} is not an IPC mode{did_you_mean(value, IPC_MODES)}", f"use one of {', '.join(IPC_MODES)}"
            )
        return value

    def _shm(self, keys: dict[str, Node], ipc: str, name: str) -> int | None:
        if ipc == "host":
            if "shm_size" in keys:
                raise keys["shm_size"].fail("is set with ipc: host, which uses the host's /dev/shm", "remove shm_size or ipc: host")
            return None
        shm = fields.size(keys["shm_size"], "16g") if "shm_size" in keys else self.host_shm or DEFAULT_SHM
        where = keys["shm_size"] if "shm_size" in keys else self.node
        if shm < MIN_SHM:
            raise where.fail(f"shm_size {fields.docker_size(shm)} is below Docker's 64m default, too small for PyTorch's DataLoader",
                             "write shm_size: 16g (or ipc: host)")
        if shm < WARN_SHM:
            self.warn(name, f"shm_size {fields.docker_size(shm)} is under 1g: "
                      "DataLoader workers may fail with 'No space left on device'")
        return shm

    def _command(self, node: Node) -> tuple[str, ...]:
        """An argv list, passed to the engine as is (no shell): ["python", "train.py", "--epochs", "3"]."""
        example = 'command: ["python", "/workspace/train.py"]'
        args = [item.value for item in node.items(example)]
        if not args or not all(isinstance(a, str) and "\0" not in a for a in args):
            raise node.fail("expected a non-empty list of strings (the argv, run without a shell)", f"write e.g. {example}")
        return tuple(args)

    def _cpus(self, node: Node) -> float:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.01 <= value <= 4096:
            raise node.fail(f"{validate.excerpt(value)} is not a number of CPUs", "write e.g. cpus: 8 or cpus: 1.5, unquoted")
        return float(value)


# --- a host's containers --------------------------------------------------------------


def check_containers(host: Host, source: str | Path = "inventory", profile: HostProfile | None = None) -> None:
    """Every rule of the host's ``gpurig_containers`` that needs no image spec, for tasks other than deploy.

    A misspelt key or a bad port is refused whatever the task (provision, facts,
    status...), not first by the deploy that comes after them.
    """
    if "gpurig_containers" in host.vars:
        profile = profile or host_profile(host, source)
        nodes = _entries(profile, source)
        readers = [_Entry(node, None, host.name, _host_shm(profile, source), Path(source).parent) for node in nodes]
        check_together([r.read() for r in readers], nodes)


def _entries(profile: HostProfile, source: str | Path) -> list[Node]:
    """The host's ``gpurig_containers`` entries as nodes whose errors name the inventory file, the host and the entry."""
    where = f"{source}: host {profile.host}"
    nodes = [Node(where, f"gpurig_containers[{i}]", dict(c), InventoryError) for i, c in enumerate(profile.containers)]
    if not nodes:
        raise InventoryError(f"{where}: gpurig_containers is empty", "list a container, or remove it to deploy --variant")
    return nodes


def _host_shm(profile: HostProfile, source: str | Path) -> int | None:
    """gpurig_shm_size in bytes: every container's default /dev/shm on this host (None: not set)."""
    shm = profile.shm_size
    return fields.size(Node(f"{source}: host {profile.host}", "gpurig_shm_size", shm, InventoryError), "16g") if shm else None


def load_containers(host: Host, image_spec: ImageSpec, *, variant: str | None = None, name: str | None = None,
                    source: str | Path = "inventory") -> tuple[list[ContainerSpec], list[str]]:
    """The containers ``host`` should run, validated together, and warnings to show.

    From ``gpurig_containers`` when the host has it (``variant`` / ``name``, when
    given, then choose among them); else one container of ``variant`` (named
    ``name`` when given). ``source`` is the inventory file: errors name it and
    relative ``ssh_keys`` files are read from its directory.
    """
    where = f"{source}: host {host.name}"
    profile = host_profile(host, source)
    host_shm = _host_shm(profile, source)
    base_dir = Path(source).parent
    if "gpurig_containers" in host.vars:
        nodes = _entries(profile, source)
    else:
        if variant is None:
            raise InventoryError(
                f"{where}: no gpurig_containers and no --variant", "pass --variant (e.g. --variant jupyter) or set gpurig_containers"
            )
        wanted: dict[str, Any] = {"variant": variant, **({"name": name} if name else {})}
        nodes = [Node(where, "", wanted, InventoryError)]  # errors read "host H: variant: ..."
    readers = [_Entry(node, image_spec, host.name, host_shm, base_dir) for node in nodes]
    specs = [r.read() for r in readers]
    check_together(specs, nodes)
    picked = [i for i, s in enumerate(specs) if variant in (None, s.variant) and name in (None, s.name)]
    if not picked:
        asked = " ".join(f"--{flag} {value}" for flag, value in (("variant", variant), ("name", name)) if value)
        listed = ", ".join(f"{s.name} ({s.variant})" for s in specs)
        raise InventoryError(f"{where}: no container in gpurig_containers matches {asked}", f"its containers are: {listed}")
    return [specs[i] for i in picked], [w for i in picked for w in readers[i].warnings]


__all__ = ["ContainerSpec", "assign_gpus", "check_containers", "check_together", "load_containers"]
