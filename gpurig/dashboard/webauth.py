"""Who gets an answer from the dashboard: the token (as Jupyter's), its cookie, the Host check, the methods, the security headers.

Every request needs the token: once in the URL (``?token=``), which is
answered with an HttpOnly SameSite=Strict cookie and a redirect to the same
page without it (so it leaves the address bar and the history), then the
cookie; a script may send ``Authorization: Bearer TOKEN``. Anything else is
401 with an empty body. The Host header must name the address the server is
bound to (or, on loopback, localhost): a page of another site whose name
was rebound to 127.0.0.1 is refused even before the token is looked at.
Pure functions and one small class: the server asks, they decide.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, urlencode, urlsplit

from gpurig.dashboard import DashboardError

COOKIE = "gpurig_dashboard"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
# No inline script or style, nothing from another origin, no framing, no form posts, no <base> games.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the token in a first URL never travels on in a Referer
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
READ_METHODS = ("GET", "HEAD")


def new_token() -> str:
    """A fresh random token: 32 bytes, URL-safe (secrets.token_urlsafe)."""
    return secrets.token_urlsafe(32)


def bind_address(address: str, token: str | None) -> str:
    """The address to listen on, checked: an IP address or ``localhost``; one other machines reach only with a token in force."""
    text = (address or "").strip()
    if text == "localhost":
        return "127.0.0.1"
    try:
        ip = ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        raise DashboardError(f"--bind {text!r} is not an IP address", "give --bind an address of this machine, such as 127.0.0.1 or 10.0.0.5") from None
    if not ip.is_loopback and not token:
        raise DashboardError(f"--bind {text} would share the dashboard with the network without a token",
                             "keep the token (it is always made), or bind to 127.0.0.1")
    return str(ip)


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return address == "localhost"


def _host_form(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def allowed_hosts(address: str, port: int, names: Iterable[str] = ()) -> frozenset[str]:
    """The Host headers the server answers: its own address and port, localhost's names where it listens on loopback or on every
    address, and ``names`` (this machine's host names, which a colleague types) where it listens beyond loopback."""
    wildcard = address in ("0.0.0.0", "::")
    hosts = {_host_form(address)} if not wildcard else set()
    if wildcard or is_loopback(address):
        hosts.update(LOOPBACK_NAMES)
    if not is_loopback(address):
        hosts.update(n for n in names if n)
    return frozenset(f"{h.lower()}:{port}" for h in hosts)


@dataclass(frozen=True)
class Answer:
    """What the gate decided: serve (status None), or answer with ``status`` and an empty body; a cookie and redirect on the way in."""

    status: int | None = None
    set_cookie: str | None = None
    location: str | None = None


class Gate:
    """The token and the Host headers one server accepts."""

    def __init__(self, token: str, hosts: frozenset[str]) -> None:
        if not token:
            raise DashboardError("the dashboard needs a token", "this is a bug: the CLI always makes one")
        self._token = token.encode()
        self.hosts = hosts

    def matches(self, presented: str | None) -> bool:
        """Whether ``presented`` is the token, in constant time (hmac.compare_digest)."""
        if not presented:
            return False
        try:
            return hmac.compare_digest(presented.encode(), self._token)
        except UnicodeEncodeError:
            return False

    def cookie(self) -> str:
        return f"{COOKIE}={self._token.decode()}; HttpOnly; SameSite=Strict; Path=/"

    def admit(self, method: str, target: str, headers: Mapping[str, str]) -> Answer:
        """Decide one request from its method, its target (path and query) and its headers (names in any case)."""
        lower = {k.lower(): v for k, v in headers.items()}
        if (lower.get("host") or "").lower() not in self.hosts:
            return Answer(403)  # another name for this address: DNS rebinding, or a proxy it was not meant for
        url = urlsplit(target)
        query = parse_qsl(url.query, keep_blank_values=True)
        in_url = [v for k, v in query if k == "token"]
        if in_url:
            if len(in_url) != 1 or not self.matches(in_url[0]):
                return Answer(401)
            if method not in READ_METHODS:
                return Answer(405)
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            return Answer(303, set_cookie=self.cookie(), location=(url.path or "/") + (f"?{rest}" if rest else ""))
        if not (self.matches(_bearer(lower.get("authorization"))) or self.matches(_cookie(lower.get("cookie")))):
            return Answer(401)
        if method not in READ_METHODS:
            return Answer(405)  # read-only: actions come with --allow-actions and a same-origin check
        return Answer()


def _bearer(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, credential = value.partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else None


def _cookie(value: str | None) -> str | None:
    if not value:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(value)
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None else None
