"""A host passing layers to another: an SSH local forward on the pulling host to the serving host's loopback, for one run.

Made from the build machine, which holds a verified SSH connection to both hosts, so that the bytes go host to host
and never through the build machine's link:

- a one-time Ed25519 key, made here for this link alone;
- its public half appended to the serving host's authorized_keys (the first file sshd reads that its login user may
  write, from ``sshd -T``) by a script on a channel of its own that takes the line out again when the channel ends
  (closed by ``close``, by Ctrl-C's interrupt, or with the connection), restricted to this one forward: ``restrict,port-forwarding,permitopen="127.0.0.1:N",
  command="/bin/false"``, so the key opens no shell, no other port, no agent or X11;
- its private half sent to the pulling host on a channel's stdin to checks/peer_tunnel.py (never in a command line,
  a process list or a log), which runs ``ssh -N -L`` with the serving host's key pinned from the build machine's own
  verified connection (strict checking, no agent, no other identity);
- ``close`` (on every way out: the run's end, a failure, Ctrl-C) ends the tunnel by closing its channel (the script
  stops ssh and removes its folder) and takes the key's line out of authorized_keys.

No daemon.json change, nothing listening beyond each host's loopback, and no credential left behind.
"""

from __future__ import annotations

import json
import logging
import secrets
import shlex
from dataclasses import dataclass, field
from typing import Any

from gpurig.connect.connection import Connection
from gpurig.connect.launcher import embedded_line
from gpurig.errors import HostError, last_line
from gpurig.skeleton import shipped_text

log = logging.getLogger(__name__)

TUNNEL = "checks/peer_tunnel.py"
DEFAULT_KEY_FILES = ".ssh/authorized_keys .ssh/authorized_keys2"  # sshd's default when sshd -T cannot be asked
READY_TIMEOUT_S = 45


class PeerLinkError(HostError):
    """A link between two hosts that could not be made; the caller falls back to the build machine and says why."""


def one_time_key(comment: str) -> tuple[bytes, str]:
    """(private key in OpenSSH format, public key line "ssh-ed25519 AAAA... comment"), made now for one link."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} {comment}"


def restricted_line(public: str, target_port: int) -> str:
    """The authorized_keys line that lets ``public`` open one forward to the host's 127.0.0.1:``target_port`` and nothing else."""
    return f'restrict,port-forwarding,permitopen="127.0.0.1:{int(target_port)}",command="/bin/false" {public}'


def key_files(sshd_t: str, login: str) -> list[str]:
    """The authorized_keys files ``sshd -T`` says it reads for ``login`` (relative ones are under its home), %u and %% expanded."""
    for line in sshd_t.splitlines():
        name, _, value = line.strip().partition(" ")
        if name.lower() == "authorizedkeysfile":
            words = value.split()
            break
    else:
        words = DEFAULT_KEY_FILES.split()
    expanded = []
    for word in words:
        if word.lower() == "none":
            continue
        text = word.replace("%%", "\0").replace("%u", login).replace("%h", "~").replace("\0", "%")
        expanded.append(text[2:] if text.startswith("~/") else text)
    return expanded


# Hosts pulling from one serving host add and remove their lines at once: each change holds a lock (a folder: mkdir is
# atomic everywhere), and a missing file is created without truncating the one another link just made; a lock left by
# a killed script is broken after about 5 s.
_LOCK = r"""lock="${{TMPDIR:-/tmp}}/gpurig-keys-$(id -u).lock"
take() {{ i=0; until mkdir "$lock" 2>/dev/null; do i=$((i+1)); if [ $i -gt 100 ]; then rmdir "$lock" 2>/dev/null || true; i=0; fi; sleep 0.05; done; }}
give() {{ rmdir "$lock" 2>/dev/null || true; }}
"""
# Run as the serving host's login user: the first file it may write (made with 0600 where it is missing), the line appended.
_ADD = r"""set -eu
cd
umask 077
""" + _LOCK + r"""for f in {files}; do
  d=$(dirname -- "$f")
  if [ -e "$f" ]; then [ -w "$f" ] || continue; else mkdir -p -- "$d" 2>/dev/null && [ -w "$d" ] || continue; fi
  take
  : >> "$f"
  printf '%s\n' {line} >> "$f"
  give
  echo "$(cd -- "$d" && pwd)/$(basename -- "$f")"
  exit 0
done
exit 4
"""
# The line out again, the file kept (its inode, owner and mode): only the lines without the marker are written back.
_REMOVE = r"""set -u
""" + _LOCK + r"""f={path}
[ -f "$f" ] || exit 0
t=$(mktemp) || exit 1
take
grep -vF -- {marker} "$f" > "$t" || true
cat "$t" > "$f"
give
rm -f -- "$t"
"""


@dataclass
class PeerLink:
    """A made link: ``port`` on the pulling host's loopback reaches the serving host's 127.0.0.1:``target_port``."""

    server: Connection
    puller: Connection
    target_port: int
    port: int = 0
    key_file: str = ""  # the serving host's authorized_keys file holding the line
    marker: str = ""
    _stream: Any = field(default=None, repr=False)
    _guard: Any = field(default=None, repr=False)  # a channel on the serving host whose end takes the key's line out

    def close(self) -> None:
        """End the tunnel and take the key's line out; safe twice, and what cannot be undone is logged, not raised."""
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()  # stdin ends: peer_tunnel.py stops ssh and removes its folder
            except OSError as err:
                log.info("%s: closing the tunnel's channel: %s", self.puller.name, err)
        guard, self._guard = self._guard, None
        path, self.key_file = self.key_file, ""
        if guard is not None and end_guard(guard):
            return  # the guard took the line out
        if path:
            remove_key(self.server, path, self.marker)


def end_guard(guard: Any, wait_s: float = 15) -> bool:
    """End the guard's stdin and wait for it to exit (its removal done); False when it did not say so in time."""
    try:
        guard.settimeout(wait_s)
        guard.shutdown_write()
        while guard.recv(4096):
            pass
        return True
    except OSError as err:  # socket.timeout among them
        log.info("the one-time key's guard did not end: %s", err)
        return False
    finally:
        try:
            guard.close()
        except OSError:
            pass


def remove_key(server: Connection, path: str, marker: str) -> None:
    script = _REMOVE.format(path=shlex.quote(path), marker=shlex.quote(marker))
    try:
        result = server.run(f"sh -c {shlex.quote(script)}", warn=True, timeout=30)
        if result.exited != 0:
            log.warning("%s: the one-time key stays in %s: %s", server.name, path, last_line(result.stderr))
    except HostError as err:
        log.warning("%s: the one-time key stays in %s: %s", server.name, path, err)


def open_peer_link(server: Connection, puller: Connection, address: str, target_port: int, ssh_port: int = 22) -> PeerLink:
    """A tunnel from ``puller``'s loopback to ``server``'s 127.0.0.1:``target_port``, through ``server``'s sshd at ``address``:``ssh_port``
    as ``puller`` reaches it; PeerLinkError (nothing left behind) when it cannot be made, with why."""
    host_key = server.host_key()
    if host_key is None:
        raise PeerLinkError("the serving host is reached without SSH: it has no host key to pin", "", host=server.name)
    login = server.user or ""
    marker = f"gpurig-peer-{secrets.token_hex(8)}"
    private, public = one_time_key(marker)
    link = PeerLink(server, puller, target_port, marker=marker)
    try:
        link.key_file, link._guard = guarded_key(server, login, restricted_line(public, target_port), marker)
        source = shipped_text(TUNNEL)
        args = ["--address", address, "--ssh-port", str(ssh_port), "--login", login, "--target-port", str(target_port), "--host-key", host_key]
        opener = puller.stream_opener(embedded_line(source, "peer_tunnel.py", args))
        if opener is None:
            raise PeerLinkError("the pulling host is this machine: it needs no peer", "", host=puller.name)
        stream: Any = opener(READY_TIMEOUT_S)
        link._stream = stream
        stream.sendall(private)
        said = _first_line(stream)
        if said.get("event") != "ready":
            why = said.get("why") or "the tunnel script said nothing"
            raise PeerLinkError(f"cannot reach {server.name} at {address}:{ssh_port} over SSH: {why}", "", host=puller.name)
        link.port = int(said["port"])
        stream.settimeout(None)
        return link
    except BaseException:
        link.close()
        raise


def guarded_key(server: Connection, login: str, line: str, marker: str) -> tuple[str, Any]:
    """``add_key``, on a channel that stays open and takes the line out again when it ends, whoever ends it: (the file, the
    channel). After Ctrl-C the connection runs no new command (``remove_key`` cannot), but the interrupt closes its channels,
    which ends this one; and the line never exists without its channel. Where the host is this machine: ``add_key``, no channel."""
    files = _key_files_of(server, login)
    script = _GUARDED.format(files=" ".join(shlex.quote(f) for f in files), line=shlex.quote(line), marker=shlex.quote(marker))
    opener = server.stream_opener(f"sh -c {shlex.quote(script)}")
    if opener is None:
        return add_key(server, login, line), None
    guard: Any = opener(30)
    said = b""
    try:
        while not said.endswith(b"\n"):
            chunk = guard.recv(4096)
            if not chunk:
                break
            said += chunk
    except OSError:
        said = b""
    path = said.decode(errors="replace").strip()
    if not path.startswith("/"):
        end_guard(guard)
        raise PeerLinkError(f"sshd reads keys for {login} only from files it may not write ({', '.join(files) or 'none'})",
                            "", host=server.name)
    return path, guard


# Run as the serving host's login user on a channel of its own: _ADD, then wait for the channel's end (stdin closes), deaf
# to the hangup a lost connection may send, then the line out again as _REMOVE does.
_GUARDED = r"""set -u
trap '' HUP INT TERM PIPE
cd
umask 077
""" + _LOCK + r"""added=""
for f in {files}; do
  d=$(dirname -- "$f")
  if [ -e "$f" ]; then [ -w "$f" ] || continue; else mkdir -p -- "$d" 2>/dev/null && [ -w "$d" ] || continue; fi
  take
  : >> "$f"
  printf '%s\n' {line} >> "$f"
  give
  added="$(cd -- "$d" && pwd)/$(basename -- "$f")"
  break
done
[ -n "$added" ] || {{ echo none; exit 4; }}
echo "$added"
cat >/dev/null 2>&1
t=$(mktemp) || exit 1
take
grep -vF -- {marker} "$added" > "$t" || true
cat "$t" > "$added"
give
rm -f -- "$t"
"""


def _key_files_of(server: Connection, login: str) -> list[str]:
    spec = shlex.quote(f"user={login},host=gpurig-peer,addr=127.0.0.1")
    asked = server.admin(f'PATH="$PATH:/usr/sbin:/sbin" sshd -T -C {spec}', warn=True, timeout=30)  # root's to read; else the defaults
    return key_files(asked.stdout if asked.exited == 0 else "", login)


def add_key(server: Connection, login: str, line: str) -> str:
    """Append ``line`` to the first authorized_keys file sshd reads for ``login`` that it may write; that file's path."""
    files = _key_files_of(server, login)
    script = _ADD.format(files=" ".join(shlex.quote(f) for f in files), line=shlex.quote(line))
    result = server.run(f"sh -c {shlex.quote(script)}", warn=True, timeout=30)
    if result.exited != 0 or not result.stdout.strip():
        raise PeerLinkError(f"sshd reads keys for {login} only from files it may not write ({', '.join(files) or 'none'})",
                            "", host=server.name)
    return result.stdout.strip().splitlines()[-1]


def _first_line(stream: Any) -> dict[str, Any]:
    """The tunnel script's first JSON line (ready, or failed with why); a stream that ended says so."""
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = stream.recv(4096)
        except OSError as err:
            return {"event": "failed", "why": f"no answer from the tunnel script: {err or type(err).__name__}"}
        if not chunk:
            break
        data += chunk
    try:
        said = json.loads(data.decode(errors="replace").strip().splitlines()[0]) if data.strip() else {}
    except ValueError:
        said = {}
    if not said:
        stderr = ""
        recv_stderr = getattr(stream, "recv_stderr", None)
        if recv_stderr is not None and getattr(stream, "recv_stderr_ready", lambda: False)():
            stderr = recv_stderr(4096).decode(errors="replace")
        return {"event": "failed", "why": last_line(stderr) or "the tunnel script ended without a word (is python3 on the host?)"}
    return said
