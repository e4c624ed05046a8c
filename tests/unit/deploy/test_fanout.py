"""gpurig.deploy.fanout's coordination with fake hosts: who pulls through whom, fallbacks and their notes, when caches close.

The hosts' threads are real threads; what a host does (start a cache, open a link or forward, pull) is a fake that
records it and, where a test needs an order, blocks on an Event. No sleep synchronises anything.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from gpurig.deploy.delivery import DISK_FULL_FIX, Delivery, DeliveryError, DeliveryInterrupted
from gpurig.deploy.fanout import FanOut, NotThisWay
from gpurig.deploy.fanouttree import Member
from gpurig.deploy.peerlink import PeerLinkError
from gpurig.deploy.stages import Staged

REF = "pytorch:slim"
IMAGE = SimpleNamespace(id="sha256:" + "a" * 64, size=1000)
TARGET = SimpleNamespace(image_ref=REF, image=IMAGE)
REGISTRY_PORT = 5000


class Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self._stop = threading.Event()

    @property
    def interrupted(self) -> bool:
        return self._stop.is_set()

    def interrupt(self) -> None:
        self._stop.set()
        for other in getattr(self, "passed_on", ()):
            other.interrupt()

    def pass_interrupts_to(self, other) -> None:  # as gpurig.connect.connection.Connection's
        self.passed_on = [*getattr(self, "passed_on", ()), other]


class Engine:
    def __init__(self, name: str, has: bool = False) -> None:
        self.name, self.has, self.tags = name, has, []

    def image(self, ref):
        return SimpleNamespace(id=IMAGE.id) if self.has else None

    def tag(self, image_id, ref):
        self.tags.append(ref)


class Thing:
    """A cache, link or forward: its port, and whether it was closed."""

    def __init__(self, log, what: str, host: str, port: int) -> None:
        self.log, self.what, self.host, self.port = log, what, host, port
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.log.append(("close", self.what, self.host))

    def stop(self) -> dict:
        self.close()
        return {"fetched": 1000, "served": 3000, "blobs": 3}


class Hosts:
    """The fake host side: refuses links to addresses in ``refused``; a pull by a host in ``hold`` waits for its Event."""

    def __init__(self) -> None:
        self.log: list = []
        self.things: list[Thing] = []
        self.refused: set[str] = set()
        self.hold: dict[str, threading.Event] = {}
        self.pulling: dict[str, threading.Event] = {}
        self.fail_once: set[str] = set()  # hosts whose first pull breaks off
        self.fails: dict[str, int] = {}  # hosts whose first n pulls break off (their cache died, say)
        self.done: dict[str, threading.Event] = {}  # a host's pull that completed
        self.stalls: dict[str, int] = {}  # hosts whose first n pulls get no byte until gone() says why
        self.stalled: dict[str, threading.Event] = {}  # ... and are waiting
        self.ports = iter(range(40000, 41000))
        self.lock = threading.Lock()

    def _make(self, what: str, host: str) -> Thing:
        with self.lock:
            thing = Thing(self.log, what, host, next(self.ports))
            self.things.append(thing)
            self.log.append(("open", what, host))
        return thing

    def start_cache(self, conn, upstream_port, on_end):
        cache = self._make("cache", conn.name)
        cache.on_end = on_end  # a test ends it unasked, as a killed cache's channel does
        return cache

    def open_link(self, server, puller, address, port, ssh_port):
        if address in self.refused:
            raise PeerLinkError(f"cannot reach {server.name} at {address}:{ssh_port} over SSH: No route to host", "", host=puller.name)
        return self._make(f"link {server.name}", puller.name)

    def open_forward(self, conn, port, meter):
        assert port == REGISTRY_PORT
        meter.add(down=IMAGE.size)  # what the host's side fetched through it
        return self._make("forward", conn.name)

    def pull(self, engine, conn, ref, image_id, port, moved, staged, progress, say, how, gone):
        self.pulling.setdefault(conn.name, threading.Event()).set()
        if conn.name in self.hold:
            assert self.hold[conn.name].wait(10)
        with self.lock:
            stalls = self.stalls.get(conn.name, 0)
            self.stalls[conn.name] = stalls - 1
        if stalls > 0:  # no byte comes, as through a dead cache: the engine says an event a second (its retry countdown)
            self.stalled.setdefault(conn.name, threading.Event()).set()
            for _ in range(200):
                why = gone()
                if why:
                    self.log.append(("ended pull", conn.name, port))
                    raise DeliveryError(f"pulling {how[1]} failed: {why}", "deploy again", host=conn.name)
                threading.Event().wait(0.05)
            raise AssertionError(f"{conn.name}'s stalled pull was never told its source is gone")
        if conn.name in self.fail_once:
            self.fail_once.discard(conn.name)
            raise DeliveryError("pulling from h1's layer cache failed: unexpected EOF", "deploy again", host=conn.name)
        with self.lock:
            failing = self.fails.get(conn.name, 0)
            self.fails[conn.name] = failing - 1
            if failing > 0:
                self.log.append(("failed pull", conn.name, port))
                raise DeliveryError(f"pulling {how[1]} failed: connection refused", "deploy again", host=conn.name)
            self.log.append(("pull", conn.name, port))
        self.done.setdefault(conn.name, threading.Event()).set()
        return IMAGE.size

    def open_things(self) -> list[Thing]:
        return [t for t in self.things if not t.closed]


class Build:
    def __init__(self, fails: str = "") -> None:
        self.fails, self.prepared = fails, 0

    def prepare(self, ref, image_id, conn, progress, say):
        if self.fails:
            raise NotThisWay(self.fails)
        self.prepared += 1
        return REGISTRY_PORT

    def staged(self, ref):
        return Staged((), ())

    def close(self):
        pass


def plain(engine, conn, t, say):
    return Delivery("save-load", 5000, IMAGE.id)


def run(fan: FanOut, names: list[str], *, fail: set[str] = frozenset(), present: set[str] = frozenset(), never: set[str] = frozenset(),
        conns: dict | None = None) -> dict[str, object]:
    """Each host's work in a thread of its own, as run_hosts runs them: the delivery (or a failure before it); results by host."""
    results: dict[str, object] = {}
    conns = conns if conns is not None else {}

    def work(conn):
        if conn.name in fail:
            raise RuntimeError("refused before delivery")
        return fan(Engine(conn.name, conn.name in present), conn, TARGET, lambda text: None)

    def one(name):
        conn = conns.setdefault(name, Conn(name))
        try:
            results[name] = fan.wrap(work)(conn)
        except Exception as err:  # noqa: BLE001 - the test looks at it
            results[name] = err

    threads = [threading.Thread(target=one, args=(n,)) for n in names if n not in never]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a host's work never ended"
    return results


def fanout(names, hosts: Hosts, build: Build | None = None, k: int = 3, peers: dict | None = None, **kw) -> FanOut:
    members = [Member(n, address=f"10.0.0.{i + 1}", peer=(peers or {}).get(n, True)) for i, n in enumerate(names)]
    return FanOut({REF: members}, plain, build or Build(), hosts, k=k, **kw)


def test_one_forward_from_the_build_machine_and_every_other_host_through_the_first_hosts_cache():
    names = ["h0", "h1", "h2", "h3"]
    hosts = Hosts()
    fan = fanout(names, hosts)
    got = run(fan, names)
    assert [got[n].source for n in names] == ["the build machine", "h0", "h0", "h0"]
    assert all(got[n].method == "fan-out" and not got[n].note for n in names)
    assert [e for e in hosts.log if e[0] == "open"] .count(("open", "forward", "h0")) == 1
    assert not [e for e in hosts.log if e[:2] == ("open", "forward") and e[2] != "h0"]  # one forward in all
    assert not hosts.open_things()  # the cache, the links, the forward: all closed
    summary = fan.summary()[0]
    assert summary["sent"] == IMAGE.size and summary["received"] == 4 * IMAGE.size
    cache = next(t for t in hosts.things if t.what == "cache")
    assert ("pull", "h0", cache.port) in hosts.log  # the parent pulls from its own cache too
    fan.close()


def test_a_parent_keeps_its_cache_until_its_children_finished_their_pulls():
    names = ["h0", "h1", "h2"]
    hosts = Hosts()
    hosts.hold["h2"] = threading.Event()
    fan = fanout(names, hosts)
    done = threading.Event()
    threading.Thread(target=lambda: (run(fan, names), done.set()), daemon=True).start()
    assert hosts.pulling.setdefault("h2", threading.Event()).wait(10)  # h2 is pulling through h0's cache
    cache = next(t for t in hosts.things if t.what == "cache")
    assert not cache.closed and not done.is_set()
    hosts.hold["h2"].set()
    assert done.wait(10)
    log = hosts.log
    assert log.index(("close", "link h0", "h2")) < log.index(("close", "cache", "h0")) < log.index(("close", "forward", "h0"))


def test_an_unreachable_parent_sends_its_children_up_and_their_note_says_why():
    names = ["h0", "h1", "h2", "h3"]
    hosts = Hosts()
    hosts.refused.add("10.0.0.2")  # h1's address, as its children reach it
    got = run(fanout(names, hosts, k=1), names)  # a chain: h0 <- h1 <- h2 <- h3
    assert got["h2"].source == "h0"
    assert got["h2"].note == ("h2 cannot reach h1 at 10.0.0.2:22: cannot reach h1 at 10.0.0.2:22 over SSH: No route to host: "
                              "delivered from h0")
    assert got["h3"].source == "h2" and not got["h3"].note
    assert not hosts.open_things()


def test_a_parent_that_fails_before_its_delivery_releases_its_children_to_the_build_machine():
    names = ["h0", "h1", "h2"]
    hosts = Hosts()
    build = Build()
    got = run(fanout(names, hosts, build), names, fail={"h0"})
    assert isinstance(got["h0"], RuntimeError)
    assert got["h1"].source == got["h2"].source == "the build machine"  # h0 was the parent of both
    assert got["h1"].note.startswith("h1 h0 does not serve: it did not deliver the image") and got["h1"].note.endswith(
        "delivered from the build machine")
    assert not hosts.open_things()


def test_a_parent_with_the_image_already_serves_no_one_and_says_so():
    names = ["h0", "h1"]
    hosts = Hosts()
    got = run(fanout(names, hosts), names, present={"h0"})
    assert got["h0"].method == "present" and got["h0"].bytes_moved == 0
    assert got["h1"].source == "the build machine" and f"h0 does not serve: {REF} was on it already" in got["h1"].note
    assert not [t for t in hosts.things if t.what == "cache"]


def test_a_parent_whose_work_never_begins_is_waited_for_a_bounded_time():
    names = ["h0", "h1"]
    hosts = Hosts()
    got = run(fanout(names, hosts, start_grace_s=0.3), names, never={"h0"})  # h0 unreachable: its work never runs
    assert got["h1"].source == "the build machine" and "its deploy had not begun after 0 s" in got["h1"].note


def test_peer_false_serves_no_one_and_its_hosts_pull_from_the_build_machine():
    names = ["h0", "h1"]
    hosts = Hosts()
    got = run(fanout(names, hosts, peers={"h0": False}), names)
    assert got["h0"].source == got["h1"].source == "the build machine" and not got["h1"].note
    assert not [t for t in hosts.things if t.what == "cache"]  # no host has children: no cache anywhere


def test_where_the_build_machine_cannot_feed_fan_out_the_host_takes_todays_path_and_says_why():
    names = ["h0", "h1"]
    hosts = Hosts()
    got = run(fanout(names, hosts, Build(fails="no docker-registry on this machine")), names)
    assert got["h0"].method == "save-load" and got["h0"].note == "no fan-out: no docker-registry on this machine"
    assert got["h1"].method == "save-load" and "h0 does not serve: it could not use fan-out" in got["h1"].note


def test_ctrl_c_while_a_child_waits_ends_it_and_close_leaves_nothing_open():
    names = ["h0", "h1", "h2"]
    hosts = Hosts()
    hosts.hold["h0"] = threading.Event()  # h0 serves (its cache is up) and pulls
    fan = fanout(names, hosts)
    conns: dict = {}
    done = threading.Event()
    results: dict = {}
    threading.Thread(target=lambda: (results.update(run(fan, names, conns=conns)), done.set()), daemon=True).start()
    assert hosts.pulling.setdefault("h0", threading.Event()).wait(10)
    for c in list(conns.values()):
        c.interrupt()
    hosts.hold["h0"].set()
    assert done.wait(10)
    fan.close()
    assert not hosts.open_things() and set(results) == set(names)  # every host's work ended, nothing left open


def test_a_child_waiting_on_its_parent_is_stopped_by_ctrl_c():
    hosts = Hosts()
    fan = fanout(["h0", "h1"], hosts)
    fan.started("h0")  # begun, but it never gets to serve
    conn = Conn("h1")
    conn.interrupt()
    with pytest.raises(DeliveryInterrupted):
        fan(Engine("h1"), conn, TARGET, lambda text: None)


def test_the_table_and_the_json_name_where_a_fanned_out_image_came_from():
    from gpurig.deploy.apply import container_doc
    from gpurig.flows.fleetdeploy import deploy_cells
    from gpurig.status import Status
    from gpurig.steps.plan import StepResult

    details = {"image": REF, "delivery": "fan-out", "delivery_source": "a100-01", "bytes_moved": 1_100_000_000,
               "delivery_note": "a100-03 cannot reach a100-02 at 10.0.0.2:22: refused: delivered from a100-01"}
    r = StepResult("gpurig-slim", Status.CHANGED, "", (), details=details)
    action, image, moved, reason = deploy_cells(r, check=False)
    assert moved == "1.10 GB (fan-out from a100-01)" and reason.endswith("delivered from a100-01")
    doc = container_doc(r)
    assert (doc["delivery"], doc["delivery_source"], doc["bytes_moved"]) == ("fan-out", "a100-01", 1_100_000_000)
    plain = StepResult("gpurig-slim", Status.CHANGED, "", (), details={**details, "delivery": "forward", "delivery_source": ""})
    assert deploy_cells(plain, check=False)[2] == "1.10 GB (forward)"  # today's path reads as before


def test_a_host_serving_no_one_whose_pull_from_its_parent_breaks_tries_further_up():
    names = ["h0", "h1", "h2"]
    hosts = Hosts()
    hosts.fail_once.add("h2")
    got = run(fanout(names, hosts, k=1), names)  # h0 <- h1 <- h2
    assert got["h2"].source == "h0"
    assert got["h2"].note == "h2 could not pull from h1's layer cache: pulling from h1's layer cache failed: unexpected EOF: delivered from h0"
    assert not hosts.open_things()


def test_a_full_disk_is_not_tried_again_elsewhere():
    names = ["h0", "h1"]
    hosts = Hosts()
    real_pull = hosts.pull

    def full(engine, conn, *args):
        if conn.name == "h1":
            raise DeliveryError("the host's disk is full (no space left on device)", DISK_FULL_FIX, host="h1")
        return real_pull(engine, conn, *args)

    hosts.pull = full
    got = run(fanout(names, hosts), names)
    assert isinstance(got["h1"], DeliveryError) and got["h1"].fix == DISK_FULL_FIX
    assert not hosts.open_things()


def test_a_serving_host_whose_own_pull_through_its_cache_breaks_pulls_straight_and_serves_no_one_after():
    names = ["h0", "h1", "h2"]
    hosts = Hosts()
    hosts.fails["h0"] = 1  # its cache died under its own pull
    hosts.hold["h0"] = threading.Event()
    fan = fanout(names, hosts, start_grace_s=0.3)
    results: dict = {}
    done = threading.Event()
    threading.Thread(target=lambda: (results.update(run(fan, names, never={"h2"})), done.set()), daemon=True).start()
    assert hosts.done.setdefault("h1", threading.Event()).wait(10)  # h1 pulled through h0's cache before it broke
    hosts.hold["h0"].set()
    assert done.wait(10)
    cache, forward = (next(t for t in hosts.things if t.what == what and t.host == "h0") for what in ("cache", "forward"))
    assert hosts.log.index(("failed pull", "h0", cache.port)) < hosts.log.index(("pull", "h0", forward.port))  # then straight
    assert results["h0"].source == "the build machine" and results["h0"].note == (
        "h0 could not pull from the build machine through its own layer cache: pulling from the build machine through its own layer "
        "cache failed: connection refused: delivered from the build machine")
    assert results["h1"].source == "h0"
    late = run(fan, ["h2"])["h2"]  # a host that comes after the break is sent up, and says why
    assert late.source == "the build machine"
    assert late.note == ("h2 h0 does not serve: its layer cache failed: pulling from the build machine through its own layer cache "
                         "failed: connection refused: delivered from the build machine")
    assert not hosts.open_things() and [t.what for t in hosts.things].count("cache") == 1


def test_a_serving_host_whose_link_up_breaks_too_goes_further_up_for_itself():
    names = ["h0", "h1", "h2"]
    hosts = Hosts()
    hosts.fails["h1"] = 2  # through its own cache, then straight through its link to h0: both refused
    got = run(fanout(names, hosts, k=1), names)  # h0 <- h1 <- h2
    assert got["h1"].method == "fan-out" and got["h1"].source == "the build machine"
    assert got["h1"].note.startswith("h1 could not pull from h0's layer cache through its own layer cache: pulling from h0's layer "
                                     "cache through its own layer cache failed: connection refused; ")
    assert "; could not pull from h0's layer cache: pulling from h0's layer cache failed: connection refused: " in got["h1"].note
    assert got["h1"].note.endswith(": delivered from the build machine")
    assert isinstance(got["h2"], Delivery) and got["h2"].source in ("h0", "h1")
    assert not hosts.open_things()


def test_the_hosts_that_serve_are_known_before_anything_moves():
    fan = fanout(["h0", "h1", "h2", "h3", "h4"], Hosts(), peers={"h1": False})
    assert [sorted(fan.serves(h)) for h in ("h0", "h1", "h2", "h4")] == [[REF], [], [REF], []]  # h4 joined h2 (h1 serves no one)


DIED = "the layer cache on h0 ended before its pulls did (its process ended, or the connection to the host dropped)"


def stalled_run(fan: FanOut, hosts: Hosts, names: list[str]) -> dict:
    """``run`` in a thread, until every host in ``hosts.stalls`` waits on a stalled pull; then h0's cache ends unasked."""
    results: dict = {}
    done = threading.Event()
    stalling = [h for h, n in hosts.stalls.items() if n > 0]
    threading.Thread(target=lambda: (results.update(run(fan, names)), done.set()), daemon=True).start()
    for host in stalling:
        assert hosts.stalled.setdefault(host, threading.Event()).wait(10), f"{host} never pulled"
    next(t for t in hosts.things if t.what == "cache" and t.host == "h0").on_end(DIED)
    assert done.wait(10)  # not the engine's retries: every pull through the dead cache ended at its next event
    return results


def test_a_serving_hosts_cache_that_ends_unasked_ends_every_pull_through_it_at_once_and_they_go_up():
    names = ["h0", "h1", "h2"]
    hosts = Hosts()
    hosts.stalls = {"h0": 1, "h1": 1, "h2": 1}
    got = stalled_run(fanout(names, hosts), hosts, names)  # h1, h2 <- h0
    assert got["h0"].source == "the build machine" and got["h0"].note == (
        f"h0 could not pull from the build machine through its own layer cache: pulling from the build machine through its own "
        f"layer cache failed: {DIED}: delivered from the build machine")
    for child in ("h1", "h2"):
        assert got[child].source == "the build machine", got[child]
        assert got[child].note == (f"{child} could not pull from h0's layer cache: pulling from h0's layer cache failed: {DIED}: "
                                   "delivered from the build machine")
    assert [e[1] for e in hosts.log if e[0] == "ended pull"] and not hosts.open_things()


def test_a_cache_that_ends_unasked_ends_the_pulls_through_the_caches_it_feeds_too():
    names = ["h0", "h1", "h2"]
    hosts = Hosts()
    hosts.stalls = {"h1": 2, "h2": 1}  # h1 through its own cache (fed by h0's), then straight through its link to h0
    got = stalled_run(fanout(names, hosts, k=1), hosts, names)  # h0 <- h1 <- h2
    assert got["h0"].source == "the build machine" and not got["h0"].note  # its own pull had ended before
    assert got["h1"].source == "the build machine"
    assert got["h1"].note.startswith("h1 could not pull from h0's layer cache through its own layer cache: ")
    assert f"could not pull from h0's layer cache: pulling from h0's layer cache failed: {DIED}: delivered" in got["h1"].note
    assert got["h2"].source == "the build machine"  # neither cache above it serves now, and its note says why
    assert got["h2"].note == (f"h2 could not pull from h1's layer cache: pulling from h1's layer cache failed: {DIED}; "
                              f"h0 does not serve: {DIED}: delivered from the build machine")
    assert not hosts.open_things()
