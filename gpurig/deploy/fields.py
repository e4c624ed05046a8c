"""Readers for the fields of one ``gpurig_containers`` entry: ports, volumes, env, sizes, ulimits, GPUs, SSH keys.

Each reader takes the field's :class:`gpurig.strict.yamlnode.Node` and returns typed,
frozen values or raises the node's error (file, host, key path, rule, fix).
Paths and env values are kept exactly as written: deploy hands them to the
Engine API as JSON, never to a shell, so only what Docker itself cannot take
is refused (a relative path, a NUL byte). Env values may be secrets: no error
message here ever quotes one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from gpurig.errors import GpurigError, did_you_mean
from gpurig.strict import validate, yamlio
from gpurig.strict.yamlnode import Node

KiB, MiB, GiB = 1024, 1024**2, 1024**3


@dataclass(frozen=True)
class Port:
    """One published port: ``bind:host`` on the host -> ``container``/tcp."""

    host: int
    container: int
    bind: str  # an IPv4 or IPv6 literal, in its canonical form

    def __str__(self) -> str:
        bind = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"{bind}:{self.host}->{self.container}/tcp"

    def clashes(self, other: Port) -> bool:
        """Both cannot be bound at once: same host port on the same address, or one of them on every address."""
        if self.host != other.host:
            return False
        a, b = ipaddress.ip_address(self.bind), ipaddress.ip_address(other.bind)
        if a == b or "::" in (self.bind, other.bind):
            return True
        return (a.is_unspecified or b.is_unspecified) and a.version == b.version


@dataclass(frozen=True)
class Volume:
    """A bind mount. ``create``: deploy makes the source (the default workspace); otherwise it must exist."""

    source: str
    target: str
    read_only: bool = False
    create: bool = False


@dataclass(frozen=True)
class Ulimit:
    name: str
    soft: int
    hard: int


@dataclass(frozen=True)
class Gpus:
    """What a container asks for: every GPU, a count resolved later, explicit ids (indexes / GPU-UUIDs), or none."""

    all: bool = False
    count: int = 0
    ids: tuple[str, ...] = ()

    @property
    def none(self) -> bool:
        return not (self.all or self.count or self.ids)

    def describe(self) -> str | int | list[str]:
        return "all" if self.all else "none" if self.none else self.count if self.count else list(self.ids)


NO_GPUS = Gpus()
ALL_GPUS = Gpus(all=True)

# Docker's (moby's) ulimit names; NVIDIA's PyTorch containers run with memlock and stack raised.
ULIMIT_NAMES = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc",
                "rss", "rtprio", "rttime", "sigpending", "stack")
DEFAULT_ULIMITS = (Ulimit("memlock", -1, -1), Ulimit("stack", 67108864, 67108864))
RESTART_POLICIES = ("no", "always", "unless-stopped", "on-failure")
_RESTART_FIX = "use one of no, always, unless-stopped, on-failure or on-failure:3"
SSH_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                 "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")

_PORT_TEXT = re.compile(r"(?:(\[[0-9A-Fa-f:.]+\]|[0-9.]+):)?([0-9]{1,5}):([0-9]{1,5})")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# moby's units.RAMInBytes: binary multipliers, an optional i and b ("16g", "16GiB", "512m")
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?) ?([kKmMgGtTpP])?[iI]?[bB]?")
_GPU_UUID = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
MAX_ENV_VALUE = 32 * KiB
MAX_SIZE = 2**62  # an int64 for the Engine API, with room
_BIND_FIX = "write e.g. bind: 127.0.0.1 (or 0.0.0.0, ::1)"


def size(node: Node, example: str) -> int:
    """Bytes from a whole number of bytes or a Docker size string ("16g", "8GiB", "512m")."""
    value = node.value
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 < value < MAX_SIZE:
            raise node.fail(f"{validate.excerpt(value)} is not a size", f"write e.g. {example}")
        return value
    if not isinstance(value, str):
        raise node.fail("expected a size such as 16g or a number of bytes", f"write e.g. {example}")
    match = _SIZE.fullmatch(value)
    if not match:
        raise node.fail(f"{validate.excerpt(value)} is not a size (a number with k, m, g or t)", f"write e.g. {example}")
    unit = (match.group(2) or "b").lower()
    scale = {"b": 1, "k": KiB, "m": MiB, "g": GiB, "t": 1024**4, "p": 1024**5}[unit]
    # exact arithmetic: float('9' * 400) is inf, and int(inf) raises instead of saying the size is too large
    nbytes = int(Fraction(match.group(1)) * scale)
    if nbytes >= MAX_SIZE:
        raise node.fail(f"{validate.excerpt(value)} is more than any host has", f"write e.g. {example}")
    return nbytes


def docker_size(nbytes: int) -> str:
    """A size as gpurig_containers and Docker's flags write it ("64m", "16g"), exact: what ``size`` reads back.

    For errors and diffs about a size the user wrote; a count of bytes moved
    or stored is shown with ``gpurig.deploy.progress.human_size``.
    """
    for unit, scale in (("g", GiB), ("m", MiB), ("k", KiB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes} bytes"


def _bind(node: Node, value: object) -> str:
    if not isinstance(value, str) or "%" in value:
        raise node.fail(f"{validate.excerpt(value)} is not an IP address to bind to", _BIND_FIX)
    try:
        return str(ipaddress.ip_address(value.strip("[]") if value.startswith("[") else value))
    except ValueError:
        raise node.fail(f"{validate.excerpt(value)} is not an IPv4 or IPv6 address", _BIND_FIX) from None


def _port(node: Node, value: object) -> int:
    problem = validate.port_problem(value)
    if problem:
        raise node.fail(f"{validate.excerpt(value)} {problem}", "write a port number such as 8888, unquoted")
    return value  # type: ignore[return-value]


def default_bind(container_port: int) -> str:
    """Jupyter and everything else on loopback (reach it through an SSH tunnel); the key-only sshd on every address."""
    return "0.0.0.0" if container_port == 22 else "127.0.0.1"


def _port_text(node: Node, text: str) -> Port:
    match = _PORT_TEXT.fullmatch(text)
    if not match:
        raise node.fail(f"{validate.excerpt(text)} is not HOST:CONTAINER or BIND:HOST:CONTAINER", 'write e.g. "127.0.0.1:8888:8888"')
    container = _port(node, int(match.group(3)))
    bind = _bind(node, match.group(1)) if match.group(1) else default_bind(container)
    return Port(_port(node, int(match.group(2))), container, bind)


def _port_entry(node: Node) -> Port:
    value = node.value
    if isinstance(value, str):
        return _port_text(node, value)
    if isinstance(value, int) and not isinstance(value, bool):
        port = _port(node, value)
        return Port(port, port, default_bind(port))
    keys = node.mapping(("host", "container", "bind"), required=("container",))
    container = _port(keys["container"], keys["container"].value)
    host = _port(keys["host"], keys["host"].value) if "host" in keys else container
    bind = _bind(keys["bind"], keys["bind"].value) if "bind" in keys else default_bind(container)
    return Port(host, container, bind)


def ports(node: Node) -> tuple[Port, ...]:
    """A list (of {host, container, bind}, "[BIND:]HOST:CONTAINER" or PORT) or a mapping {HOST or "BIND:HOST": CONTAINER}."""
    found: list[Port] = []
    if isinstance(node.value, dict):
        entries = []
        for key, value in node.value.items():
            child = node.child(str(key), value)
            text = f"{key}:{value}" if isinstance(key, (int, str)) and not isinstance(key, bool) else None
            if text is None or not isinstance(value, int) or isinstance(value, bool):
                raise child.fail("expected HOST_PORT: CONTAINER_PORT", 'write e.g. ports: {8888: 8888, "0.0.0.0:2222": 22}')
            entries.append(_port_text(child, text))
    else:
        entries = [_port_entry(item) for item in node.items('{host: 8888, container: 8888, bind: 127.0.0.1}')]
    for port in entries:
        for other in found:
            if port.clashes(other):
                raise node.fail(f"{port} and {other} publish the same host port", "give each entry its own host port")
        found.append(port)
    return tuple(found)


def _path(node: Node, what: str) -> str:
    value = node.value
    if not isinstance(value, str) or not value:
        got = "nothing" if value in (None, "") else type(value).__name__
        raise node.fail(f"expected a path, got {got}", f"write an absolute {what} path such as /data/imagenet")
    if "\0" in value:
        raise node.fail("contains a NUL byte, which no path can hold", "remove it")
    if not value.startswith("/"):
        raise node.fail(f"{validate.excerpt(value)} is a relative path (Docker resolves it against nothing)",
                        f"write the absolute {what} path, starting with /")
    if len(value) > 4096:
        raise node.fail(f"a path of {len(value)} characters (Linux allows 4096)", "shorten it")
    return value


def _target(node: Node) -> str:
    """A mount point in the container, as Docker will resolve it: no '.' or '..' part, never the root itself."""
    target = _path(node, "container")
    parts = target.split("/")
    if any(part in (".", "..") for part in parts):
        raise node.fail(f"{validate.excerpt(target)} has a '.' or '..' part (Docker resolves it, maybe to /)",
                        "write the directory plainly, e.g. /workspace")
    if not any(parts):
        raise node.fail(f"{validate.excerpt(target)} mounts over the container's root /", "choose a directory such as /workspace")
    return target


def _mount_point(target: str) -> str:
    """``target`` as the container sees it: '/data//x/' and '/data/x' are one mount point."""
    return "/" + "/".join(part for part in target.split("/") if part)


def volumes(node: Node | None, datasets: Node | None, default: Volume) -> tuple[Volume, ...]:
    """``volumes`` (default: the workspace) plus each of ``datasets`` read-only under /datasets/<basename>."""
    found: list[Volume] = []
    if node is None:
        found.append(default)
    else:
        for item in node.items("{source: /data/me, target: /workspace}"):
            keys = item.mapping(("source", "target", "read_only"), required=("source", "target"))
            read_only = keys["read_only"].boolean("read_only: true") if "read_only" in keys else False
            found.append(Volume(_path(keys["source"], "host"), _target(keys["target"]), read_only))
    for item in datasets.items("/data/imagenet") if datasets is not None else ():
        source = _path(item, "host")
        name = source.rstrip("/").rsplit("/", 1)[-1]
        if name in ("", ".", ".."):
            raise item.fail(f"{validate.excerpt(source)} has no directory name to mount under /datasets", "name a directory: /data/imagenet")
        found.append(Volume(source, f"/datasets/{name}", True))
    seen: dict[str, Volume] = {}
    for volume in found:
        key = _mount_point(volume.target)
        if key in seen:
            where = node if node is not None else datasets
            raise where.fail(  # type: ignore[union-attr]
                f"{validate.excerpt(seen[key].source)} and {validate.excerpt(volume.source)} "
                f"both mount at {validate.excerpt(volume.target)}",
                "give each its own target (datasets mount at /datasets/<directory name>)",
            )
        seen[key] = volume
    return tuple(found)


def env(node: Node) -> tuple[tuple[str, str], ...]:
    """NAME: "value" pairs, sorted by name; values kept byte for byte and never quoted in an error."""
    if not isinstance(node.value, dict):
        raise node.fail("expected a mapping of NAME: value", 'write e.g. env: {HF_HOME: /workspace/hf}')
    pairs = []
    for name, value in node.value.items():
        if not validate.matches(_ENV_NAME, name):
            shown = validate.excerpt(name) if isinstance(name, str) else "a name that is not a string"
            raise node.fail(f"{shown} is not an environment variable name", "use letters, digits and '_', not a leading digit")
        child = node.child(name, value)
        if not isinstance(value, str):
            kind = "nothing (null)" if value is None else "a number" if isinstance(value, (int, float)) else "not text"
            raise child.fail(f"is {kind}, not a string", f'quote the value: {name}: "..." (an empty one is "")')
        if "\0" in value:
            raise child.fail("contains a NUL byte, which no environment value can hold", "remove it")
        if len(value) > MAX_ENV_VALUE:
            raise child.fail(f"is {len(value)} characters (at most {MAX_ENV_VALUE})", "mount a file instead")
        pairs.append((name, value))
    return tuple(sorted(pairs))


def ulimits(node: Node) -> tuple[Ulimit, ...]:
    """NAME: N (soft = hard) or NAME: {soft, hard}, -1 unlimited, merged over the defaults (memlock, stack)."""
    if not isinstance(node.value, dict):
        raise node.fail("expected a mapping of ulimit names", "write e.g. ulimits: {nofile: 65536, memlock: -1}")
    chosen = {u.name: u for u in DEFAULT_ULIMITS}
    for name, value in node.value.items():
        if name not in ULIMIT_NAMES:
            raise node.fail(
                f"{validate.excerpt(name)} is not a ulimit{did_you_mean(name, ULIMIT_NAMES)}", f"use one of {', '.join(ULIMIT_NAMES)}"
            )
        child = node.child(name, value)
        if isinstance(value, dict):
            keys = child.mapping(("soft", "hard"), required=("soft", "hard"))
            soft = keys["soft"].integer(-1, 2**62, "65536 (-1: unlimited)")
            hard = keys["hard"].integer(-1, 2**62, "65536 (-1: unlimited)")
        else:
            soft = hard = child.integer(-1, 2**62, "65536 (-1: unlimited)")
        if hard != -1 and (soft == -1 or soft > hard):
            raise child.fail(f"soft limit {soft} is above the hard limit {hard}", "make soft <= hard (-1 is unlimited)")
        chosen[name] = Ulimit(name, soft, hard)
    return tuple(chosen[name] for name in sorted(chosen))


def restart(node: Node) -> str:
    """no | always | unless-stopped | on-failure[:N]; YAML's bare ``no`` (read as false) means no."""
    value = node.value
    if value is False:
        return "no"
    if not isinstance(value, str):
        raise node.fail(f"expected a restart policy, got {validate.excerpt(value)}", _RESTART_FIX)
    name, _, retries = value.partition(":")
    count = validate.whole_number(retries, 999999) if retries else None
    if name not in RESTART_POLICIES or (retries and (name != "on-failure" or count is None)):
        raise node.fail(f"{validate.excerpt(value)} is not a restart policy{did_you_mean(value, RESTART_POLICIES)}", _RESTART_FIX)
    return f"{name}:{count}" if retries else name


def gpus(node: Node) -> Gpus:
    """all | none | a count | a list of device indexes and GPU-UUIDs."""
    value = node.value
    fix = "write gpus: all, gpus: none, a count such as gpus: 2, or device ids such as gpus: [0, 1]"
    if value in ("all", "none"):
        return ALL_GPUS if value == "all" else NO_GPUS
    if isinstance(value, int) and not isinstance(value, bool):
        return Gpus(count=node.integer(0, 1024, "2"))
    if not isinstance(value, list):
        raise node.fail(f"{validate.excerpt(value)} is not a GPU request", fix)
    ids: list[str] = []
    for item in node.items("0, 1"):
        if isinstance(item.value, int) and not isinstance(item.value, bool):
            device = str(item.integer(0, 1023, "0"))
        elif validate.matches(_GPU_UUID, item.value):
            device = item.value
        else:
            raise item.fail(f"{validate.excerpt(item.value)} is not a device index or GPU UUID",
                            "write an index such as 0 (unquoted) or GPU-<uuid> as nvidia-smi -L shows it")
        if device in ids:
            raise item.fail(f"device {device} is listed twice", "remove the duplicate")
        ids.append(device)
    return Gpus(ids=tuple(ids))


# --- SSH public keys --------------------------------------------------------------


def ssh_key_problem(line: str) -> str | None:
    """Why ``line`` is not one OpenSSH public key (TYPE BASE64 [comment]); None if it is."""
    if "PRIVATE KEY" in line or line.startswith("-----BEGIN"):
        return "is a private key (never give one to gpurig; give the .pub file)"
    if any(ord(ch) < 32 and ch != "\t" or ord(ch) == 127 for ch in line):
        return "contains a control character"
    parts = line.split(None, 2)
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        return f"is not a public key line '<type> AAAA... [comment]' (types: {', '.join(SSH_KEY_TYPES[:3])}, ...)"
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return "has a key that is not base64"
    length = int.from_bytes(blob[:4], "big")
    if blob[4 : 4 + length] != parts[0].encode():
        return f"has a key whose data is not a {parts[0]} key"
    return None


def fingerprint(line: str) -> str:
    """The key's SHA256 fingerprint as ssh-keygen -l prints it."""
    blob = base64.b64decode(line.split(None, 2)[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _key_line(node: Node, line: str) -> str:
    problem = ssh_key_problem(line.strip())
    if problem:  # never quoted: a line that is not a public key may be part of a private one
        raise node.fail(f"this line {problem}", "give public key lines (ssh-ed25519 AAAA... you@laptop) or a .pub file")
    return line.strip()


def _key_file(node: Node, path: str, base_dir: Path) -> list[str]:
    file = Path(path).expanduser()
    file = file if file.is_absolute() else base_dir / file
    try:
        text = yamlio.read_text(file, error=node.error, what="ssh_keys file", fix_missing="give a .pub file (relative: to the inventory)")
    except GpurigError as err:  # said with the inventory, the host and the key as written, not the resolved file alone
        raise node.fail(f"{validate.excerpt(path)}: {err.problem}", err.fix) from None
    if "PRIVATE KEY" in text:
        raise node.fail(f"{file} holds a private key", "give the .pub file (ssh-keygen -y -f KEY > KEY.pub makes one)")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise node.fail(f"{file} holds no public keys", "add key lines such as ssh-ed25519 AAAA... you@laptop")
    return [_key_line(Node(node.source, f"{node.path} ({file}, key {n})", ln, node.error), ln) for n, ln in enumerate(lines, 1)]


def ssh_keys(node: Node, base_dir: Path) -> tuple[str, ...]:
    """Public key lines, from lines and/or .pub files (relative to the inventory's directory); never a private key."""
    items = [node] if isinstance(node.value, str) else node.items("ssh-ed25519 AAAA... you@laptop")
    keys: list[str] = []
    for item in items:
        value = item.value
        if not isinstance(value, str) or not value.strip():
            raise item.fail("expected a public key line or a .pub file path", "write e.g. ssh_keys: [keys/alice.pub]")
        if "\n" in value.strip() or "PRIVATE KEY" in value or set(value.split()) & set(SSH_KEY_TYPES):
            found = [_key_line(item, ln) for ln in value.splitlines() if ln.strip()]
        else:
            if validate.path_problem(value):
                raise item.fail(f"{validate.excerpt(value)} {validate.path_problem(value)}", "give a .pub file path")
            found = _key_file(item, value, base_dir)
        keys.extend(k for k in found if k not in keys)
    return tuple(keys)
