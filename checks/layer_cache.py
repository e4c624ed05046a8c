"""gpurig's layer cache: a read-only, pull-through registry on a host's loopback, the host side of fleet delivery.

Standalone (Python 3.7+, stdlib only), sent by gpurig like its other host scripts:

    python3 layer_cache.py --upstream http://127.0.0.1:PORT --store DIR [--listen 127.0.0.1] [--port 0]

It answers the Docker registry API's read requests (``/v2/``, manifests, blobs)
on 127.0.0.1 only, so the host's own dockerd and, through an SSH forward, the
hosts it serves can pull from it. A blob it does not hold is fetched from
``--upstream`` once (the build machine's registry through its forward, or the
cache of the host this one pulls from), written to DIR as it arrives and
streamed at the same time to every client asking for it: a host a level down
starts receiving a layer while this host is still receiving it. A blob is kept
only once its sha256 matches its digest; each pulling engine checks the digest
again. Manifests always come from upstream (they are small and name the image).

On start it prints one JSON line, ``{"event": "listening", "port": N}``; on
SIGTERM or SIGINT, or when stdin closes (its SSH channel went away), it prints
``{"event": "stopped", "fetched": BYTES, "served": BYTES, "blobs": N}`` and
exits 0. Nothing of it listens afterwards; DIR is the caller's to remove.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = 1 << 20
API = {"Docker-Distribution-API-Version": "registry/2.0"}
# /v2/<name>/manifests/<reference> and /v2/<name>/blobs/<digest>; a name is path components of lowercase letters and digits
ROUTE = re.compile(r"^/v2/((?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*)/(manifests|blobs)/([A-Za-z0-9_.:+-]{1,200})$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
UPSTREAM_TIMEOUT_S = 60


class Fetch:
    """One blob on its way from upstream into the store: readers follow the partial file as it grows."""

    def __init__(self, path: str) -> None:
        self.path = path  # the partial file
        self.size = 0  # bytes written so far
        self.total = None  # the blob's length, once upstream said
        self.done = False
        self.failed = ""  # why it failed; ``status`` the upstream's HTTP answer then, when it gave one
        self.status = 502
        self.cond = threading.Condition()


class Cache:
    def __init__(self, upstream: str, store: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.store = store
        self.lock = threading.Lock()
        self.fetches = {}
        self.fetched = 0
        self.served = 0
        self.blobs = 0
        os.makedirs(os.path.join(store, "blobs"), exist_ok=True)
        os.makedirs(os.path.join(store, "partial"), exist_ok=True)

    def blob_path(self, digest: str) -> str:
        return os.path.join(self.store, "blobs", digest.split(":", 1)[1])

    def count(self, what: str, n: int) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + n)

    def fetch(self, name: str, digest: str) -> Fetch:
        """The fetch of ``digest``: the one already running, or a new one started in a thread of its own."""
        with self.lock:
            running = self.fetches.get(digest)
            if running is not None and not running.failed:
                return running
            fetch = Fetch(os.path.join(self.store, "partial", digest.split(":", 1)[1]))
            self.fetches[digest] = fetch
        threading.Thread(target=self._download, args=(name, digest, fetch), daemon=True).start()
        return fetch

    def _download(self, name: str, digest: str, fetch: Fetch) -> None:
        hasher = hashlib.sha256()
        try:
            request = urllib.request.Request(f"{self.upstream}/v2/{name}/blobs/{digest}")
            with urllib.request.urlopen(request, timeout=UPSTREAM_TIMEOUT_S) as answer, open(fetch.path, "wb") as out:
                length = answer.headers.get("Content-Length")
                with fetch.cond:
                    fetch.total = int(length) if length and length.isdigit() else None
                    fetch.cond.notify_all()
                while True:
                    chunk = answer.read(CHUNK)
                    if not chunk:
                        break
                    out.write(chunk)
                    out.flush()
                    hasher.update(chunk)
                    self.count("fetched", len(chunk))
                    with fetch.cond:
                        fetch.size += len(chunk)
                        fetch.cond.notify_all()
            if "sha256:" + hasher.hexdigest() != digest:
                raise ValueError(f"upstream sent a blob whose sha256 is not {digest}")
            with fetch.cond:  # a reader opens the path under this lock: it finds the partial file or the kept one
                os.replace(fetch.path, self.blob_path(digest))
                fetch.path = self.blob_path(digest)
                fetch.done = True
                fetch.cond.notify_all()
            self.count("blobs", 1)
        except (OSError, ValueError, urllib.error.URLError) as err:
            with fetch.cond:
                fetch.failed = str(getattr(err, "reason", None) or err) or type(err).__name__
                fetch.status = err.code if isinstance(err, urllib.error.HTTPError) and err.code == 404 else 502
                fetch.cond.notify_all()
            try:
                os.unlink(fetch.path)
            except OSError:
                pass
        finally:
            with self.lock:
                if self.fetches.get(digest) is fetch:
                    del self.fetches[digest]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpurig-layer-cache"
    sys_version = ""
    cache = None  # type: Cache

    def log_message(self, format: str, *args: object) -> None:
        pass  # stdout is the controller's: one JSON line at start and at the end

    def do_HEAD(self) -> None:
        self.answer(head=True)

    def do_GET(self) -> None:
        self.answer(head=False)

    def refuse(self) -> None:
        self.empty(405, {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_PATCH = do_DELETE = refuse

    def empty(self, status: int, headers: dict | None = None) -> None:
        self.send_response(status)
        for key, value in {**API, **(headers or {})}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def answer(self, head: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/v2", "/v2/"):
            return self.empty(200)
        route = ROUTE.match(path)
        if not route:
            return self.empty(404)
        name, kind, ref = route.groups()
        if kind == "manifests":
            return self.manifest(name, ref, head)
        if not DIGEST.match(ref):
            return self.empty(400)
        return self.blob(name, ref, head)

    def manifest(self, name: str, ref: str, head: bool) -> None:
        request = urllib.request.Request(f"{self.cache.upstream}/v2/{name}/manifests/{ref}", method="HEAD" if head else "GET")
        if self.headers.get("Accept"):
            request.add_header("Accept", ", ".join(self.headers.get_all("Accept") or ()))
        try:
            with urllib.request.urlopen(request, timeout=UPSTREAM_TIMEOUT_S) as answer:
                body = b"" if head else answer.read()
                headers = {k: answer.headers[k] for k in ("Content-Type", "Docker-Content-Digest", "Content-Length") if answer.headers.get(k)}
        except urllib.error.HTTPError as err:
            return self.empty(err.code)
        except (OSError, urllib.error.URLError):
            return self.empty(502)
        self.send_response(200)
        for key, value in {**API, **headers}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(body)
            self.cache.count("served", len(body))

    def blob(self, name: str, digest: str, head: bool) -> None:
        kept = self.cache.blob_path(digest)
        if os.path.exists(kept):
            size = os.path.getsize(kept)
            self.blob_headers(digest, size)
            if not head:
                with open(kept, "rb") as source:
                    self.send_file(source, size)
            return
        fetch = self.cache.fetch(name, digest)
        with fetch.cond:
            while fetch.total is None and not fetch.done and not fetch.failed:
                fetch.cond.wait(UPSTREAM_TIMEOUT_S)
            if fetch.failed or (fetch.total is None and not fetch.done):
                return self.empty(fetch.status if fetch.failed else 502)
            total = fetch.total if fetch.total is not None else fetch.size
        self.blob_headers(digest, total)
        if head:
            return
        self.follow(fetch, total)

    def blob_headers(self, digest: str, size: int) -> None:
        self.send_response(200)
        for key, value in {**API, "Content-Type": "application/octet-stream", "Docker-Content-Digest": digest,
                           "Content-Length": str(size)}.items():
            self.send_header(key, value)
        self.end_headers()

    def send_file(self, source, size: int) -> None:
        left = size
        while left > 0:
            chunk = source.read(min(CHUNK, left))
            if not chunk:
                break
            self.wfile.write(chunk)
            self.cache.count("served", len(chunk))
            left -= len(chunk)

    def follow(self, fetch: Fetch, total: int) -> None:
        """Send the blob as it arrives: read the partial file up to what was written, wait for more, until ``total``.

        The last byte goes only once the whole blob matched its digest: a client never gets a complete body of wrong
        bytes from here (it gets a short one, an error to its engine, which keeps nothing of it).
        """
        sent = 0
        with fetch.cond:
            if fetch.failed:
                return
            source = open(fetch.path, "rb")
        try:
            while sent < total:
                with fetch.cond:
                    while (total if fetch.done else min(fetch.size, total - 1)) <= sent and not fetch.failed:
                        if not fetch.cond.wait(UPSTREAM_TIMEOUT_S):
                            return  # upstream stalled: a short body
                    if fetch.failed:
                        return
                    ready = (total if fetch.done else min(fetch.size, total - 1)) - sent
                chunk = source.read(min(ready, CHUNK))
                if not chunk:
                    return
                self.wfile.write(chunk)
                self.cache.count("served", len(chunk))
                sent += len(chunk)
        finally:
            source.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="gpurig's read-only pull-through layer cache on loopback")
    parser.add_argument("--upstream", required=True, help="the registry (or cache) to fetch what is missing from: http://HOST:PORT")
    parser.add_argument("--store", required=True, help="the folder to keep fetched blobs in")
    parser.add_argument("--listen", default="127.0.0.1", choices=("127.0.0.1",), help="loopback only")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    cache = Cache(args.upstream, args.store)
    Handler.cache = cache
    server = ThreadingHTTPServer((args.listen, args.port), Handler)
    server.daemon_threads = True
    stopped = threading.Event()

    def stop(*_: object) -> None:
        if not stopped.is_set():
            stopped.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def watch_stdin() -> None:  # the SSH channel gone (gpurig interrupted, the connection lost): stop, leave nothing listening
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        stop()

    threading.Thread(target=watch_stdin, daemon=True).start()
    print(json.dumps({"event": "listening", "port": server.server_address[1]}), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        shutil.rmtree(os.path.join(args.store, "partial"), ignore_errors=True)
    print(json.dumps({"event": "stopped", "fetched": cache.fetched, "served": cache.served, "blobs": cache.blobs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
