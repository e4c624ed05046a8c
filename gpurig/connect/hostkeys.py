"""known_hosts and the host-key policies: strict, accept-new (recorded in the project's file), off.

The user's ~/.ssh/known_hosts is read, never written; the project's file
(beside the inventory) is read and, under accept-new, appended to. A key that
differs from a recorded one always stops the host, whatever the policy.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko

from gpurig.config import HOST_KEY_POLICIES
from gpurig.connect.connection import HostKeyError, quote
from gpurig.errors import HostError
from gpurig.files import atomic_write
from gpurig.strict.reader import read_text

if TYPE_CHECKING:
    from gpurig.connect.target import SSHTarget

log = logging.getLogger(__name__)
KNOWN_HOSTS_MAX_BYTES = 256 * 2**20  # a line is about 100 bytes: two million hosts, far past any fleet



def check_policy(policy: str) -> None:
    """Refuse a host-key policy that is not one of HOST_KEY_POLICIES."""
    if policy not in HOST_KEY_POLICIES:
        raise HostError(f"unknown host-key policy {policy!r}", f"use one of: {', '.join(HOST_KEY_POLICIES)}")


def fingerprint(key: paramiko.PKey) -> str:
    """SHA256 fingerprint written the way OpenSSH prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class KnownHosts:
    """The user's known_hosts (read only) and the project's (read, and written under accept-new).

    Writes are atomic (temp file + rename) and serialised both between threads
    (a lock) and between processes (flock on the directory, which survives the
    rename unlike a lock on the file itself).
    """

    def __init__(self, project: Path, user: Path | None, policy: str) -> None:
        check_policy(policy)
        self.project = Path(project)
        self.user = user
        self.policy = policy
        self._lock = threading.Lock()
        self._user_keys = load_host_keys(user) if user else KeyTable()
        self._project_keys = load_host_keys(self.project)

    def known_types(self, name: str) -> list[str]:
        """Key types on record for ``name`` (``host`` or ``[host]:port``), to ask the server for first."""
        return list(dict.fromkeys(k.get_name() for _, k in self._known(name)))

    def check(self, target: SSHTarget, key: paramiko.PKey) -> None:
        """Accept, record or refuse ``key`` for ``target`` according to the policy."""
        name = target.known_hosts_name
        with self._lock:
            known = self._known(name)
            if not known:
                # Another process may have recorded it since we loaded the file.
                self._project_keys = load_host_keys(self.project)
                known = self._known(name)
            if any(k == key for _, k in known):
                return
            if known:
                raise self._changed(target, key, known)
            if self.policy == "strict":
                raise HostKeyError(
                    f"host key for {name} is not in {self.project} or {self.user} "
                    f"(offered {key.get_name()} {fingerprint(key)}) and the policy is strict",
                    f"check the fingerprint with the host's owner, then run "
                    f"'ssh-keyscan -p {target.port} {target.hostname} >> {self.project}' or use --host-key-policy accept-new", host=target.name)
            if self.policy == "off":
                return
            self._record(name, key)

    def _known(self, name: str) -> list[tuple[Path | None, paramiko.PKey]]:
        found: list[tuple[Path | None, paramiko.PKey]] = []
        for path, keys in ((self.project, self._project_keys), (self.user, self._user_keys)):
            found.extend((path, k) for k in keys.lookup(name))
        return found

    def _changed(self, target: SSHTarget, key: paramiko.PKey, known: list[tuple[Path | None, paramiko.PKey]]) -> HostKeyError:
        recorded = ", ".join(f"{k.get_name()} {fingerprint(k)} in {p}" for p, k in known)
        files = sorted({str(p) for p, _ in known})
        removal = " and ".join(f"ssh-keygen -R {quote(target.known_hosts_name)} -f {quote(f)}" for f in files)
        return HostKeyError(
            f"HOST KEY CHANGED for {target.known_hosts_name}: offered {key.get_name()} "
            f"{fingerprint(key)}, recorded {recorded}; someone may be intercepting the connection",
            f"if the host was legitimately reinstalled, confirm the new fingerprint with its owner, "
            f"then run '{removal}' and connect again", host=target.name)

    def _record(self, name: str, key: paramiko.PKey) -> None:
        self.project.parent.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(self.project.parent, os.O_RDONLY)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
            try:
                current = self.project.read_text() if self.project.exists() else ""
            except OSError as err:
                raise HostError(f"cannot read {self.project}: {err.strerror}", "check its permissions") from None
            line = f"{name} {key.get_name()} {key.get_base64()}\n"
            if line not in current:
                if current and not current.endswith("\n"):
                    current += "\n"
                atomic_write(self.project, (current + line).encode())
            self._project_keys.add(name, key)
            log.info("recorded host key %s %s for %s in %s", key.get_name(), fingerprint(key), name, self.project)
        finally:
            fcntl.flock(dir_fd, fcntl.LOCK_UN)
            os.close(dir_fd)


def load_host_keys(path: Path | None) -> KeyTable:
    """A known_hosts file's keys (none when it does not exist); a damaged file is a one-line error."""
    keys = KeyTable()
    if path and Path(path).exists():
        # Bounded and regular files only: a FIFO or /dev/zero named as known_hosts is one line, not a hang.
        text = read_text(path, error=HostError, what="known_hosts file", fix_missing="", limit=KNOWN_HOSTS_MAX_BYTES,
                         kind="a known_hosts file", fix_large="prune it (ssh-keygen -R HOST) or split the fleet's projects")
        try:
            keys.load(text)
        except paramiko.hostkeys.InvalidHostKey as err:
            raise HostError(f"cannot read known_hosts file {path}: {err}", "fix or remove the damaged line") from None
    return keys


class KeyTable:
    """A known_hosts file's keys by host name, every key a line records for it, in file order.

    paramiko's HostKeys scans every line for each lookup, and for each line it
    loads: a project of 10,000 hosts spent seconds loading its known_hosts
    and milliseconds per host looking one up. Here a plain name is a dict
    entry; only hashed names (``|1|salt|hash``, which OpenSSH writes with
    HashKnownHosts) are tried one by one. Lines paramiko cannot read (an
    unknown key type, a marker) are skipped, as it skips them.
    """

    def __init__(self) -> None:
        self._plain: dict[str, list[paramiko.PKey]] = {}
        self._hashed: list[tuple[str, paramiko.PKey]] = []

    def load(self, text: str) -> None:
        """Add the keys of a known_hosts file's text."""
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
            except paramiko.SSHException:
                continue
            if entry is not None:
                for name in entry.hostnames:
                    self.add(name, entry.key)

    def add(self, name: str, key: paramiko.PKey) -> None:
        if name.startswith("|1|"):
            self._hashed.append((name, key))
        elif key not in (known := self._plain.setdefault(name, [])):
            known.append(key)

    def lookup(self, name: str) -> list[paramiko.PKey]:
        found = list(self._plain.get(name, ()))
        for hashed, key in self._hashed:
            if hmac.compare_digest(paramiko.HostKeys.hash_host(name, hashed), hashed) and key not in found:
                found.append(key)
        return found
