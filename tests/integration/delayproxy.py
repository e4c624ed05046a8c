"""A TCP proxy on loopback that adds network latency: a one-way delay each way, and TCP's handshake.

The kernel here has no netem (``tc qdisc add ... netem`` says "Specified
qdisc kind is unknown"), so the round trip time is made in user space:
every chunk read from one side is written to the other ``rtt / 2`` later,
in order; and a new connection reaches the server 1.5 RTT after the client
connected, so the server's first bytes (sshd's banner) arrive 2 RTT after
connect() began, as over a real link (SYN, SYN-ACK, then the ACK and data).
Bandwidth is not limited: the benches it serves move kilobytes, and what
they measure is how many times a tool waits for an answer.

    with DelayProxy(upstream_port, rtt_s=0.1) as proxy:
        ... connect to 127.0.0.1:proxy.port ...
        proxy.accepted   # how many connections came (a test's count of logins)

bench/bench_rtt.py measures with it; tests count connections through it.
"""

from __future__ import annotations

import asyncio
import socket
import threading


class DelayProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``upstream``, every byte ``rtt_s / 2`` late each way."""

    def __init__(self, upstream: int, rtt_s: float) -> None:
        self.upstream = upstream
        self.rtt_s = rtt_s
        self.port = 0
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"delay-proxy-{upstream}", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def __enter__(self) -> DelayProxy:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, sock=sock), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        # one more turn of the loop lets the cancelled connections close their sockets
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            await asyncio.sleep(1.5 * self.rtt_s)  # SYN, SYN-ACK, ACK: the server sees the client 1.5 RTT after connect()
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            client_w.close()
            return
        for writer in (client_w, server_w):
            writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.gather(self._pump(client_r, server_w), self._pump(server_r, client_w))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            client_w.close()
            server_w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Bytes from ``reader`` to ``writer`` half an RTT later, in order; EOF passed on the same way."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        while True:
            try:
                data = await reader.read(65536)
            except OSError:
                data = b""
            queue.put_nowait((loop.time() + self.rtt_s / 2, data))
            if not data:
                break
        await sender
