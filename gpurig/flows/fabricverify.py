"""``verify --level fabric``: prove that the selected hosts can train together, name the slow link or host, and say what to fix.

In four steps, each host through its own engine (``open_engine``):
1. the quick single-host verify of the image on every host (``verify_host``);
   a host that fails it is left out and said so (``exclusion``: a host with
   no GPU is judged only on what gloo needs: Docker, the image, torch);
2. checks/fabric_facts.py in the image, host networking, on rank 0 (the first
   host left), whose facts give the rendezvous address (``master_address``),
   then on the others with ``--to`` that address;
3. checks/fabric_allreduce.py, one rank per host, all started together
   (a thread and a labelled container per host, removed on every way out,
   Ctrl-C included);
4. the records (gpurig.verify.fabric_checks), and where the busbw falls
   short the pairwise search for the culprit (gpurig.verify.culprit), each
   pair measured at the largest size only.

The result is shown as verify shows a host: one row (the fabric, its
busbw, the first failure and its fix), every record with -v, --json with
verify's schema and --junit.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from gpurig.files import write_text_report
from gpurig.flows.fleettask import HostOptions, exit_for, fleet_document, interrupted, make_connector, run_hosts
from gpurig.report import err_console, outside

if TYPE_CHECKING:
    from gpurig.connect.connection import Connection
    from gpurig.connect.engineinfo import Exited
    from gpurig.inventory import Host
    from gpurig.inventory.profile import FabricSettings
    from gpurig.results import FleetReport
    from gpurig.verify.fabric import FabricRun
    from gpurig.verify.records import HostVerdict, Record
    from gpurig.verify.runner import VerifyPlan

SCHEMA = "gpurig.verify/1"
LEVEL = "fabric"
FACTS_PROBE = "checks/fabric_facts.py"
RANK_PROBE = "checks/fabric_allreduce.py"
FABRIC_LABEL = "io.gpurig.fabric"  # every container of one run carries it, with the run's id as its value
DEFAULT_SIZES = tuple(4096 << (2 * i) for i in range(9))  # 4 kB .. 256 MB, x4: fabric_allreduce.py's own default
ITERS = 20
FACTS_TIMEOUT_S = 120.0  # a container start and a stdlib probe
# what a host with no GPU must pass to run a gloo rank: its Docker, the image, torch in it (the GPU records fail on it by nature,
# and the host probe, which reads the driver, may have no python3 to run with: the ranks run in the image)
GLOO_NEEDS = ("toolkit.docker", "container.probe", "torch.import")
NO_GPU = "no NVIDIA GPU visible on the host"


# ---- decisions: pure ------------------------------------------------------------------------------


def exclusion(verdict: HostVerdict | None, reason: str = "") -> str | None:
    """Why a host's single-host verify keeps it out of the fabric run, or None: it may run a rank.

    A host with GPUs must pass it whole; a host without (toolkit.runtime skipped for want of one) runs gloo
    and needs only ``GLOO_NEEDS``. No verdict at all (unreachable) keeps it out with ``reason``.
    """
    if verdict is None:
        return reason or "it could not be verified"
    bad = [r for r in verdict.failures if has_gpus(verdict) or r.id in GLOO_NEEDS]
    return f"{bad[0].id}: {bad[0].detail}" + (f"; {bad[0].fix}" if bad[0].fix else "") if bad else None


def has_gpus(verdict: HostVerdict | None) -> bool:
    """Whether the host has GPUs for its containers: its verify did not skip the runtime for want of one."""
    return verdict is not None and not any(r.id == "toolkit.runtime" and r.status == "skip" and r.detail.startswith(NO_GPU)
                                           for r in verdict.records)


def interface_address(facts: Mapping[str, Any] | None, name: str | None) -> str | None:
    """The interface's first IPv4 address (else a global IPv6 one), without its prefix length."""
    iface = next((i for i in (facts or {}).get("interfaces") or () if name and i.get("name") == name), None)
    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for text in (iface or {}).get("addresses") or ():
        with suppress(ValueError):
            found.append(ipaddress.ip_interface(str(text)).ip)
    usable = [a for a in found if not a.is_link_local]
    usable.sort(key=lambda a: a.version)
    return str(usable[0]) if usable else None


def master_address(run: FabricRun, host: str, settings: FabricSettings) -> tuple[str | None, str]:
    """(the address the other ranks reach ``host`` at, how it was chosen); (None, why) when its facts name none.

    ``gpurig_fabric.address`` where set, else the address of the interface its rank sends over (fabric.chosen_link).
    """
    from gpurig.verify.fabric import chosen_link

    if settings.address:
        return settings.address, f"{host}'s gpurig_fabric.address"
    link = chosen_link(host, run.facts.get(host), run)
    if link.problem or not link.name:
        return None, link.problem or f"{host}'s fabric facts name no interface"
    addr = interface_address(run.facts.get(host), link.name)
    if addr is None:
        return None, f"{link.where} has no address ({link.how})"
    return addr, f"{link.where}'s address ({link.how})"


def rank_args(rank: int, world: int, master: str, port: int, sizes: Sequence[int], timeout: float, interface: str | None,
              iters: int = ITERS) -> list[str]:
    """fabric_allreduce.py's arguments for one rank: the same world, rendezvous, sizes and iterations on every host."""
    args = ["--json", "--rank", str(rank), "--world", str(world), "--master-addr", master, "--master-port", str(port),
            "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters), "--timeout", f"{timeout:g}"]
    return args + (["--interface", interface] if interface else [])


def sizes_up_to(max_mb: int) -> tuple[int, ...]:
    """The sizes measured: DEFAULT_SIZES up to ``max_mb`` MB (gpurig_fabric.max_size_mb of rank 0), 4 kB at least."""
    return tuple(s for s in DEFAULT_SIZES if s <= max_mb << 20) or DEFAULT_SIZES[:1]


def rank_timeout(timeout: float, nsizes: int) -> float:
    """The longest a rank's container may run: its watchdog's phases (rendezvous, warm-up, latency, each size) and a start."""
    return timeout * (3 + nsizes) + 60


def largest_busbw(doc: Mapping[str, Any] | None) -> float | None:
    """What a culprit test measured: rank 0's busbw at its largest size; None when the run failed or measured nothing."""
    from gpurig.verify.fabric import sizes

    if not doc or any(r.get("status") == "fail" for r in doc.get("records") or () if isinstance(r, Mapping)):
        return None
    measured = sizes(doc)
    return float(measured[-1]["busbw"]) if measured else None


def needs_culprit(records: Sequence[Record]) -> bool:
    return any(r.id == "fabric.busbw" and r.status in ("fail", "warn") for r in records)


def container_body(image: str, argv: Sequence[str], run_id: str, gpus: bool) -> dict:
    """A probe's throwaway container: host networking (the rank uses the host's NICs), labelled, 16g /dev/shm, GPUs where there are."""
    from gpurig.verify.runner import IMAGE_SHM_BYTES

    python, *args = argv
    host_config: dict = {"NetworkMode": "host", "ShmSize": IMAGE_SHM_BYTES}
    if gpus:
        host_config["DeviceRequests"] = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}]
    return {"Image": image, "Entrypoint": [python], "Cmd": list(args), "Labels": {FABRIC_LABEL: run_id}, "HostConfig": host_config}


def fabric_verdict(hosts: Sequence[str], records: Sequence[Record], image: str) -> HostVerdict:
    from gpurig.verify.records import HostVerdict

    return HostVerdict(f"fabric ({len(hosts)} hosts)", tuple(records), LEVEL, f"image {image}")


# ---- the hosts ------------------------------------------------------------------------------------


@dataclass
class Ranks:
    """One fabric run's hosts: a connection each, every container started (to remove on any way out), the probes' text."""

    image: str
    conns: Mapping[str, Connection]
    gpus: Mapping[str, bool]  # host -> give its containers the GPUs
    facts_probe: str
    rank_probe: str
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    started: dict[str, str] = field(default_factory=dict)  # container name -> host
    lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0

    def run(self, host: str, argv: list[str], timeout: float, what: str) -> Exited | str:
        """The container's exit and output; a string saying why there is none (the engine refused, it overran)."""
        from gpurig.connect.engine import EngineError
        from gpurig.connect.engineopen import open_engine

        with self.lock:
            self.count += 1
            name = f"gpurig-fabric-{self.run_id}-{what}-{self.count}"
            self.started[name] = host
        try:
            with open_engine(self.conns[host], timeout=60) as engine:
                if engine.image(self.image) is None:
                    return f"image {self.image} is not on {host}: gpurig deploy puts it there"
                ended = engine.run(container_body(self.image, argv, self.run_id, self.gpus.get(host, False)), name, timeout)
        except EngineError as err:
            return err.problem
        finally:
            with self.lock:
                self.started.pop(name, None)
        return ended if ended is not None else f"the {what} probe did not finish within {timeout:g} s"

    def facts(self, host: str, to: str | None) -> dict | None:
        from gpurig.connect.launcher import embedded
        from gpurig.verify.fabric import document

        ended = self.run(host, embedded(self.facts_probe, "fabric_facts.py", ["--json", *(["--to", to] if to else [])]),
                         FACTS_TIMEOUT_S, "facts")
        return None if isinstance(ended, str) else document(ended.stdout, "fabric_facts")

    def rank(self, host: str, args: list[str], timeout: float) -> dict:
        """The rank's document; a stand-in document with one fail record when the container gave none."""
        from gpurig.connect.launcher import embedded
        from gpurig.errors import last_line
        from gpurig.verify.fabric import document

        ended = self.run(host, embedded(self.rank_probe, "fabric_allreduce.py", args), timeout, "rank")
        doc = None if isinstance(ended, str) else document(ended.stdout, "fabric")
        if doc is not None:
            return doc
        why = ended if isinstance(ended, str) else last_line(ended.stderr, ended.stdout) or f"exit {ended.code}"
        return {"probe": "fabric", "sizes": [], "records": [{"id": "fabric.rank", "status": "fail", "detail": f"its rank gave no result: {why}",
                                                              "fix": "run checks/fabric_allreduce.py --text in the image on that host to see why"}]}

    def remove_all(self) -> int:
        """Remove every container still running (Ctrl-C): through a fresh engine per host; how many were asked to go."""
        from gpurig.connect.engine import EngineError
        from gpurig.connect.engineopen import open_engine

        with self.lock:
            left = dict(self.started)
        for name, host in left.items():
            with suppress(EngineError), open_engine(self.conns[host], timeout=30) as engine:
                engine.remove(name)
        return len(left)


def together(hosts: Sequence[str], work: Callable[[str], Any]) -> dict[str, Any]:
    """``work(host)`` on every host at the same time (a daemon thread each, so Ctrl-C is the main thread's); their results."""
    results: dict[str, Any] = {}

    def one(host: str) -> None:
        try:
            results[host] = work(host)
        except Exception as err:  # a bug or a lost connection in one thread: that host's result says it, the run goes on
            results[host] = err

    threads = [threading.Thread(target=one, args=(h,), daemon=True, name=f"fabric-{h}") for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)  # short joins: Ctrl-C reaches the main thread between them
    return results


def run_ranks(ranks: Ranks, hosts: Sequence[str], master: str, settings: Mapping[str, FabricSettings], port: int,
              sizes: Sequence[int]) -> dict[str, dict]:
    """One rank per host of ``hosts`` (rank by order), all at once; each host's document."""
    timeout = max(settings[h].timeout for h in hosts)
    docs = together(hosts, lambda h: ranks.rank(h, rank_args(hosts.index(h), len(hosts), master, port, sizes, timeout, settings[h].interface),
                                                 rank_timeout(timeout, len(sizes))))
    return {h: d if isinstance(d, dict) else {"probe": "fabric", "sizes": [], "records": [
        {"id": "fabric.rank", "status": "fail", "detail": f"its rank could not be run: {d}", "fix": ""}]} for h, d in docs.items()}


# ---- the level ------------------------------------------------------------------------------------


def fabric_fleet(opts: HostOptions, chosen: Sequence[Host], plan: VerifyPlan, *, junit: str | None = None) -> None:
    """The fabric level over the chosen hosts (in inventory order: the first left is rank 0); exits non-zero when it did not pass."""
    from gpurig.inventory.profile import host_profile
    from gpurig.verify.fabric import FabricRun
    from gpurig.verify.gate import verdict_of
    from gpurig.verify.runner import read_probe, verify_host

    profiles = {h.name: host_profile(h, opts.settings.inventory) for h in chosen}
    settings = {name: p.fabric for name, p in profiles.items()}
    probes = [read_probe(FACTS_PROBE), read_probe(RANK_PROBE)]
    for (text, unread), path in zip(probes, (FACTS_PROBE, RANK_PROBE)):
        if text is None:
            from gpurig.errors import GpurigError
            from gpurig.verify.runner import REINSTALL

            raise GpurigError(f"{path} is not in this gpurig: {unread}", REINSTALL)
    started, quick = time.monotonic(), dataclasses.replace(plan, level="quick")

    def work(conn: Connection) -> Any:
        from gpurig.results import Outcome

        gpus = profiles[conn.name].gpus
        return Outcome(data=verify_host(conn, quick, gpus.count, gpus.model, gpus.mig))

    single = run_hosts(opts, chosen, work, label="verify", schema=SCHEMA, finished=False)
    names = [h.name for h in chosen]
    excluded: dict[str, str] = {}
    for r in single.results:
        why = exclusion(verdict_of(r.data), r.reason)
        if why:
            excluded[r.host] = why
            err_console.print(f"{outside(r.host)} is left out of the fabric run: {outside(why)}", highlight=False, soft_wrap=True)
    gpus = {r.host: has_gpus(verdict_of(r.data)) for r in single.results}
    ranked = [n for n in names if n not in excluded]
    connector = make_connector(opts)
    ranks = Ranks(plan.image or "", {h.name: connector.open(h) for h in chosen if h.name in ranked}, gpus, probes[0][0] or "", probes[1][0] or "")
    run = FabricRun(tuple(names), excluded=excluded, interface=settings[ranked[0]].interface if ranked else None,
                    interfaces={h: settings[h].interface for h in ranked})
    try:
        run = gather(ranks, run, settings)
        records = fabric_records_with_culprit(ranks, run, settings)
    except KeyboardInterrupt as stop:
        removed = ranks.remove_all()
        raise interrupted(stop, f"removed {removed} fabric container{'s' if removed != 1 else ''} ({FABRIC_LABEL}={ranks.run_id})") from None
    finally:
        for conn in ranks.conns.values():
            conn.close()
        connector.close()
    present(opts, fabric_verdict(names, records, plan.image or ""), run, time.monotonic() - started, junit)


def gather(ranks: Ranks, run: FabricRun, settings: Mapping[str, FabricSettings]) -> FabricRun:
    """The run with every ranked host's facts and rank document: rank 0's facts, the rendezvous, the others' facts, the ranks."""
    replace = dataclasses.replace
    if len(run.ranked) < 2:
        return run
    first = run.ranked[0]
    own = settings[first]
    facts = {first: ranks.facts(first, own.address)}
    run = replace(run, facts={h: f for h, f in facts.items() if f})
    master, how = master_address(run, first, own)
    if master is None:
        err_console.print(f"no rendezvous address: {outside(how)}", highlight=False, soft_wrap=True)
        return replace(run, master="", ranks={first: {"probe": "fabric", "sizes": [], "records": [
            {"id": "fabric.rendezvous", "status": "fail", "detail": f"no rendezvous address: {how}",
             "fix": f"set gpurig_fabric.address (or gpurig_fabric.interface) on {first}"}]}})
    others = together(run.ranked[1:], lambda h: ranks.facts(h, master))
    facts.update(others)
    run = replace(run, master=master, port=own.port, facts={h: f for h, f in facts.items() if isinstance(f, dict)})
    from gpurig.verify.fabric import missing_interfaces

    doomed = missing_interfaces(run)
    if doomed:  # its rank could not send, and the others would wait their whole timeout for it
        err_console.print(f"the all-reduce was not started: {outside(doomed)}", highlight=False, soft_wrap=True)
        return replace(run, not_started=doomed)
    return replace(run, ranks=run_ranks(ranks, run.ranked, master, settings, own.port, sizes_up_to(own.max_size_mb)))


def fabric_records_with_culprit(ranks: Ranks, run: FabricRun, settings: Mapping[str, FabricSettings],
                                runner: Callable[..., Mapping[str, Mapping[str, Any]]] = run_ranks) -> list[Record]:
    """fabric_records, and where the busbw falls short the pairwise culprit search's record after it.

    Each pair is ``runner`` (``run_ranks``) on those two hosts at the largest size, rendezvous at the first one's address.
    """
    from gpurig.verify import culprit
    from gpurig.verify.fabric import PASS_FRACTION, promise, sizes
    from gpurig.verify.fabric_checks import fabric_records

    records = fabric_records(run)
    measured = sizes(run.rank0)
    if not needs_culprit(records) or not measured:
        return records
    largest = (int(measured[-1]["bytes"]),)
    port = settings[run.ranked[0]].port

    def measure(subset: tuple[str, ...]) -> float | None:
        master, _ = master_address(run, subset[0], settings[subset[0]])
        if master is None:
            return None
        docs = runner(ranks, subset, master, settings, port, largest)
        return largest_busbw(docs.get(subset[0]))

    expected, _ = promise(run.as_ran())
    # a warn is gloo short of a fast link's promise, its CPUs setting the pace: the pairs are judged against each other then,
    # not against a promise they hover around (one pair under it by a little would read as a slow link)
    cpu_bound = any(r.id == "fabric.busbw" and r.status == "warn" for r in records)
    floor = expected * PASS_FRACTION if expected and not cpu_bound else None
    tested, threshold = culprit.search(run.ranked, measure, floor)
    why = "gloo's CPUs, not the links, set the pace" if cpu_bound else "the links promise no speed"
    # "only with every host at once" only where the pairs reached the promise: judged against each other, they say nothing of it
    return [*records, culprit.culprit_record(culprit.judge(tested, threshold, culprit.basis(floor, threshold, why)),
                                             total_slow=threshold == floor)]


def present(opts: HostOptions, verdict: HostVerdict, run: FabricRun, seconds: float, junit: str | None) -> None:
    """Show the fabric's verdict as verify shows a host's: the row (-v: every record), --json, --junit; exit non-zero unless it passed."""
    from gpurig.flows.fleettask import write_json_report
    from gpurig.flows.fleetverify import host_rows, record_rows
    from gpurig.results import FleetReport, HostResult
    from gpurig.status import Status
    from gpurig.verify.gate import fleet_passed, verdict_outcome
    from gpurig.verify.junit import junit_xml

    outcome = verdict_outcome(verdict)
    result = HostResult(verdict.host, outcome.status or Status.OK, outcome.detail, verdict, seconds, outcome.fix)
    summary = {s.value: int(result.status == s) for s in Status}
    report = FleetReport((result,), datetime.now(timezone.utc).isoformat(timespec="seconds"), seconds, summary=summary)

    def annotate(r: FleetReport) -> dict:
        return {"level": LEVEL, "target": verdict.target, "passed": fleet_passed(r), "ranked": list(run.ranked),
                "excluded": dict(run.excluded), "master": run.master or None}

    write_json_report(opts, report, SCHEMA, annotate)
    if junit:
        write_text_report(junit, junit_xml(report), "--junit")
    columns, rows = record_rows(report) if opts.verbose else host_rows(report)
    if junit != "-":
        opts.show(columns, rows, doc=fleet_document(opts, report, SCHEMA, **annotate(report)))
    keep_fabric_history(opts, verdict, run)
    exit_for(report)


def keep_fabric_history(opts: HostOptions, verdict: HostVerdict, run: FabricRun) -> None:
    """One line for the fleet in the project's verify history, naming the hosts it ran on (and those left out, in its
    records); nothing under --check/--dry. One that cannot be written is said: the verdict stands."""
    from gpurig.verify.verdictlog import append_entries, fleet_entry

    if opts.check:
        return
    try:
        append_entries(opts.settings.project, [fleet_entry(run.ranked, LEVEL, verdict.records, target=verdict.target)])
    except OSError as err:
        err_console.print(f"verify: the history was not kept: {err}", highlight=False)
