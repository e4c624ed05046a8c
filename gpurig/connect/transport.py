"""An authenticated paramiko transport to one SSHTarget: TCP or a jump host's channel, handshake with retry, host key, key login.

Keys are offered from the target's key files (parsed once per process), then
the agent, then ~/.ssh/id_* when no key file is set, as ssh does.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import paramiko
from paramiko.auth_handler import AuthHandler

from gpurig.connect.connection import AuthError, UnreachableError
from gpurig.connect.hostkeys import KnownHosts, fingerprint
from gpurig.connect.target import SSHTarget

if TYPE_CHECKING:
    from gpurig.connect.ssh import SSHSettings

# AES-GCM first (paramiko offers it last): an AEAD cipher is checked by OpenSSL with the decryption, where an
# -ctr cipher's HMAC is compared in Python byte by byte (paramiko's constant_time_bytes_eq), ~20% of a login's CPU.
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
_KEY_CACHE: dict[tuple[str, float], paramiko.PKey] = {}
_KEY_LOCK = threading.Lock()


class _Transport(paramiko.Transport):
    """paramiko's Transport without its deadlock at a rekey (paramiko issue 822).

    paramiko rekeys every 512 MB it sends, so a deploy moving an image meets
    one each half gigabyte. A channel close the server sent before it saw
    our KEXINIT makes paramiko's own thread answer with a message that it
    then waits to send until the key exchange ends, which only that thread
    can finish: 30 s later the connection dies ("Key-exchange timed out").
    Here what that thread would wait to send is held and sent right after
    the new keys (the protocol allows nothing else in between); every other
    thread still waits as paramiko has it.
    """

    def __init__(self, sock) -> None:
        super().__init__(sock)
        self._held: list = []
        self.userauth_asked = False  # the ssh-userauth service is asked for once (``_KeyLogin``)

    def _send_user_message(self, data) -> None:
        if threading.current_thread() is not self:
            super()._send_user_message(data)  # type: ignore[misc]  # paramiko's private API, absent from its stubs
            return
        with self.clear_to_send_lock:
            if self.clear_to_send.is_set():
                self._send_message(data)  # type: ignore[attr-defined]
            else:
                self._held.append(data)

    def _parse_newkeys(self, m) -> None:
        super()._parse_newkeys(m)  # type: ignore[misc]
        with self.clear_to_send_lock:
            held, self._held = self._held, []
            for data in held:
                self._send_message(data)  # type: ignore[attr-defined]

    def auth_publickey(self, username, key, event=None):
        """paramiko's key login, with the signed request sent right behind the service request (``_KeyLogin``)."""
        if not self.is_active() or not self.initial_kex_done:
            raise paramiko.SSHException("No existing session")
        done = event or threading.Event()
        self.auth_handler = _KeyLogin(self)
        self.auth_handler.auth_publickey(username, key, done)
        return [] if event is not None else self.auth_handler.wait_for_response(done)


class _KeyLogin(AuthHandler):
    """A key login one round trip shorter than paramiko's: the signed request does not wait for the service's accept.

    paramiko asks for the ssh-userauth service, waits for the server's
    accept, and only then sends the key, on every key it tries: a round trip
    each. A server handles a connection's messages in the order they come,
    and nothing in RFC 4253 makes a client wait for the accept, so here the
    signed request follows the service request at once (OpenSSH's sshd
    reads it right after sending the accept), and a key tried
    after a refused one goes without asking for the service again. A first
    RSA key still waits for the accept: its signature algorithm comes from
    the server's server-sig-algs, which arrives just before the accept and
    may not have been read yet.
    """

    _signed_sent = False

    def _request_auth(self) -> None:
        transport = cast(_Transport, self.transport)
        key = self.private_key
        assert key is not None  # auth_publickey set it
        asked, transport.userauth_asked = transport.userauth_asked, True
        # Decided before the service request goes out: the server's accept can arrive (on paramiko's thread) before the
        # next line here runs, and a handler that did not yet know would sign and send the key a second time; the
        # server's second refusal of it would then be read as the answer to the next key offered.
        self._signed_sent = asked or "rsa" not in key.get_name()
        if not asked:
            super()._request_auth()  # type: ignore[misc]  # paramiko's private API, absent from its stubs
        if self._signed_sent:
            accept = paramiko.Message()
            accept.add_string("ssh-userauth")
            accept.rewind()
            super()._parse_service_accept(accept)  # type: ignore[misc]  # builds, signs and sends the request

    def _parse_service_accept(self, m) -> None:
        if not self._signed_sent:  # an RSA key, waiting for the server's signature algorithms
            super()._parse_service_accept(m)  # type: ignore[misc]


def load_key(path: str) -> paramiko.PKey:
    """A private key from a file, parsed once per process (a fleet uses the same key a hundred times)."""
    try:
        stamp = (path, os.stat(path).st_mtime)
    except OSError as err:
        raise AuthError(f"cannot read key file {path}: {err.strerror}", "check ansible_ssh_private_key_file / IdentityFile") from None
    with _KEY_LOCK:
        if stamp in _KEY_CACHE:
            return _KEY_CACHE[stamp]
    try:
        key = paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        raise AuthError(f"key file {path} is encrypted", "load it into ssh-agent ('ssh-add KEY') so gpurig can use it") from None
    except (paramiko.SSHException, ValueError, OSError) as err:
        raise AuthError(f"cannot load key file {path}: {err}", "point ansible_ssh_private_key_file at an OpenSSH private key") from None
    with _KEY_LOCK:
        _KEY_CACHE[stamp] = key
    return key


def authenticate(transport: paramiko.Transport, target: SSHTarget, *, allow_agent: bool, look_for_keys: bool) -> None:
    """Offer the target's keys, then the agent's, then ~/.ssh/id_* (only when no key file is set), until one is taken."""
    tried: list[str] = []
    for label, key in _keys(target, allow_agent, look_for_keys):
        tried.append(label)
        try:
            transport.auth_publickey(target.user, key)
        except paramiko.BadAuthenticationType as err:
            raise AuthError(
                f"{target.hostname}:{target.port} does not accept public keys (allows {', '.join(err.allowed_types)})",
                "enable PubkeyAuthentication on the host", host=target.name) from None
        except paramiko.AuthenticationException:
            continue
        except (paramiko.SSHException, OSError, EOFError) as err:
            raise UnreachableError(f"connection dropped during login: {err}", "check the host's sshd logs", host=target.name) from None
        if transport.is_authenticated():
            return
    raise AuthError(
        f"authentication failed for {target.user}@{target.hostname}:{target.port}: "
        + (f"server refused {', '.join(tried)}" if tried else "no key to offer"),
        f"add the public key to ~{target.user}/.ssh/authorized_keys on the host, "
        "or set ansible_ssh_private_key_file / IdentityFile to the right key", host=target.name)


def _keys(target: SSHTarget, allow_agent: bool, look_for_keys: bool) -> Iterator[tuple[str, paramiko.PKey]]:
    for path in target.key_files:
        yield path, load_key(path)
    if allow_agent and os.environ.get("SSH_AUTH_SOCK"):
        try:
            agent_keys = paramiko.Agent().get_keys()
        except paramiko.SSHException:
            agent_keys = ()
        for key in agent_keys:
            yield f"agent key {fingerprint(key)}", key
    if look_for_keys and not target.key_files:
        for name in ("id_ed25519", "id_ecdsa", "id_rsa"):
            default = Path("~/.ssh").expanduser() / name
            if default.exists():
                try:
                    yield str(default), load_key(str(default))
                except AuthError:
                    continue  # an encrypted default key is skipped, as ssh does without a prompt


def open_transport(
    target: SSHTarget,
    via: paramiko.Transport | None,
    settings: SSHSettings,
    known_hosts: KnownHosts,
    stop: threading.Event,
    dialed: Callable[[str, int], socket.socket | None] | None = None,
) -> paramiko.Transport:
    """An authenticated transport to ``target`` (through ``via``, a jump host's transport, if given).

    Connecting is retried ``settings.connect_attempts`` times with exponential
    backoff (``stop`` cuts the wait short); the error names the first reason.
    ``dialed(hostname, port)``: a TCP connection begun earlier (EarlyLogins.dial), for the first attempt.
    """
    s = settings
    first = ""
    for attempt in range(max(1, s.connect_attempts)):
        if attempt:
            # Connect failures are retried with exponential backoff; commands never are.
            if stop.wait(s.retry_backoff_s * 2 ** (attempt - 1)):
                break
        sock = None
        transport = None
        try:
            sock = _socket(target, via, s, dialed)
            transport = _Transport(sock)
            transport.banner_timeout = s.connect_timeout
            transport.handshake_timeout = s.connect_timeout
            transport.auth_timeout = s.connect_timeout
            opts = transport.get_security_options()
            opts.ciphers = _first(AEAD_CIPHERS, opts.ciphers)
            known = known_hosts.known_types(target.known_hosts_name)
            if known:
                # Ask for the key type we have on record, as OpenSSH does, so a host
                # with several key types is not mistaken for one whose key changed.
                opts.key_types = _first(known, opts.key_types)
            transport.start_client(timeout=s.connect_timeout)
            if not transport.initial_kex_done:
                # start_client returns quietly at its timeout while the banner wait goes on.
                raise _ConnectFailure(f"no SSH handshake within {s.connect_timeout:g}s (is an SSH server listening there?)")
            break
        except _ConnectFailure as err:
            reason = err.reason
        except (OSError, EOFError, paramiko.SSHException) as err:
            reason = describe_connect_error(err, s.connect_timeout)
        # The first failure says what is wrong; later ones are often its echo (a reset after a timeout).
        first = first or reason
        if transport is not None:
            transport.close()
        elif sock is not None:
            sock.close()
    else:
        raise UnreachableError(
            f"cannot connect to {target.user}@{target.hostname}:{target.port}: {first}"
            + (f" (after {s.connect_attempts} attempts)" if s.connect_attempts > 1 else ""),
            "check the host is up, the address/port in the inventory, and any firewall or jump host", host=target.name)
    # Only a break on ``stop`` leaves no transport (or a closed one from the attempt before).
    if transport is None or (stop.is_set() and not transport.is_active()):
        raise UnreachableError("interrupted while connecting", "", host=target.name)
    try:
        known_hosts.check(target, transport.get_remote_server_key())
        authenticate(transport, target, allow_agent=s.allow_agent, look_for_keys=s.look_for_keys)
    except BaseException:
        transport.close()
        raise
    if s.keepalive_s:
        transport.set_keepalive(int(max(1, s.keepalive_s)))
    return transport


def _first(wanted: Sequence[str], offered: Sequence[str]) -> list[str]:
    """``offered`` (an algorithm list in preference order) with those of ``wanted`` it has moved to the front, in ``wanted``'s order."""
    return [a for a in wanted if a in offered] + [a for a in offered if a not in wanted]


def _socket(
    target: SSHTarget, via: paramiko.Transport | None, settings: SSHSettings, dialed: Callable[[str, int], socket.socket | None] | None
) -> socket.socket | paramiko.Channel:
    if via is not None:
        try:
            return via.open_channel("direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=settings.connect_timeout)
        except paramiko.ChannelException as err:
            raise _ConnectFailure(f"jump host could not reach it: {err.text or err}") from None
    # A connect begun earlier is taken once (its error raised as create_connection's would be); a retry connects anew.
    sock = (dialed and dialed(target.hostname, target.port)) or socket.create_connection((target.hostname, target.port), timeout=settings.connect_timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if settings.keepalive_s:
        # TCP keepalive notices a host that vanished without closing the connection.
        idle = int(max(1, settings.keepalive_s))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    return sock


class _ConnectFailure(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def describe_connect_error(err: BaseException, timeout: float) -> str:
    """One line saying why a connection attempt failed, in the user's terms."""
    if isinstance(err, ConnectionRefusedError):
        return "connection refused (nothing listening on that port)"
    if isinstance(err, socket.gaierror):
        return f"cannot resolve the host name ({err.strerror})"
    if isinstance(err, (socket.timeout, TimeoutError)):
        return f"no answer within {timeout:g}s (host down, or a firewall dropping packets?)"
    text = str(err) or type(err).__name__
    if "banner" in text.lower():
        # paramiko wraps what stopped the banner read; the cause tells a silent server from one that hung up.
        cause = err.__cause__ or err.__context__
        if isinstance(cause, (socket.timeout, TimeoutError)):
            return f"no SSH handshake within {timeout:g}s (is an SSH server listening there?)"
        return "the server closed the connection before saying it speaks SSH (not an SSH server, or sshd refused it: MaxStartups?)"
    if isinstance(err, EOFError) or "reset" in text.lower():
        return "the server closed the connection during the handshake"
    return text
