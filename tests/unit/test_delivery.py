"""Delivery's pure parts: references, staging names and cuts, pull progress from recorded events, the forward's pump."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpurig.connect.forward import Meter, pump
from gpurig.deploy.progress import CountPace, PullFailed, PullProgress, PushProgress, human_size
from gpurig.deploy.registry import RegistryError, parse_reference, staging_reference
from gpurig.deploy.stages import stage_cuts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "deploy"
MB = 1024 * 1024


@pytest.mark.parametrize("ref, domain, path, tag", [
    ("pytorch:2.14.1-cu130-slim", None, "pytorch", "2.14.1-cu130-slim"),
    ("team/pytorch:slim", None, "team/pytorch", "slim"),
    ("registry.example.com/ml/pytorch:slim", "registry.example.com", "ml/pytorch", "slim"),
    ("localhost:5000/pytorch", "localhost:5000", "pytorch", "latest"),
    ("127.0.0.1:5000/a/b:c", "127.0.0.1:5000", "a/b", "c"),
])
def test_references_split_as_docker_does(ref, domain, path, tag):
    parsed = parse_reference(ref)
    assert (parsed.domain, parsed.path, parsed.tag) == (domain, path, tag)
    assert str(parsed) == (ref if ":" in ref.rsplit("/", 1)[-1] else f"{ref}:latest")


def test_a_digest_reference_is_refused_with_the_fix():
    with pytest.raises(RegistryError, match="digest") as err:
        parse_reference("pytorch@sha256:" + "0" * 64)
    assert "name:tag" in err.value.fix


def test_every_image_stages_in_one_repository_under_a_valid_tag():
    a = staging_reference(parse_reference("registry.example.com/ml/pytorch:2.14.1-cu130-slim"))
    b = staging_reference(parse_reference("pytorch:slim"))
    assert a.path == b.path == "gpurig/deliver"
    assert a.tag == "registry.example.com_ml_pytorch_2.14.1-cu130-slim"
    long = staging_reference(parse_reference("x" * 200 + ":t"))
    assert len(long.tag) <= 128 and long.tag != staging_reference(parse_reference("x" * 199 + "y:t")).tag


def test_stages_cut_after_big_layers_and_never_at_the_end():
    # base, apt, user, venv, torch, then small layers: as the CPU slim image's are (compressed MB)
    sizes = [30 * MB, 55 * MB, 1024, 9 * MB, 230 * MB, 2048, 1024, 30 * 1024]
    cuts = stage_cuts(sizes)
    assert cuts == [2, 5]  # after base+apt (85 MB >= 46 MB), after torch; the image itself comes last
    assert stage_cuts([10 * MB] * 3) == []  # small images: one pull
    many = stage_cuts([100 * MB] * 20)
    assert len(many) == 6 and max(many) < 20


def recorded(name: str) -> list[dict]:
    """The JSON events of one recording in tests/fixtures/deploy (its README says how each was made)."""
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


@pytest.mark.parametrize(("nbytes", "shown"), [
    (0, "0 B"), (512, "512 B"), (999, "999 B"), (1_000, "1 kB"), (12_345, "12 kB"), (999_499, "999 kB"),
    (1_000_000, "1.00 MB"), (9_000_000, "9.00 MB"), (1_020_740_441, "1.02 GB"), (6_100_000_000, "6.10 GB"),
    (2_500_000_000_000, "2.50 TB"), (3_000_000_000_000_000, "3000.00 TB"),
])
def test_every_count_of_bytes_a_person_sees_reads_as_docker_images_prints_sizes(nbytes, shown):
    # the one rule for bytes shown to a person: moved and uploaded bytes, image sizes, a run's files
    assert human_size(nbytes) == shown


def test_pull_progress_over_recorded_events_counts_only_fetched_layers():
    events = recorded("pull-jupyter-after-slim.jsonl")
    seen: list[tuple[int, int]] = []
    tracker = PullProgress(lambda done, total: seen.append((done, total)))
    for event in events:
        tracker.feed(event)
    total = tracker.finish()
    downloads = {e["id"]: e["progressDetail"]["total"] for e in events if e.get("status") == "Downloading"}
    assert total == sum(downloads.values()) == 57884191  # the layers marked Already exists are not counted
    assert seen[-1] == (total, total)
    assert all(d <= t for d, t in seen) and len(seen) == len(set(seen))  # never past the total, no repeats


def test_pull_progress_takes_wire_bytes_when_a_meter_gives_them():
    seen = []
    wire = [0]
    tracker = PullProgress(lambda d, t: seen.append((d, t)), sizes={"aaaaaaaaaaaa": 1000}, moved=lambda: wire[0])
    tracker.feed({"status": "Pulling fs layer", "id": "aaaaaaaaaaaa", "progressDetail": {}})
    wire[0] = 600
    tracker.feed({"status": "Downloading", "id": "aaaaaaaaaaaa", "progressDetail": {"current": 100, "total": 1000}})
    wire[0] = 1200  # HTTP headers and the manifest cross too: shown capped at the total
    tracker.feed({"status": "Download complete", "id": "aaaaaaaaaaaa", "progressDetail": {}})
    assert seen == [(0, 1000), (600, 1000), (1000, 1000)]


def test_push_progress_over_recorded_events_counts_the_uploaded_layers():
    # a 5.9 GB push into the local registry went by without a word for 4.5 minutes
    events = recorded("push-two-layers-one-present.jsonl")
    seen: list[tuple[int, int]] = []
    tracker = PushProgress(lambda done, total: seen.append((done, total)))
    for event in events:
        tracker.feed(event)
    assert seen[-1] == (9_000_000, 9_000_000)  # the 6 MB and 3 MB layers; the base's layer was there already
    assert all(d <= t for d, t in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len(seen) > 5  # counted as the bytes went, not only at the end
    assert tracker.summary() == "2 of 3 layers uploaded (9.00 MB)"


def test_byte_counts_are_paced_per_host_but_the_last_count_and_a_new_phase_are_not():
    now = [0.0]
    pace = CountPace(1.0, clock=lambda: now[0])
    assert pace.allow("a", 10, 100)  # the first count of a phase is shown
    now[0] = 0.3
    assert not pace.allow("a", 20, 100)  # many a second: held back
    assert pace.allow("b", 5, 100)  # another host keeps its own pace
    assert pace.allow("a", 100, 100)  # the count that says it is done always shows
    now[0] = 0.5
    pace.phase("a")  # "a pulls the layers it lacks": its first count shows at once
    assert pace.allow("a", 1, 50)
    now[0] = 1.6
    assert pace.allow("a", 30, 50)


def test_an_error_event_fails_the_pull_and_a_full_disk_is_recognised():
    tracker = PullProgress(lambda d, t: None)
    with pytest.raises(PullFailed) as err:
        tracker.feed({"errorDetail": {"message": "write /var/lib/docker/tmp/x: no space left on device"},
                      "error": "write /var/lib/docker/tmp/x: no space left on device"})
    assert err.value.disk_full


class _Channel:
    """The parts of a paramiko Channel pump uses, over one end of a socketpair."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False

    def recv(self, n: int) -> bytes:
        return self.sock.recv(n)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def shutdown_write(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def test_pump_copies_both_ways_until_both_ends_close_and_counts_each_way():
    host_side, chan_end = socket.socketpair()  # the host's dockerd <-> the SSH channel
    registry_side, sock_end = socket.socketpair()  # the local registry <-> the pump's socket
    chan, meter = _Channel(chan_end), Meter()
    worker = threading.Thread(target=pump, args=(chan, sock_end, meter, threading.Event()))
    worker.start()
    host_side.sendall(b"GET /v2/ HTTP/1.1\r\n\r\n")
    host_side.shutdown(socket.SHUT_WR)
    request = b""
    while not request.endswith(b"\r\n\r\n"):
        request += registry_side.recv(1024)
    blob = bytes(range(256)) * 4096  # 1 MiB answer, more than the socket buffers hold: sent while the host reads

    def answer():
        registry_side.sendall(blob)
        registry_side.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=answer)
    sender.start()
    got = b""
    while True:
        chunk = host_side.recv(65536)
        if not chunk:
            break
        got += chunk
    worker.join(timeout=10)
    sender.join(timeout=10)
    assert not worker.is_alive() and chan.closed
    assert request == b"GET /v2/ HTTP/1.1\r\n\r\n" and got == blob
    assert (meter.up, meter.down, meter.total) == (len(request), len(blob), len(request) + len(blob))
    for s in (host_side, registry_side):
        s.close()


class PullingEngine:
    """An engine whose pulls break off ``lost`` times, then stream ``events`` (or are refused with ``refusal``)."""

    name = "gpu-01"

    def __init__(self, events, lost: int = 0, refusal: str | None = None) -> None:
        self.events, self.lost, self.refusal, self.pulls = events, lost, refusal, 0

    def pull(self, ref, on_event):
        from gpurig.connect.engine import EngineError, EngineLost

        self.pulls += 1
        if self.pulls <= self.lost:
            raise EngineLost("gpu-01: lost the Docker engine", "retry", "Connection broken: IncompleteRead")
        if self.refusal:
            raise EngineError(f"gpu-01: the Docker engine refused to pull {ref}: {self.refusal}", "see", self.refusal)
        for event in self.events:
            on_event(event)


PULL_EVENTS = [{"id": "aaaa", "status": "Pulling fs layer"}, {"id": "aaaa", "status": "Downloading", "progressDetail": {"current": 5, "total": 10}}]


def test_a_pull_whose_stream_breaks_off_is_asked_again_and_a_refusal_is_not():
    from gpurig.connect.local import LocalConnection
    from gpurig.deploy.delivery import PULL_ATTEMPTS, _host_pull

    conn, events = LocalConnection("gpu-01"), PULL_EVENTS
    engine = PullingEngine(events, lost=PULL_ATTEMPTS - 1)
    assert _host_pull(engine, "127.0.0.1:5000/x:y", PullProgress(lambda done, total: None), conn) == 10
    assert engine.pulls == PULL_ATTEMPTS
    with pytest.raises(PullFailed, match=f"broke off {PULL_ATTEMPTS} times: Connection broken"):
        _host_pull(PullingEngine(events, lost=PULL_ATTEMPTS), "x:y", PullProgress(lambda done, total: None), conn)
    refusing = PullingEngine(events, refusal="write /var/lib/docker/x: no space left on device")
    with pytest.raises(PullFailed) as err:
        _host_pull(refusing, "x:y", PullProgress(lambda done, total: None), conn)
    assert refusing.pulls == 1 and err.value.disk_full and err.value.message == "write /var/lib/docker/x: no space left on device"


def test_a_pull_of_an_interrupted_run_stops_at_once_and_is_not_asked_again():
    from gpurig.connect.local import LocalConnection
    from gpurig.deploy.delivery import DeliveryInterrupted, _host_pull

    conn = LocalConnection("gpu-01")
    conn.interrupt()  # what the fleet does on Ctrl-C; the engine stream it closed breaks off
    broken = PullingEngine(PULL_EVENTS, lost=1)
    with pytest.raises(DeliveryInterrupted, match="interrupted during the image's delivery"):
        _host_pull(broken, "x:y", PullProgress(lambda done, total: None), conn)
    assert broken.pulls == 1
    streaming = PullingEngine(PULL_EVENTS)
    with pytest.raises(DeliveryInterrupted, match="interrupted"):  # stopped at the first event, not at the pull's end
        _host_pull(streaming, "x:y", PullProgress(lambda done, total: None), conn)


def test_a_pull_whose_source_is_gone_ends_at_the_engines_next_event_and_is_not_asked_again():
    from gpurig.connect.local import LocalConnection
    from gpurig.deploy.delivery import _host_pull

    # a dead layer cache: the engine counts down to its retry, an event a second
    retrying = [{"id": "aaaa", "status": f"Retrying in {n} seconds"} for n in (5, 4, 3, 2, 1)]
    engine = PullingEngine([*PULL_EVENTS, *retrying])
    seen: list[dict] = []
    told = iter([None, None, "the layer cache on a100-01 ended before its pulls did"])
    with pytest.raises(PullFailed, match="^the layer cache on a100-01 ended before its pulls did$"):
        _host_pull(engine, "x:y", PullProgress(lambda done, total: seen.append(done)), LocalConnection("gpu-01"),
                   lambda: next(told, "gone"))
    assert engine.pulls == 1 and len(seen) <= 2  # stopped at the third event, never asked again


def test_a_delivery_line_names_the_host_once_and_a_count_without_a_total_says_no_total(monkeypatch):
    from types import SimpleNamespace

    from gpurig.deploy import delivery, imagesource
    from gpurig.deploy.stages import Staged

    said: list[str] = []

    class Stop(Exception):
        pass

    def no_pull(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(delivery, "_host_pull", no_pull)
    meter = Meter()
    with pytest.raises(Stop):
        delivery.pull_through(SimpleNamespace(name="wt-h1", untag=lambda ref: None), None, "pytorch:slim", parse_reference("pytorch:slim"), "sha256:x",
                              5000, lambda: meter.down, Staged((), ()), None, said.append)
    assert said and "wt-h1" not in said[0]  # the printer puts "wt-h1: " before it: "wt-h1: wt-h1 pulls" said it twice

    shown: list[str] = []
    printer = SimpleNamespace(count=lambda host, done, total, text: shown.append(text))

    def counting_deliver(local, engine, conn, ref, *, registry, say=None, progress=None):
        progress(2000, 0)  # a push's first bytes, before the registry said how much there is
        progress(1000, 5000)

    monkeypatch.setattr(imagesource, "deliver", counting_deliver)
    spec = SimpleNamespace(registry="")
    move = imagesource.mover(spec, SimpleNamespace(), printer)
    move(SimpleNamespace(), SimpleNamespace(name="wt-h1"), SimpleNamespace(image_ref="pytorch:slim"), lambda text: None)
    assert shown == ["pytorch:slim: 2 kB", "pytorch:slim: 1 kB of 5 kB"]


def shown_counts(feed, every_s: float = 1.0) -> list[str]:
    """The byte-count lines deploy prints for one host while ``feed(progress)`` reports (done, total): the mover's text, paced by
    CountPace as ProgressPrinter paces it, on a clock that moves 0.1 s a report."""
    from gpurig.deploy import imagesource

    now = [0.0]
    pace = CountPace(every_s, clock=lambda: now[0])
    lines: list[str] = []

    def count(host, done, total, text):
        now[0] += 0.1
        if pace.allow(host, done, total):
            lines.append(text)

    def deliver(local, engine, conn, ref, *, registry, say=None, progress=None):
        feed(progress)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(imagesource, "deliver", deliver)
        move = imagesource.mover(SimpleNamespace(registry=""), SimpleNamespace(), SimpleNamespace(count=count))
        move(SimpleNamespace(), SimpleNamespace(name="h"), SimpleNamespace(image_ref="img"), lambda text: None)
    return lines


def counts_of(lines: list[str]) -> list[tuple[float, float | None]]:
    """(done, total) in bytes from 'img: 2 kB of 5 kB' lines (total None where the line gives none)."""
    units = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
    out = []
    for line in lines:
        parts = line.split(": ", 1)[1].split(" of ")
        value = [float(p.split()[0]) * units[p.split()[1]] for p in parts]
        out.append((value[0], value[1] if len(value) > 1 else None))
    return out


def test_deploy_progress_over_a_recorded_pull_through_the_forward_never_shows_a_total_below_the_bytes_moved():
    # issue 35: "2 kB of 0 B", or a total that grows past the image's size; the recorded pull through the SSH forward, its wire meter
    # running ahead of the events by what else crosses the forward (manifests, configs: 2% here)
    events = recorded("pull-jupyter-after-slim.jsonl")
    image = sum({e["id"]: e["progressDetail"]["total"] for e in events if e.get("status") == "Downloading"}.values())

    def feed(progress):
        wire = [0]
        tracker = PullProgress(progress, moved=lambda: wire[0])
        for event in events:
            if event.get("status") == "Downloading":
                wire[0] = int(tracker.done * 1.02) + 1500
            tracker.feed(event)
        tracker.finish()

    lines = shown_counts(feed)
    counts = counts_of(lines)
    assert lines and all(" of 0 B" not in line for line in lines)
    assert all(total is None or done <= total for done, total in counts)
    assert all(total is None or total <= image * 1.005 for _, total in counts)  # 3 significant digits of rounding
    assert counts[-1][0] == counts[-1][1]  # the last line says it is all there
    assert len(lines) <= 15  # paced: a line a second, not one an event


def test_save_load_progress_past_the_images_size_is_paced_and_never_grows_the_total_past_the_image():
    # docker save's tar is bigger than the image's size (a tar header for each file): the stream runs past the size it was counted by
    from gpurig.deploy import delivery

    size, chunk = 1_000_000, 10_000
    chunks = [b"x" * chunk] * 130  # 1.3 MB of tar for a 1 MB image

    class Saved:
        def __iter__(self):
            return iter(chunks)

        def close(self):
            pass

    local = SimpleNamespace(save=lambda ref: Saved())
    remote = SimpleNamespace(name="h", load=lambda stream: [dict() for _ in stream][:0], image=lambda ref: SimpleNamespace(id="sha256:x"))
    conn = SimpleNamespace(interrupted=False, name="h")

    lines = shown_counts(lambda progress: delivery._save_load(local, remote, conn, "img", "sha256:x", size, progress, lambda text: None))
    counts = counts_of(lines)
    assert all(total is None or done <= total for done, total in counts)
    assert all(total is None or total <= size for done, total in counts[:-1])  # while it streams, no total past the image's size
    assert lines[-1] == "img: 1.30 MB of 1.30 MB"  # the end says what moved
    assert len(lines) <= 15  # past the size, each 10 kB chunk was a "final" count, printed unpaced
