"""The dashboard's HTTP server (stdlib ThreadingHTTPServer): the page, its assets, a snapshot and a stream of server-sent events.

    GET /                 the page (static/index.html)
    GET /static/NAME      its CSS and JS, shipped in the package (no CDN)
    GET /api/snapshot     everything the page shows, as JSON (gpurig.dashboard.snapshot)
    GET /api/events       text/event-stream: a "snapshot" event, then a "delta" each interval (new samples, sections that changed)
    GET /api/session      whether actions are on and, when they are, the anti-CSRF value the page's POSTs carry (never in a snapshot)
    GET /api/jobs/ID/log  the last ?lines=N (default 200) lines of a job's log, text/plain (gpurig.dashboard.actions)
    POST /api/jobs/ID/cancel   with --allow-actions: cancel the job as `gpurig cancel` does, recorded in the history
    POST /api/hosts/HOST/containers/NAME/stop   with --allow-actions: stop a container deploy made, as `gpurig stop` does, recorded

Every request passes the Gate first (webauth: Host, token, method, and for a
POST the same-origin and anti-CSRF checks); what it refuses gets its status
and an empty body (a refused action: one line saying why). Every answer
carries the security headers. Nothing is logged: a request line can hold the
token.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from gpurig.dashboard import DashboardError
from gpurig.dashboard.actions import Desk, Reply
from gpurig.dashboard.feeds import Feeds
from gpurig.dashboard.webauth import SECURITY_HEADERS, Gate, allowed_hosts
from gpurig.flows.jobact import LOG_TAIL as LOG_LINES

STATIC = Path(__file__).resolve().parent / "static"
TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".svg": "image/svg+xml", ".png": "image/png"}
MAX_STREAMS = 32  # open event streams at once (a thread each); one more is told 503
KEEPALIVE_S = 15.0
MAX_BODY = 64 * 1024  # a POST's body is not read for anything; more than this closes the connection
JOB_ROUTE = "/api/jobs/"
HOST_ROUTE = "/api/hosts/"


def _assets() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once: a copy of gpurig without them refuses to start rather than serve a blank page."""
    found = {}
    for path in sorted(STATIC.glob("*")) if STATIC.is_dir() else ():
        if path.is_file() and path.suffix in TYPES:
            found[path.name] = (path.read_bytes(), TYPES[path.suffix])
    if "index.html" not in found:
        raise DashboardError(f"the dashboard's page is missing from this gpurig ({STATIC / 'index.html'})",
                             "reinstall gpurig from its wheel or sdist (pip install --force-reinstall gpurig)")
    return found


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily) -> None:
        self.address_family = family
        super().__init__(address, _Handler)
        self.dashboard: Dashboard | None = None


class Dashboard:
    """One server: its gate, its feeds, its assets; ``serve`` in a thread of its own, ``close`` to end it and its streams."""

    def __init__(self, feeds: Feeds, token: str, address: str, port: int = 0, names: tuple[str, ...] = (), desk: Desk | None = None) -> None:
        self.feeds = feeds
        self.desk = desk
        self.assets = _assets()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            self.server = _Server((address, port), family)
        except OSError as err:
            raise DashboardError(f"cannot listen on {address} port {port}: {err.strerror or err}",
                                 "choose another --port (0 takes a free one) or an address of this machine for --bind") from None
        self.server.dashboard = self
        self.address = address
        self.port = int(self.server.server_address[1])
        self.names = names or _own_names()
        self.gate = Gate(token, allowed_hosts(address, self.port, self.names), actions=desk is not None and desk.allow)
        self.closing = threading.Event()
        self.streams = threading.BoundedSemaphore(MAX_STREAMS)
        self._thread: threading.Thread | None = None

    def url(self, token: str | None = None) -> str:
        if self.address in ("0.0.0.0", "::"):
            host = self.names[0]  # every address: the name a colleague reaches this machine by
        else:
            host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/" + (f"?token={token}" if token else "")

    def serve(self) -> None:
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, name="gpurig-dashboard-http",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop answering: the event streams end at their next tick, the listening socket is closed."""
        self.closing.set()
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join(5)
        self.server.server_close()


def _own_names() -> tuple[str, ...]:
    """This machine's names and addresses, as a colleague's browser may put them in the Host header: its full name first
    (where it has one), then its short name and the addresses that name resolves to."""
    import psutil

    short, full = socket.gethostname(), socket.getfqdn()
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(short, None)}
    except OSError:
        found = set()
    for addrs in psutil.net_if_addrs().values():  # a wildcard bind answers on every interface's address
        found.update(a.address for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6) and "%" not in a.address)
    addresses = sorted(found)
    first = [full] if "." in full and full != "localhost" else []
    return tuple(dict.fromkeys([*first, short, *(f"[{a}]" if ":" in a else a for a in addresses)]))


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "gpurig-dashboard"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: a request line can carry the token, and the terminal is the dashboard's own."""

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_POST(self) -> None:
        self._drain()
        self._answer(head=False)

    def _refuse(self) -> None:
        self._answer(head=False)

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    def _drain(self) -> None:
        """Read a POST's body (nothing is taken from it), so that the connection can carry the next request."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = MAX_BODY + 1
        if length > MAX_BODY or length < 0 or self.headers.get("Transfer-Encoding"):
            self.close_connection = True  # a body not read to its end: this connection carries nothing more
        elif length:
            self.rfile.read(length)

    def _answer(self, head: bool) -> None:
        dash = self.server.dashboard
        assert dash is not None
        verdict = dash.gate.admit(self.command, self.path, dict(self.headers.items()))
        if verdict.status is not None:
            extra = {"Set-Cookie": verdict.set_cookie, "Location": verdict.location}
            body = (verdict.text + "\n").encode() if verdict.text else b""
            return self._send(verdict.status, body, "text/plain; charset=utf-8", head, {k: v for k, v in extra.items() if v})
        url = urlsplit(self.path)
        path = url.path
        if self.command == "POST":
            return self._reply(self._action(dash, path), head)
        if path.startswith(JOB_ROUTE) and path.endswith("/log"):
            return self._reply(self._log(dash, path[len(JOB_ROUTE):-len("/log")], url.query), head)
        if path == "/api/session":
            csrf = dash.gate.csrf if dash.gate.actions else None
            return self._reply(Reply.json({"actions": dash.gate.actions, "csrf": csrf, "log_lines": LOG_LINES}), head)
        if path == "/":
            body, kind = dash.assets["index.html"]
            return self._send(200, body, kind, head)
        if path.startswith("/static/") and path[len("/static/"):] in dash.assets:
            body, kind = dash.assets[path[len("/static/"):]]
            return self._send(200, body, kind, head)
        if path == "/api/snapshot":
            doc, _, _ = dash.feeds.document()
            return self._send(200, json.dumps(doc, separators=(",", ":")).encode(), "application/json", head)
        if path == "/api/events" and not head:
            return self._events(dash)
        return self._send(404, b"", "text/plain", head)

    def _action(self, dash: Dashboard, path: str) -> Reply:
        parts = path[len(HOST_ROUTE):].split("/") if path.startswith(HOST_ROUTE) else []
        if dash.desk is not None and len(parts) == 4 and parts[1] == "containers" and parts[3] == "stop":
            return dash.desk.stop(unquote(parts[0]), unquote(parts[2]), self.client_address[0])
        if dash.desk is None or not (path.startswith(JOB_ROUTE) and path.endswith("/cancel")):
            return Reply.line(404, "no such action (POST /api/jobs/ID/cancel and /api/hosts/HOST/containers/NAME/stop are those there are)")
        return dash.desk.cancel(unquote(path[len(JOB_ROUTE):-len("/cancel")]), self.client_address[0])

    def _log(self, dash: Dashboard, job: str, query: str) -> Reply:
        if dash.desk is None:
            return Reply.line(404, "this dashboard reads no job logs")
        asked = dict(parse_qsl(query)).get("lines", str(LOG_LINES))
        if not asked.isdecimal():
            return Reply.line(400, f"lines={asked[:20]!r} is not a number of lines (0 = the whole log)")
        return dash.desk.log(unquote(job), int(asked[:6]))

    def _reply(self, reply: Reply, head: bool) -> None:
        self._send(reply.status, reply.body, reply.kind, head)

    def _send(self, status: int, body: bytes, kind: str, head: bool, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {**SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _events(self, dash: Dashboard) -> None:
        if not dash.streams.acquire(blocking=False):
            return self._send(503, b"", "text/plain", False)
        try:
            self.send_response(200)
            for name, value in SECURITY_HEADERS.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            doc, cursor, versions = dash.feeds.document()
            self._event("snapshot", doc)
            quiet = 0.0
            interval = max(0.2, dash.feeds.interval)
            while not dash.closing.wait(interval) and not dash.feeds.stopping.is_set():
                delta, cursor, fresh = dash.feeds.delta(cursor, versions)
                if delta["live"]["hosts"] or fresh != versions:
                    versions = fresh
                    self._event("delta", delta)
                    quiet = 0.0
                else:
                    quiet += interval
                    if quiet >= KEEPALIVE_S:
                        self.wfile.write(b": keepalive\n\n")
                        self.wfile.flush()
                        quiet = 0.0
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the page went away
        finally:
            dash.streams.release()

    def _event(self, name: str, data: dict[str, Any]) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode())
        self.wfile.flush()
