"""gpurig's key login (connect/transport.py ``_KeyLogin``): each key offered is signed and sent exactly once.

The server's accept of the ssh-userauth service arrives on paramiko's own thread, and on a loaded machine it can
arrive while the login is still sending the service request. A handler that did not yet know it sends the signature
itself also signed on the accept: the key went twice, and the server's second refusal of a wrong key was read as the
answer to the next key, so a login offering a refused key first failed while the server had accepted the second
(4 logins in 20 on a machine with two busy cores). Here the accept is handed over at the worst moment, every time.
"""

from __future__ import annotations

import paramiko
import pytest
from paramiko.common import cMSG_SERVICE_REQUEST, cMSG_USERAUTH_REQUEST

from gpurig.connect.transport import _KeyLogin


class RacingTransport:
    """Records what the login sends; the server's accept reaches the handler the moment the service request goes out."""

    def __init__(self) -> None:
        self.userauth_asked = False
        self.session_id = b"s" * 32
        self.server_extensions = {"server-sig-algs": b"ssh-ed25519,rsa-sha2-512,rsa-sha2-256"}
        self.preferred_pubkeys = ("ssh-ed25519", "rsa-sha2-512", "rsa-sha2-256")
        self.sent: list[bytes] = []
        self.handler: _KeyLogin | None = None

    def _send_message(self, m: paramiko.Message) -> None:
        kind = m.asbytes()[:1]
        self.sent.append(kind)
        if kind == cMSG_SERVICE_REQUEST and self.handler is not None:
            accept = paramiko.Message()
            accept.add_string("ssh-userauth")
            accept.rewind()
            self.handler._parse_service_accept(accept)  # as paramiko's thread would, before the sender's next line

    def _log(self, *args) -> None:
        pass


def offer(transport: RacingTransport, key: paramiko.PKey) -> list[bytes]:
    handler = _KeyLogin(transport)
    transport.handler = handler
    before = len(transport.sent)
    handler.auth_method, handler.username, handler.private_key = "publickey", "gpurig", key
    handler._request_auth()
    return transport.sent[before:]


@pytest.mark.parametrize("make", [lambda: paramiko.Ed25519Key.from_private_key(_ed25519()), lambda: paramiko.RSAKey.generate(1024)],
                         ids=["ed25519", "rsa"])
def test_the_first_key_is_signed_and_sent_once_even_when_the_accept_comes_at_once(make):
    transport = RacingTransport()
    sent = offer(transport, make())
    assert sent.count(cMSG_SERVICE_REQUEST) == 1
    assert sent.count(cMSG_USERAUTH_REQUEST) == 1


def test_a_key_after_a_refused_one_is_sent_once_without_a_second_service_request():
    transport = RacingTransport()
    offer(transport, paramiko.Ed25519Key.from_private_key(_ed25519()))
    second = offer(transport, paramiko.Ed25519Key.from_private_key(_ed25519()))
    assert second == [cMSG_USERAUTH_REQUEST]


def _ed25519():
    import io

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                     serialization.NoEncryption())
    return io.StringIO(pem.decode())
