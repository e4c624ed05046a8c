"""Who gets an answer from the dashboard: the token (as Jupyter's), its cookie, the Host check, the methods, the security headers.

Every request needs the token: once in the URL (``?token=``), which is
answered with an HttpOnly SameSite=Strict cookie and a redirect to the same
page without it (so it leaves the address bar and the history), then the
cookie; a script may send ``Authorization: Bearer TOKEN``. Anything else is
401 with an empty body. The Host header must name the address the server is
bound to (or, on loopback, localhost): a page of another site whose name
was rebound to 127.0.0.1 is refused even before the token is looked at.

Reads are GET and HEAD. A POST (an action: cancelling a job, stopping a container deploy made) is refused with
403 unless the dashboard was started with ``--allow-actions``; with it, a
POST must carry the token in the cookie (not only a header), an Origin
header equal to the dashboard's own origin (``http://`` and the Host it was
asked by, itself one of the allowed ones), ``Sec-Fetch-Site: same-origin``
where the browser sends that header, and the per-session anti-CSRF value
(``X-Gpurig-CSRF``) that only the page's own script can read from
``/api/session``. Anything else is 405.
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
ACTION_METHOD = "POST"
CSRF_HEADER = "X-Gpurig-CSRF"
READ_ONLY = "read-only: start the dashboard with --allow-actions"


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
    text: str = ""  # the one line a refused action is told (an empty body otherwise)


class Gate:
    """The token and the Host headers one server accepts; with ``actions``, the anti-CSRF value its POSTs must carry."""

    def __init__(self, token: str, hosts: frozenset[str], actions: bool = False) -> None:
        if not token:
            raise DashboardError("the dashboard needs a token", "this is a bug: the CLI always makes one")
        self._token = token.encode()
        self.hosts = hosts
        self.actions = actions
        self.csrf = secrets.token_urlsafe(32) if actions else None

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
        by_cookie = self.matches(_cookie(lower.get("cookie")))
        if not (by_cookie or self.matches(_bearer(lower.get("authorization")))):
            return Answer(401)
        if method == ACTION_METHOD:
            return self._action(lower, by_cookie)
        if method not in READ_METHODS:
            return Answer(405)
        return Answer()

    def _action(self, lower: Mapping[str, str], by_cookie: bool) -> Answer:
        """A POST from a holder of the token: served only with actions on, from the page itself (cookie, origin, anti-CSRF)."""
        if not self.actions or self.csrf is None:
            return Answer(403, text=READ_ONLY)
        if not by_cookie:
            return Answer(403, text="an action needs the page's cookie: open the dashboard's URL in the browser")
        own = f"http://{(lower.get('host') or '').lower()}"
        if (lower.get("origin") or "").lower() != own:
            return Answer(403, text=f"cross-origin: an action is taken only from the dashboard's own page ({own})")
        if lower.get("sec-fetch-site", "same-origin").lower() != "same-origin":
            return Answer(403, text="cross-site: an action is taken only from the dashboard's own page")
        presented = lower.get(CSRF_HEADER.lower()) or ""
        try:
            fits = hmac.compare_digest(presented.encode(), self.csrf.encode())
        except UnicodeEncodeError:
            fits = False
        if not fits:
            return Answer(403, text=f"no valid {CSRF_HEADER}: reload the dashboard's page and try again")
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
