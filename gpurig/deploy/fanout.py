"""Fleet delivery: an image sent into the fleet about once, the hosts of one deploy passing its layers to each other.

``FanOut`` is shared by the host threads of one `gpurig deploy` (or one
`gpurig rollout`, or the nodes of one Slurm job) and called like
``imagesource.mover``'s deliver. The tree is fixed first
(gpurig.deploy.fanouttree). A host that has children in it starts a layer
cache (checks/layer_cache.py, gpurig.deploy.layercache) on its loopback
whose upstream is its own parent: the build machine's registry through a
reverse forward (the image pushed there once), or its parent's cache through
a peer link (gpurig.deploy.peerlink); its dockerd pulls from that cache while
the children pull through it too. A host without children pulls straight
through its forward or link. Every pull uses delivery's stages, temporary
name, id check and tag (``delivery.pull_through``).

A child waits for its parent's cache (bounded); when the parent will not
serve (the image was there already, its deploy ended before its delivery,
the link was refused, the wait ran out) it goes to the parent's parent, up
to the build machine, and its note says why. A serving host whose own pull
through its cache fails (the cache died) pulls straight through its forward
or link and serves no one from then on (further up where that fails too);
the hosts pulling through it go up as well. A cache whose channel ends
unasked (its process killed, its host's connection lost) ends every pull
through it, and through the caches it feeds, at the engine's next event
(``_gone``), not after the engine's own retries. Where fan-out cannot be used at
all for a host (no docker-registry here, the forward refused), that host
takes today's path (``plain``). A parent keeps its cache and its own link
until every started host below it has finished its pull and closed its
link; ``host_done`` (each host's work ends with it: success, failure,
Ctrl-C) then stops the cache and closes its links and forward; ``close``
ends whatever is left.

A rollout's batches are fleet runs one after another, so a parent's work
(and its connection) ends before its later batches' children pull: given
``own`` (a connection fan-out holds), a serving host runs its cache and
what feeds it there, serves past its own work, even holding the image
already (its cache then fetches what its children ask for); ``begin``
starts each batch (the start grace, hosts that never began, idle caches
stopped) and ``close``, in the rollout's ``finally``, ends the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpurig.connect.connection import ChannelError
from gpurig.connect.forward import Meter
from gpurig.deploy import delivery
from gpurig.deploy.delivery import Delivery
from gpurig.deploy.fanoutsides import BuildSide, Deliver, HostSide, Node, NotThisWay, Wanted, close_quietly, gone_through, note, summarise
from gpurig.deploy.fanouttree import BUILD_MACHINE, K, Member, chain, descendants, plan_tree
from gpurig.errors import GpurigError

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.connect.engine import Engine

log = logging.getLogger(__name__)

WAIT_S = 1800.0  # how long a host waits for its parent's cache (the parent may be pushing a big image first)
START_GRACE_S = 30.0  # from the run's start, how long a host whose work has not begun is waited for (unreachable: it never will)
TICK_S = 0.2  # how often a wait looks at Ctrl-C


class FanOut:
    """The deliver callable of one deploy run over several hosts (``__call__``), with ``wrap`` for each host's work."""

    def __init__(self, members: Mapping[str, Sequence[Member]], plain: Deliver, build: BuildSide, hosts: HostSide, *,
                 progress_for: Callable[[Connection, Wanted], Callable[[int, int], None]] = lambda conn, t: lambda done, total: None,
                 k: int = K, wait_s: float = WAIT_S, start_grace_s: float = START_GRACE_S, own: Callable[[str], Connection] | None = None,
                 label: str = "deploy") -> None:
        self.plans = {ref: plan_tree(ms, k) for ref, ms in members.items() if len(ms) > 1}
        self.nodes = {ref: {m.host: Node(m, self.plans[ref][m.host]) for m in ms} for ref, ms in members.items() if ref in self.plans}
        self.plain, self.build, self.hosts, self.progress_for = plain, build, hosts, progress_for
        self.wait_s, self.start_grace_s = wait_s, start_grace_s
        self.cond = threading.Condition()
        self.forwards: list[tuple[str, Meter]] = []  # (image, meter) of every forward from the build machine
        self.sizes: dict[str, int] = {}
        self.delivered: dict[str, dict[str, Delivery]] = {}
        self.closed = False
        self.t0: float | None = None  # when the first host's work began (a rollout: its batch)
        self.own, self.label = own, label  # ``own(host)``: a connection fan-out holds (a rollout); what a host's work is called
        self.held: list[Connection] = []
        self.begun: set[str] = set()  # a rollout: the hosts of the batches begun so far
        self.over: set[str] = set()  # ... and of those before the current one (a host there that never began, never will)

    # --- each host's work ------------------------------------------------------------------------

    def wrap(self, work: Callable[[Connection], Any]) -> Callable[[Connection], Any]:
        """``work`` that tells fan-out when the host begins and ends (its children are released however it ends)."""

        def run(conn: Connection) -> Any:
            self.started(conn.name)
            try:
                return work(conn)
            finally:
                self.host_done(conn)

        return run

    def begin(self, hosts: Sequence[str]) -> None:
        """A rollout's next batch, ``hosts``, begins now; the caches no host still to come pulls through are stopped."""
        with self.cond:
            self.over, self.begun = set(self.begun), self.begun | set(hosts)
            self.t0 = time.monotonic()
            idle = [(ref, n) for ref, nodes in self.nodes.items() for n in reversed(nodes.values())  # the hosts below first
                    if n.state == "serving" and all(self.nodes[ref][h].finished or h in self.over for h in descendants(self.plans[ref], n.host))]
            for _, n in idle:
                n.state = "closing"
            self.cond.notify_all()
        for _, n in idle:
            self._close(n)

    def started(self, host: str) -> None:
        with self.cond:
            self.t0 = self.t0 if self.t0 is not None else time.monotonic()
            for nodes in self.nodes.values():
                if host in nodes:
                    nodes[host].started = True
            self.cond.notify_all()

    def host_done(self, conn: Connection) -> None:
        """The host's work ended: what it would have served goes elsewhere; what it serves closes once the hosts below are done."""
        for ref, nodes in self.nodes.items():
            node = nodes.get(conn.name)
            if node is None:
                continue
            self._refuse(node, f"it did not deliver the image (its {self.label} needed none, or ended before)")
            self._finish(node)
            # a broken or dead cache's link up ends here too; a rollout's serve on fan-out's own connection until begin or close
            if self.own is None and (node.state == "serving" or node.broke or node.dead):
                self._wait_below(ref, node, conn)
                self._close(node)

    # --- the deliver callable ----------------------------------------------------------------------

    def __call__(self, engine: Engine, conn: Connection, t: Wanted, say: Callable[[str], None]) -> Delivery:
        nodes = self.nodes.get(t.image_ref)
        node = nodes.get(conn.name) if nodes else None
        if node is None or t.image is None or self.closed:
            return self.plain(engine, conn, t, say)
        started = time.monotonic()
        try:
            d = self._deliver(t.image_ref, node, engine, conn, t, say)
        except BaseException as err:
            self._refuse(node, f"its delivery failed ({getattr(err, 'problem', None) or err})")
            raise
        finally:
            self._finish(node)
        d = replace(d, seconds=time.monotonic() - started)
        with self.cond:
            self.delivered.setdefault(t.image_ref, {})[conn.name] = d
        return d

    def _deliver(self, ref: str, node: Node, engine: Engine, conn: Connection, t: Wanted, say) -> Delivery:
        assert t.image is not None
        image_id = t.image.id
        self.sizes[ref] = t.image.size
        present = engine.image(image_id) is not None
        if present:
            say(f"{ref} is on the host already (the same image id): nothing moves")
            delivery._tag(engine, image_id, ref)
            if self.own is None or not self._serves(ref, node):  # a rollout's host still serves its later batches: a cache, no pull
                self._refuse(node, f"{ref} was on it already")
                return Delivery("present", 0, image_id)
        whys: list[str] = []  # why it did not pull from a host above

        def done(moved: int, source: str | None) -> Delivery:
            if present:
                return Delivery("present", 0, image_id)
            return Delivery("fan-out", moved, image_id, note=note(conn.name, node.broke + whys, source), source=source or BUILD_MACHINE)

        progress = self.progress_for(conn, t)
        nodes = self.nodes[ref]
        feed = self._feeder(ref, node, conn)  # the connection its cache and what feeds it run on, where it serves
        if present and not self._serves(ref, node):  # no connection to serve from: nothing to do
            return done(0, None)
        for above in chain(self.plans[ref], conn.name):
            if above is None:
                break
            parent = nodes[above]
            why = self._attach(parent, conn)
            if why is None:
                m = parent.member
                try:
                    link = self.hosts.open_link(parent.conn, feed, m.address, parent.port, m.ssh_port)
                except GpurigError as err:
                    self._detach(parent, conn.name)
                    delivery._checkpoint(conn)
                    why = f"cannot reach {above} at {m.address}:{m.ssh_port}: {err.problem}"
                else:
                    say(f"{'feeds its layer cache' if present else 'pulls'} from {above}'s layer cache (through {m.address}:{m.ssh_port})")
                    try:
                        moved = self._through(ref, node, engine, conn, feed, t, link, above, None, progress, say, pull=not present)
                    except delivery.DeliveryError as err:
                        # the host tries further up (only the layers still missing move), a serving one too: its own pull
                        # failed through its cache and straight (_pull), so it serves no one now; a full disk fails as
                        # today's delivery does
                        if conn.interrupted or err.fix == delivery.DISK_FULL_FIX:
                            raise
                        why = f"could not pull from {above}'s layer cache: {err.problem}"
                    else:
                        return done(moved, above)
                    finally:
                        if node.upstream is not link:  # not kept for a cache of its own
                            self._let_go(parent, conn.name, link)
            whys.append(why)
        say(f"{'feeds its layer cache' if present else 'pulls'} from {BUILD_MACHINE}")
        try:
            port = self.build.prepare(ref, image_id, conn, progress, say)
            meter = Meter()
            forward = self.hosts.open_forward(feed, port, meter)
        except (NotThisWay, ChannelError) as err:  # today's path for this host (save-load, most likely), and why
            self._refuse(node, "it could not use fan-out")
            if present:
                return done(0, None)
            why = err.problem if isinstance(err, ChannelError) else str(err)
            d = self.plain(engine, conn, t, say)
            return replace(d, note="; ".join(n for n in (note(conn.name, whys, None), f"no fan-out: {why}", d.note) if n))
        with self.cond:
            self.forwards.append((ref, meter))
        try:
            self._through(ref, node, engine, conn, feed, t, forward, None, meter, progress, say, pull=not present)
        finally:
            if node.upstream is not forward:
                close_quietly(forward)
        return done(meter.total, None)

    def _serves(self, ref: str, node: Node) -> bool:
        return node.member.peer and node.state == "waiting" and any(p == node.host for p in self.plans[ref].values())

    def _feeder(self, ref: str, node: Node, conn: Connection) -> Connection:
        """The connection a serving host's cache, and the link or forward it fetches through, run on: its work's (a deploy), or
        one fan-out holds past that work (``own``: a rollout, whose later batches it serves)."""
        if self.own is None or not self._serves(ref, node):
            return conn
        try:
            held = self.own(conn.name)
        except GpurigError as err:
            delivery._checkpoint(conn)
            self._refuse(node, f"no connection of fan-out's own to serve from: {err.problem}")
            return conn
        with self.cond:
            self.held.append(held)
        conn.pass_interrupts_to(held)  # a Ctrl-C stops what this host's work waits on there too, not only on its own connection
        if self.closed:  # the run ended while it connected
            close_quietly(held)
        return held

    def _through(self, ref: str, node: Node, engine: Engine, conn: Connection, feed: Connection, t: Wanted, upstream: Any,
                 source: str | None, meter: Meter | None, progress, say, pull: bool = True) -> int:
        """The host pulls through ``upstream`` (a forward or a link on its loopback): via a cache of its own (on ``feed``) when it
        has children to serve, else straight; returns the bytes its engine fetched (none where it holds the image: not ``pull``)."""
        assert t.image is not None
        port = upstream.port
        if self._serves(ref, node):
            try:
                cache = self.hosts.start_cache(feed, upstream.port, lambda why: self._cache_ended(node, why))
            except GpurigError as err:
                delivery._checkpoint(conn)
                self._refuse(node, f"its layer cache did not start: {err.problem}")
            else:
                with self.cond:
                    node.conn, node.port, node.cache, node.upstream, node.via = feed, cache.port, cache, upstream, source
                    node.state = "serving" if node.state == "waiting" else node.state  # else close() or host_done stop it
                    self.cond.notify_all()
                port = cache.port
                say(f"serves {', '.join(h for h, p in self.plans[ref].items() if p == node.host)} from its layer cache")
        if not pull:
            return 0
        where = f"from {source}'s layer cache" if source else f"from {BUILD_MACHINE}"
        return self._pull(ref, node, engine, conn, t.image.id, upstream.port, port, source, meter, progress, say, where)

    def _pull(self, ref: str, node: Node, engine: Engine, conn: Connection, image_id: str, upstream: int, port: int, source: str | None,
              meter: Meter | None, progress, say, where: str) -> int:
        """The host's pull from its loopback's ``port``; where that is its own cache and the pull fails (the cache died, say),
        it serves no one from then on and pulls straight through ``upstream`` (its forward or link to ``source``), saying why.
        A cache on the way that dies ends the pull at once (``_gone``)."""
        moved = (lambda: meter.down) if meter else (lambda: None)
        if port != upstream:
            via = f"{where} through its own layer cache"
            how = (via, via)
            try:
                return self.hosts.pull(engine, conn, ref, image_id, port, moved, self.build.staged(ref), progress, say, how,
                                       lambda: self._gone(ref, node.host))
            except delivery.DeliveryError as err:
                if conn.interrupted or err.fix == delivery.DISK_FULL_FIX:
                    raise
                with self.cond:
                    node.broke.append(f"could not pull {how[1]}: {err.problem}")
                    node.state, node.why = "closing", f"its layer cache failed: {err.problem}"  # no new host pulls through it
                    self.cond.notify_all()
                say(f"{node.broke[-1]}; pulls straight {where}, serving no one")
        return self.hosts.pull(engine, conn, ref, image_id, upstream, moved, self.build.staged(ref), progress, say, (where, where),
                               lambda: self._gone(ref, source))

    def _cache_ended(self, node: Node, why: str) -> None:
        """``node``'s cache ended unasked: no host attaches to it now, and every pull through it ends at its next event."""
        with self.cond:
            node.dead = why
            if node.state in ("waiting", "serving"):
                node.state, node.why = "closing", why
            self.cond.notify_all()

    def _gone(self, ref: str, host: str | None) -> str | None:
        with self.cond:
            return gone_through(self.nodes[ref], host)

    # --- waiting on a parent, and a parent on the hosts below it ---------------------------------------

    def _attach(self, parent: Node, conn: Connection) -> str | None:
        """None once ``conn``'s host may open a link into ``parent``'s cache (it counts as pulling there); else why not."""
        begun = time.monotonic()
        with self.cond:
            while parent.state == "waiting":
                delivery._checkpoint(conn)
                waited = time.monotonic() - begun
                if not parent.started and parent.host in self.over:
                    return f"{parent.host} does not serve: its {self.label} never began (its batch ended without it)"
                if not parent.started and self._late():
                    return f"{parent.host} does not serve: its {self.label} had not begun after {self.start_grace_s:.0f} s"
                if waited > self.wait_s:
                    return f"{parent.host} does not serve: its layer cache did not start within {self.wait_s:.0f} s"
                self.cond.wait(TICK_S)
            if parent.state == "serving":
                parent.pullers.add(conn.name)
                return None
            return f"{parent.host} does not serve: {parent.why or 'it closed its layer cache'}"

    def _late(self) -> bool:
        """A host whose work has not begun by now will not be waited for (unreachable, or queued behind --forks)."""
        return self.t0 is None or time.monotonic() - self.t0 > self.start_grace_s

    def _detach(self, parent: Node, host: str) -> None:
        with self.cond:
            parent.pullers.discard(host)
            self.cond.notify_all()

    def _let_go(self, parent: Node, host: str, link: Any) -> None:
        close_quietly(link)  # the one-time key out of the parent's authorized_keys (through the parent's connection)
        self._detach(parent, host)

    def _refuse(self, node: Node, why: str) -> None:
        with self.cond:
            if node.state == "waiting":
                node.state, node.why = "refused", why
                self.cond.notify_all()

    def _finish(self, node: Node) -> None:
        with self.cond:
            node.finished = True
            self.cond.notify_all()

    def _wait_below(self, ref: str, node: Node, conn: Connection) -> None:
        """Until every started host below ``node`` finished its pull and no link into its cache is open (bounded; Ctrl-C ends it)."""
        below = [self.nodes[ref][h] for h in descendants(self.plans[ref], node.host)]
        deadline = time.monotonic() + self.wait_s
        with self.cond:
            while (node.pullers or any(not n.finished and (n.started or not self._late()) for n in below)) and not conn.interrupted:
                if time.monotonic() > deadline:
                    log.warning("%s: closing its layer cache with %s still pulling", node.host, ", ".join(sorted(node.pullers)) or "hosts")
                    break
                self.cond.wait(TICK_S)
            node.state = "closing"  # no new link: a host that comes now goes further up
            self.cond.notify_all()

    def _close(self, node: Node) -> None:
        with self.cond:
            cache, upstream, node.cache, node.upstream = node.cache, node.upstream, None, None
        if cache is not None:
            try:
                node.counts = cache.stop() or {}
            except Exception as err:  # noqa: BLE001 - closing must go on to the links whatever one part says
                log.warning("%s: stopping its layer cache: %s", node.host, err)
        if upstream is not None:
            parent = next((nodes[node.via] for nodes in self.nodes.values() if nodes.get(node.host) is node and node.via), None)
            if parent is not None:
                self._let_go(parent, node.host, upstream)
            else:
                close_quietly(upstream)

    # --- the run's end ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Whatever is still held (a run that ended abruptly): caches stopped, links and forwards closed, the registry stopped."""
        self.closed = True
        for nodes in self.nodes.values():
            for node in nodes.values():
                with self.cond:
                    node.state = "closing" if node.state == "serving" else node.state
                self._close(node)
        with self.cond:
            held, self.held = self.held, []
        for conn in held:  # what still ran on them ends with them (each key's guard takes its line out as its channel ends)
            close_quietly(conn)
        self.build.close()

    def serves(self, host: str) -> set[str]:
        """The images ``host`` is to serve to other hosts (its layer cache keeps them under its login user's home)."""
        return {ref for ref, nodes in self.nodes.items() if host in nodes and nodes[host].member.peer and host in self.plans[ref].values()}

    def sent(self, ref: str) -> int:
        """Bytes the build machine sent out for ``ref`` (every forward's, down)."""
        with self.cond:
            return sum(m.down for r, m in self.forwards if r == ref)

    def plan(self, sizes: Mapping[str, int]) -> list[dict[str, Any]]:
        """Before anything moves: per image, its size (``sizes``, the build machine's) and who is to pull from whom."""
        return [{"image": ref, "size": sizes.get(ref, 0), "tree": dict(tree)} for ref, tree in self.plans.items()]

    def summary(self) -> list[dict[str, Any]]:
        """Per image: its size, the bytes out of the build machine, the bytes the hosts received, and who pulled from whom."""
        return [summarise(ref, self.sizes.get(ref, 0), self.sent(ref), self.delivered.get(ref, {}), self.plans[ref]) for ref in self.plans]
