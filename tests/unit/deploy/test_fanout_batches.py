"""Fan-out across a rollout's batches and among a Slurm job's nodes, with the fakes of test_fanout.py.

A batch is one fleet run: its hosts' work runs in threads and ends before the next batch begins, as run_batches runs
them. A host that serves later batches runs its cache on a connection fan-out holds (``own``), here a fake that records
whether it was closed.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from gpurig.deploy import fanoutwire
from gpurig.deploy.fanout import FanOut
from gpurig.deploy.fanouttree import Member, plan_tree
from gpurig.results import HostResult, Outcome
from gpurig.status import Status
from tests.unit.deploy.test_fanout import IMAGE, REF, TARGET, Build, Conn, Engine, Hosts, plain, run


class Held(Conn):
    """A connection fan-out opened itself for a serving host."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.closed = False

    def connect(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class HeldHosts(Hosts):
    """Hosts that also record which kind of connection each cache, link and forward runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.on: list[tuple[str, str, str]] = []

    def start_cache(self, conn, upstream_port, on_end):
        self.on.append(("cache", conn.name, type(conn).__name__))
        return super().start_cache(conn, upstream_port, on_end)

    def open_forward(self, conn, port, meter):
        self.on.append(("forward", conn.name, type(conn).__name__))
        return super().open_forward(conn, port, meter)


def batched(names, hosts, opened: dict, **kw) -> FanOut:
    members = [Member(n, address=f"10.0.0.{i + 1}") for i, n in enumerate(names)]
    return FanOut({REF: members}, plain, Build(), hosts, own=lambda host: opened.setdefault(host, Held(host)), label="rollout", **kw)


def test_the_tree_over_the_hosts_in_batch_order_puts_every_parent_in_its_childs_batch_or_before():
    from gpurig.flows.fleetrollout import in_batches

    chosen = [SimpleNamespace(name=n) for n in ("a", "b", "c", "d", "e", "f", "g")]  # inventory order
    batches = [["e"], ["a", "g"], ["b", "c", "d", "f"]]
    order = in_batches(chosen, batches)
    assert [h.name for h in order] == ["e", "a", "g", "b", "c", "d", "f"]
    parents = plan_tree([Member(h.name) for h in order])
    batch_of = {n: i for i, names in enumerate(batches) for n in names}
    assert parents["e"] is None and parents["a"] == parents["g"] == "e"  # the canary serves the first batch
    assert all(p is None or batch_of[p] <= batch_of[h] for h, p in parents.items())


def test_a_later_batch_pulls_from_an_earlier_batchs_host_whose_own_work_has_ended():
    hosts, opened = HeldHosts(), {}
    fan = batched(["h0", "h1", "h2"], hosts, opened, wait_s=60, start_grace_s=60)
    fan.begin(["h0"])
    canary = run(fan, ["h0"])  # its work ends at once: nothing waits for the hosts of the next batch
    assert canary["h0"].source == "the build machine"
    assert [(w, kind) for w, _, kind in hosts.on] == [("forward", "Held"), ("cache", "Held")]  # both on fan-out's own connection
    cache = next(t for t in hosts.things if t.what == "cache")
    assert not cache.closed and not opened["h0"].closed  # the batch is over, h0 still serves
    fan.begin(["h1", "h2"])
    later = run(fan, ["h1", "h2"])
    assert later["h1"].source == later["h2"].source == "h0" and not later["h1"].note
    assert [e for e in hosts.log if e[:2] == ("open", "forward")] == [("open", "forward", "h0")]  # the build machine sent it once
    fan.close()
    assert not hosts.open_things() and all(c.closed for c in opened.values())
    assert fan.summary()[0]["sent"] == IMAGE.size


def test_a_ctrl_c_on_a_serving_hosts_connection_reaches_the_connection_fan_out_holds_for_it():
    hosts, opened, conns = HeldHosts(), {}, {}
    fan = batched(["h0", "h1"], hosts, opened, wait_s=60, start_grace_s=60)
    fan.begin(["h0"])
    run(fan, ["h0"], conns=conns)
    assert not opened["h0"].interrupted
    conns["h0"].interrupt()  # the fleet's Ctrl-C knows only the host's own connection
    assert opened["h0"].interrupted  # what its work waited on there (a cache starting, a link opening) stops too
    fan.close()


def test_a_host_that_holds_the_image_already_still_serves_the_later_batches_through_a_cache():
    hosts, opened = HeldHosts(), {}
    fan = batched(["h0", "h1", "h2"], hosts, opened)
    fan.begin(["h0"])
    canary = run(fan, ["h0"], present={"h0"})  # a rollout tried before left the image there
    assert (canary["h0"].method, canary["h0"].bytes_moved) == ("present", 0)
    assert not [e for e in hosts.log if e[0] == "pull"]  # it pulled nothing; its cache fetches what its children ask for
    fan.begin(["h1", "h2"])
    later = run(fan, ["h1", "h2"])
    assert later["h1"].source == later["h2"].source == "h0" and not later["h1"].note
    fan.close()
    assert not hosts.open_things() and all(c.closed for c in opened.values())


def test_a_cache_no_host_still_to_come_needs_stops_when_the_next_batch_begins():
    hosts, opened = HeldHosts(), {}
    fan = batched(["h0", "h1", "h2"], hosts, opened, k=1)  # a chain: h0 <- h1 <- h2
    fan.begin(["h0"])
    run(fan, ["h0"])
    fan.begin(["h1"])
    run(fan, ["h1"])
    fan.begin(["h2"])  # h0's subtree still has h2 to come: both keep serving
    assert not [t for t in hosts.things if t.what == "cache" and t.closed]
    run(fan, ["h2"])
    fan.begin([])  # everyone below is done
    assert not hosts.open_things()
    fan.close()
    assert all(c.closed for c in opened.values())


def test_a_parent_of_an_earlier_batch_that_never_began_is_not_waited_for():
    hosts, opened = HeldHosts(), {}
    fan = batched(["h0", "h1"], hosts, opened, start_grace_s=60)
    fan.begin(["h0"])
    run(fan, ["h0"], never={"h0"})  # unreachable: its work never ran
    fan.begin(["h1"])
    got = run(fan, ["h1"])
    assert got["h1"].source == "the build machine"
    assert got["h1"].note == "h1 h0 does not serve: its rollout never began (its batch ended without it): delivered from the build machine"
    fan.close()


class Connector:
    def __init__(self, opened: dict) -> None:
        self.opened, self.closed = opened, False

    def open(self, host) -> Held:
        return self.opened.setdefault(host.name, Held(host.name))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def rollout_fakes(monkeypatch):
    """run_batches and batch_fanout over fake hosts: the fan-out's fakes, a fake connector, a run_hosts of threads."""
    from gpurig.deploy import rollhost
    from gpurig.flows import fleettask

    hosts, opened = HeldHosts(), {}
    connector = Connector(opened)
    made: list[FanOut] = []
    stop_in: set[str] = set()  # a batch with one of these hosts is interrupted (Ctrl-C) once its hosts' work ended

    def fleet_fanout(chosen, targets, inventory, **kw):
        made.append(FanOut({REF: [Member(h.name, address=h.name) for h in chosen]}, plain, Build(), hosts, own=kw["own"], label=kw["label"]))
        return made[-1]

    def run_hosts(opts, chosen, work, **kw):
        results = {}

        def one(h):
            out = work(Conn(h.name))
            results[h.name] = HostResult(h.name, out.resolved, out.detail, out.data)

        threads = [threading.Thread(target=one, args=(h,)) for h in chosen]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        if stop_in & {h.name for h in chosen}:
            raise KeyboardInterrupt
        return SimpleNamespace(results=[results[h.name] for h in chosen])

    def roll_host(conn, job):
        d = made[-1](Engine(conn.name), conn, TARGET, lambda text: None)
        if conn.name in job.fail:
            return Outcome(status=Status.FAILED, detail="rolled back: verify failed", data={"delivery": d.method})
        return Outcome(changed=True, detail="new image, verify passed", data={"delivery": d.method, "delivery_source": d.source})

    monkeypatch.setattr(fanoutwire, "fleet_fanout", fleet_fanout)
    monkeypatch.setattr(fleettask, "make_connector", lambda opts: connector)
    monkeypatch.setattr(fleettask, "run_hosts", run_hosts)
    monkeypatch.setattr(rollhost, "roll_host", roll_host)
    return SimpleNamespace(hosts=hosts, opened=opened, connector=connector, stop_in=stop_in)


def roll(fakes, batches, fail=(), max_fail=0):
    from gpurig.flows.fleetrollout import batch_fanout, in_batches, run_batches

    chosen = [SimpleNamespace(name=n) for names in batches for n in names]
    opts = SimpleNamespace(settings=SimpleNamespace(inventory="hosts.yaml"))
    labels = {n: str(i) for i, names in enumerate(batches) for n in names}
    with batch_fanout(opts, in_batches(chosen, batches), {}, None, object(), plain, None) as fan:
        return run_batches(opts, chosen, batches, labels, SimpleNamespace(fail=set(fail)), max_fail, fan)


def test_a_rollout_stopped_by_max_fail_closes_every_cache_link_forward_and_connection(rollout_fakes):
    results = roll(rollout_fakes, [["h0"], ["h1", "h2", "h3"], ["h4", "h5", "h6"]], fail={"h1"})
    assert set(results) == {"h0", "h1", "h2", "h3"}  # stopped after the first batch: h4-h6 never reached
    assert results["h2"].data["delivery_source"] == "h0"
    assert not rollout_fakes.hosts.open_things()  # h1's cache, kept for h4-h6, closed with the rest
    assert rollout_fakes.opened and all(c.closed for c in rollout_fakes.opened.values()) and rollout_fakes.connector.closed


def test_a_rollout_interrupted_between_batches_leaves_nothing_open(rollout_fakes):
    rollout_fakes.stop_in.add("h1")
    with pytest.raises(KeyboardInterrupt):
        roll(rollout_fakes, [["h0"], ["h1", "h2"], ["h3"]])
    assert not rollout_fakes.hosts.open_things()
    assert all(c.closed for c in rollout_fakes.opened.values()) and rollout_fakes.connector.closed


def test_a_slurm_jobs_nodes_share_the_image_through_fan_out_and_close_it(monkeypatch):
    from gpurig.jobs.submit import JobTarget
    from gpurig.slurm import scheduler

    hosts, sent = Hosts(), []
    monkeypatch.setattr(fanoutwire, "find_registry_binary", lambda: "/usr/bin/docker-registry")
    monkeypatch.setattr(fanoutwire, "RegistrySide", lambda local: Build())
    monkeypatch.setattr(fanoutwire, "RealHosts", lambda: hosts)
    monkeypatch.setattr(fanoutwire, "members", lambda chosen, targets, inventory: {
        ref: [Member(h.name, address=h.name) for h in chosen] for ref in {t.image_ref for ts in targets.values() for t in ts}})
    nodes = [SimpleNamespace(name=f"node{i}") for i in range(4)]

    def send_from(engine, conn, ref):  # a job's deliver (jobs.placement): never used where fan-out serves
        sent.append(conn.name)

    delivered = {}

    def prepare(conn, target, login, check):  # the node's part of scheduler.prepare that delivers
        if not check:
            delivered[conn.name] = target.deliver(Engine(conn.name), conn, target.image_ref)
        return Outcome(changed=True)

    monkeypatch.setattr(scheduler, "prepare", prepare)
    monkeypatch.setattr(scheduler, "fleet", lambda reach, chosen, work: threaded(chosen, work))

    def fan_out(chosen):  # what jobs.placement gives a job's target
        return fanoutwire.job_fanout(chosen, REF, IMAGE, "hosts.yaml", registry=None, local=object(), plain=send_from)

    target = JobTarget(None, "slurm", "key", None, image_ref=REF, image=IMAGE, deliver=send_from, fan_out=fan_out)
    # --check: the plan (who would pull from whom, the image's size), and nothing delivers or opens
    assert scheduler.prepare_nodes(None, nodes, target, "root", check=True)[1] == [
        {"image": REF, "size": IMAGE.size, "tree": {"node0": None, "node1": "node0", "node2": "node0", "node3": "node0"}}]
    assert not delivered and not hosts.things
    _, summary = scheduler.prepare_nodes(None, nodes, target, "root", check=False)
    assert delivered["node0"].source == "the build machine" and {delivered[f"node{i}"].source for i in (1, 2, 3)} == {"node0"}
    assert [(s["image"], s["sent"], {h: d["source"] for h, d in s["hosts"].items()}) for s in summary] == [
        (REF, IMAGE.size, {"node0": "the build machine", "node1": "node0", "node2": "node0", "node3": "node0"})]
    assert not sent and not hosts.open_things()
    assert fanoutwire.job_fanout(nodes[:1], REF, IMAGE, "hosts.yaml", registry=None, local=object(), plain=send_from) is None


def threaded(chosen, work):
    results = {}
    threads = [threading.Thread(target=lambda h=h: results.__setitem__(h.name, work(Conn(h.name)))) for h in chosen]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return SimpleNamespace(results=[results[h.name] for h in chosen])


def test_a_rollout_row_says_what_the_hosts_delivery_moved_and_from_where():
    from gpurig.deploy.rollplan import RolloutState
    from gpurig.flows.fleetrollout import row_for

    state = RolloutState(None, {"hosts": {}})
    moved = {"delivery": "fan-out", "delivery_source": "gpu01", "bytes_moved": 1_100_000_000, "delivery_note": ""}
    results = {"gpu02": HostResult("gpu02", Status.CHANGED, "", moved), "gpu03": HostResult("gpu03", Status.FAILED, "unreachable")}
    labels = {"gpu02": "1", "gpu03": "1", "gpu04": "2"}
    assert row_for("gpu02", labels, results, state)[-1] == "1.10 GB (fan-out from gpu01)"
    assert row_for("gpu03", labels, results, state)[-1] == row_for("gpu04", labels, results, state)[-1] == ""


def test_a_slurm_jobs_recap_names_each_nodes_source_and_why_it_did_not_pull_from_its_parent(capsys):
    from gpurig.flows.fleetdeploy import print_fanout

    summary = [{"image": REF, "size": 300_000_000, "sent": 100_000_000, "received": 200_000_000, "tree": {},
                "hosts": {"node0": {"source": "the build machine", "bytes": 100_000_000, "method": "fan-out"},
                          "node1": {"source": "the build machine", "bytes": 100_000_000, "method": "fan-out",
                                    "note": "node1 cannot reach node0 at 10.0.0.5:22: refused: delivered from the build machine"},
                          "node2": {"source": "", "bytes": 0, "method": "present"}}}]
    print_fanout(summary)  # a deploy's: its table carries each host
    assert capsys.readouterr().err.count("\n") == 1
    print_fanout(summary, notes=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"fan-out of {REF}: 100.00 MB out of the build machine for 3 hosts")
    assert lines[1:] == ["  node0: 100.00 MB by fan-out from the build machine",
                         "  node1: 100.00 MB by fan-out from the build machine (node1 cannot reach node0 at 10.0.0.5:22: refused: "
                         "delivered from the build machine)",
                         "  node2: had it already"]
