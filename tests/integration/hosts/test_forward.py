"""The reverse port forward that image delivery pulls through, against a real sshd: its teardown.

An interrupted delivery closes the forward while the host's dockerd holds
connections through it and may be opening more; the close must end them at
once and leave the SSH connection working.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from gpurig.connect import forward as forward_module
from gpurig.connect.connection import ChannelError

# Connects through the forward, says so, and waits for the forward's side to close the connection.
HOLD = ("python3 -c \"import socket,sys; s=socket.create_connection(('127.0.0.1',{port})); "
        "print('connected', flush=True); s.recv(1)\"")
# Six processes opening connections through the forward as fast as they can until it is gone (refused).
HAMMER = ("for i in 1 2 3 4 5 6; do python3 -c \"import socket\nprint('started', flush=True)\nwhile True:\n"
          " try: socket.create_connection(('127.0.0.1',{port})).close()\n except OSError: break\" & done; wait")


def _run_in_background(conn, command: str) -> tuple[threading.Thread, threading.Event, list]:
    said, results = threading.Event(), []

    def run() -> None:
        try:
            results.append(conn.run(command, warn=True, timeout=30, on_output=lambda stream, text: said.set()))
        except Exception as e:  # noqa: BLE001 - kept for the assertion's message
            results.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, said, results


def test_closing_the_forward_ends_an_idle_connection_through_it_at_once(connector, sshd, make_host, silent_port):
    # silent_port: a registry holding a keep-alive connection that never answers, nor hangs up on EOF
    with connector.open(make_host(sshd.port)) as conn:
        forward = conn.reverse_forward(("127.0.0.1", silent_port))
        thread, said, results = _run_in_background(conn, HOLD.format(port=forward.port))
        assert said.wait(20), "the host never connected through the forward"
        start = time.monotonic()
        forward.close()
        closed_s = time.monotonic() - start
        thread.join(timeout=20)
        transport = conn._transport  # a failure says whether the SSH connection itself died, and of what
        state = f"transport active: {transport is not None and transport.is_active()}, its error: {transport and transport.get_exception()!r}"
        assert results and getattr(results[0], "stdout", results) == "connected\n", state  # the host's side saw the connection end
        assert conn.run("echo still here").stdout == "still here\n"
    assert closed_s < 2


def test_connections_opened_while_the_forward_is_cancelled_leave_the_ssh_connection_alive(connector, sshd, make_host, silent_port):
    with connector.open(make_host(sshd.port)) as conn:
        for _ in range(25):  # the race: sshd opens a forwarded channel just as the cancel goes out
            forward = conn.reverse_forward(("127.0.0.1", silent_port))
            thread, said, results = _run_in_background(conn, HAMMER.format(port=forward.port))
            assert said.wait(20)
            forward.close()
            thread.join(timeout=20)
            assert results and getattr(results[0], "exited", results) == 0  # refused once the forward was gone
            assert conn._live_transport().is_active()
        assert conn.run("echo still here").stdout == "still here\n"


def test_http_rides_a_channel_to_a_port_on_the_hosts_loopback(connector, sshd, make_host, web_on_loopback):
    # slurmrestd's way in: nothing listens on the network, the request goes through the SSH connection gpurig holds.
    with connector.open(make_host(sshd.port)) as conn:
        session = conn.http("127.0.0.1", web_on_loopback)
        session.request("GET", "/slurm/v0.0.40/ping")
        answer = session.getresponse()
        assert (answer.status, answer.read()) == (200, b"asked for /slurm/v0.0.40/ping")
        session.close()


def test_an_answer_that_ends_the_connection_keeps_its_body_after_the_headers_were_read(connector, sshd, make_host):
    # HTTP/1.0 (or Connection: close): http.client closes its connection once it has the headers and reads the body
    # from its file; the body sent only after that close must still arrive, as it does over a socket.
    headers_read = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as server:
        def answer() -> None:
            peer, _ = server.accept()
            with peer:
                peer.recv(65536)
                peer.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\n")
                headers_read.wait(20)
                peer.sendall(b"pong")

        serving = threading.Thread(target=answer, daemon=True)
        serving.start()
        with connector.open(make_host(sshd.port)) as conn:
            session = conn.http("127.0.0.1", server.getsockname()[1])
            session.request("GET", "/slurm/v0.0.40/ping")
            response = session.getresponse()
            headers_read.set()
            assert (response.status, response.read()) == (200, b"pong")
            session.close()
        serving.join(timeout=20)


def test_a_host_opening_more_connections_than_a_forward_pumps_gets_the_extra_ones_refused(connector, sshd, make_host, silent_port, monkeypatch):
    monkeypatch.setattr(forward_module, "MAX_PUMPED", 3)
    with connector.open(make_host(sshd.port)) as conn:
        forward = conn.reverse_forward(("127.0.0.1", silent_port))
        # Four connections held open at once: three are pumped (and stay open), the fourth is ended at once. Its end
        # comes after the first three were accepted, so by then any of those refused would have seen its end too.
        held = conn.run(f"python3 -c \"import select,socket\nss=[socket.create_connection(('127.0.0.1',{forward.port})) for _ in range(4)]\n"
                        "ss[3].settimeout(20)\nprint(ss[3].recv(1) == b'', select.select(ss[:3], [], [], 0)[0] == [])\"", timeout=60)
        forward.close()
        assert held.stdout == "True True\n"
        assert conn.run("echo still here").stdout == "still here\n"


def test_a_local_forward_carries_each_connection_to_the_hosts_port_and_closes_them_all(connector, sshd, make_host, web_on_loopback):
    with connector.open(make_host(sshd.port)) as conn:
        with conn.local_forward("127.0.0.1", web_on_loopback) as forward:
            for i in range(3):  # a channel per connection
                with urllib.request.urlopen(f"http://127.0.0.1:{forward.port}/page{i}", timeout=20) as answer:
                    assert answer.read() == f"asked for /page{i}".encode()
            assert forward.meter.down > 0 and forward.meter.up > 0
            before = forward.meter.down
            held = socket.create_connection(("127.0.0.1", forward.port), timeout=20)  # an idle client, still connected at close
            held.sendall(b"GET /held HTTP/1.1\r\n")  # headers never finished: the server waits, and so does the client
            end = time.monotonic() + 20
            while forward.meter.down == before and time.monotonic() < end:
                time.sleep(0.01)  # polling interval: the bytes reached the host's side once the meter counts them
            assert forward.meter.down > before, "the held connection's bytes never crossed the forward"
        held.settimeout(5)
        assert held.recv(1) == b""  # the close ended it at once
        held.close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", forward.port), timeout=5).close()
        assert conn.run("echo still here").stdout == "still here\n"


def test_a_channel_to_a_port_nothing_listens_on_is_one_channel_error(connector, sshd, make_host):
    with socket.socket() as held:  # bound, never listening: the port is ours and refuses connections, with no race
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        with connector.open(make_host(sshd.port)) as conn:
            with pytest.raises(ChannelError, match=f"no channel to 127.0.0.1:{port}"):
                conn.open_channel("127.0.0.1", port, timeout=10)
            assert conn.run("echo still here").stdout == "still here\n"
