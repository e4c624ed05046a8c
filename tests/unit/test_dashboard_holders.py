"""Who holds each GPU on the page: containers by name (from the host's engine), Slurm jobs, processes, each since when; and
stopping a container deploy made from the page, behind the same checks as a cancel.

Samples are the monitor's own types (GpuSample, GpuProcess as samples.py parses the agent's records); the engine's answers
are ContainerInfos as gpurig.connect.engineinfo reads them from the Engine API's JSON. The stop route is asked over
loopback with a Desk whose library call records what reached it; the library's side (only containers deploy labelled are
ever listed, so never stopped) runs on an engine that filters by label as Docker does.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_dashboard_actions import TOKEN, Calls, StubFeeds, ask, page

from gpurig.connect.engineinfo import container_info
from gpurig.dashboard.actions import ACTIONS_LOG, Desk
from gpurig.dashboard.containernames import ContainerNames
from gpurig.dashboard.history import read_history
from gpurig.dashboard.snapshot import holders_of, host_series
from gpurig.dashboard.webauth import COOKIE, CSRF_HEADER, READ_ONLY
from gpurig.dashboard.webserver import Dashboard
from gpurig.errors import HostError
from gpurig.flows import containerlife
from gpurig.monitor.holders import Held, HolderTracker
from gpurig.monitor.samples import GpuProcess, GpuSample, HpcJob, Sample
from gpurig.status import Status

JUPYTER = "a" * 64
STRANGER = "b" * 64
T0 = 1_764_900_000.0


def inspected(cid: str, name: str, labels: dict[str, str] | None = None, status: str = "running"):
    """A container as the engine's inspect answers it, read by gpurig's own reader."""
    return container_info({"Id": cid, "Name": f"/{name}", "Config": {"Image": "debian:bookworm-slim", "Labels": labels or {}},
                           "State": {"Status": status, "Running": status == "running"}, "HostConfig": {}})


DEPLOYED = {"io.gpurig.deploy.name": "jupyter", "io.gpurig.deploy.user": "alice", "io.gpurig.deploy.image": "pytorch:2.13-jupyter"}


def gpu(*procs: GpuProcess, jobs: tuple[HpcJob, ...] = (), util: float = 50.0) -> GpuSample:
    return GpuSample(index=0, util_gpu=util, processes=procs, hpc_jobs=jobs)


def sample(t: float, *gpus: GpuSample) -> Sample:
    return Sample(host="gpu-01", t=t, cpu_percent=1.0, gpus=gpus)


def names_with(*found, asked=(JUPYTER, STRANGER)) -> ContainerNames:
    names = ContainerNames(clock=lambda: 0.0)
    names.take("gpu-01", asked, found, T0)
    return names


# --- the holders' text -----------------------------------------------------------------------------------------------------------


def test_a_containers_processes_are_one_holder_named_by_the_engine_with_its_users_and_since_when():
    g = gpu(GpuProcess(4242, "alice", "python", 1000, JUPYTER), GpuProcess(4243, "alice", "python", 24, JUPYTER),
            GpuProcess(77, "bob", "train", 500), jobs=(HpcJob("42", "carol"),))
    held = {"job:42": Held(T0, True), f"container:{JUPYTER}": Held(T0 - 7200, True), "pid:77:train": Held(T0 - 60, False)}
    book = names_with(inspected(JUPYTER, "jupyter", DEPLOYED)).book("gpu-01")
    job, jupyter, train = holders_of(g, held, book)
    assert (job["text"], job["since"], job["known"]) == ("slurm job 42 (carol)", T0, True)
    assert jupyter["text"] == "jupyter (alice)" and jupyter["since"] == T0 - 7200 and jupyter["known"] is True
    assert (jupyter["used_mib"], jupyter["pids"], jupyter["deployed"], jupyter["no_stop"]) == (1024, [4242, 4243], "jupyter", "")
    assert jupyter["image"] == "pytorch:2.13-jupyter"
    assert (train["text"], train["known"], train["pid"]) == ("train (bob)", False, 77)  # held before the samples began


def test_a_container_gpurig_did_not_deploy_is_named_but_gets_no_stop_and_says_why():
    g = gpu(GpuProcess(9, "root", "python", None, STRANGER), GpuProcess(10, None, "x", None, JUPYTER))
    book = names_with(inspected(STRANGER, "someones-notebook"), inspected(JUPYTER, "jupyter", DEPLOYED, status="exited")).book("gpu-01")
    stranger, jupyter = holders_of(g, {}, book)
    assert stranger["text"] == "someones-notebook (root)" and stranger["since"] is None and stranger["known"] is None
    assert "not deployed by gpurig" in stranger["no_stop"] and "io.gpurig.deploy" in stranger["no_stop"]
    assert jupyter["text"] == "jupyter" and jupyter["no_stop"] == "not running (exited)"
    job = names_with(inspected(STRANGER, "gpurig-job-abc123", {"io.gpurig.job.id": "abc123"})).book("gpu-01")
    [held_by_job] = holders_of(gpu(GpuProcess(9, "alice", "python", None, STRANGER)), {}, job)
    assert held_by_job["text"] == "job abc123 (alice)" and "cancel the job" in held_by_job["no_stop"]


def test_a_container_not_yet_named_or_whose_engine_failed_is_its_short_id_with_why():
    g = gpu(GpuProcess(9, "root", "python", None, STRANGER))
    [unread] = holders_of(g, {}, None)
    assert unread["text"] == f"container {STRANGER[:12]} (root)" and "not been read" in unread["no_stop"]
    names = ContainerNames(clock=lambda: 0.0)
    names.failed("gpu-01", "permission denied on the docker socket", T0)
    [failed] = holders_of(g, {}, names.book("gpu-01"))
    assert "could not be asked: permission denied" in failed["no_stop"]
    [unknown] = holders_of(g, {}, names_with().book("gpu-01"))  # asked; the engine knows no such container
    assert "does not know this container" in unknown["no_stop"]


# --- since when ------------------------------------------------------------------------------------------------------------------


def test_since_is_the_sample_a_holder_first_appeared_in_and_unknown_before_the_samples_began():
    tracker = HolderTracker(max_gap=30)
    alice, bob = GpuProcess(1, "alice", "python", None, JUPYTER), GpuProcess(2, "bob", "train")
    tracker("gpu-01", {}, sample(T0, gpu(alice)))
    tracker("gpu-01", {}, sample(T0 + 10, gpu(alice, bob)))
    tracker("gpu-01", {}, sample(T0 + 20, gpu(alice, bob)))
    held = tracker.of("gpu-01")["0"]
    assert held == {f"container:{JUPYTER}": Held(T0, False), "pid:2:train": Held(T0 + 10, True)}
    tracker("gpu-01", {}, sample(T0 + 30, gpu(bob)))  # alice's container let go
    tracker("gpu-01", {}, sample(T0 + 40, gpu(alice, bob)))
    assert tracker.of("gpu-01")["0"][f"container:{JUPYTER}"] == Held(T0 + 40, True)  # back: it starts again
    tracker("gpu-01", {}, sample(T0 + 100, gpu(alice, bob)))  # a minute unseen: held throughout is not known
    assert set(tracker.of("gpu-01")["0"].values()) == {Held(T0 + 100, False)}


# --- the page is sent what changed -----------------------------------------------------------------------------------------------


def test_a_delta_sends_a_gpus_holders_again_when_their_names_arrive_or_an_idle_streak_begins():
    from gpurig.monitor.idle import IdleTracker

    proc = GpuProcess(4242, "alice", "python", 10, JUPYTER)
    busy, one, two = sample(T0, gpu(proc)), sample(T0 + 1, gpu(proc, util=1.0)), sample(T0 + 2, gpu(proc, util=1.0))
    idle, held = IdleTracker(), HolderTracker()
    for s in (busy, one, two):
        idle("gpu-01", {}, s)
        held("gpu-01", {}, s)
    names = ContainerNames(clock=lambda: 0.0)
    first = host_series([one, two], busy, idle.of("gpu-01"), held.of("gpu-01"), names.book("gpu-01"))["gpus"]["0"]
    assert first["idle_since"] == T0 + 1  # the streak began after the sample the page had: sent
    again = host_series([two], one, idle.of("gpu-01"), held.of("gpu-01"), names.book("gpu-01"))["gpus"]["0"]
    assert "holders" not in again  # nothing changed
    names.take("gpu-01", [JUPYTER], [inspected(JUPYTER, "jupyter", DEPLOYED)], two.t)
    named = host_series([two], one, idle.of("gpu-01"), held.of("gpu-01"), names.book("gpu-01"))["gpus"]["0"]
    assert named["holders"][0]["text"] == "jupyter (alice)"


def test_a_hosts_engine_is_asked_for_a_new_container_at_once_and_otherwise_every_few_minutes():
    now = [0.0]
    names = ContainerNames(clock=lambda: now[0], list_every=300, retry=30)
    assert names.due("gpu-01", []) == [] and names.due("gpu-01", [JUPYTER]) == [JUPYTER]
    names.take("gpu-01", [JUPYTER], [inspected(JUPYTER, "jupyter", DEPLOYED)], T0)
    now[0] = 40.0
    assert names.due("gpu-01", [JUPYTER]) == []  # known and fresh: not every tick
    assert names.due("gpu-01", [JUPYTER, STRANGER]) == [JUPYTER, STRANGER]  # a new one: asked now
    names.failed("gpu-01", "unreachable", T0)
    now[0] = 50.0
    assert names.due("gpu-01", [STRANGER]) == []  # a failure waits before it is asked again
    now[0] = 301.0
    assert names.due("gpu-01", [JUPYTER]) == [JUPYTER]
    names.take("gpu-01", [JUPYTER], [inspected(JUPYTER, "jupyter", DEPLOYED)], T0)
    names.mark_changed("gpu-01")  # stopped from the page: asked again at the next look
    assert names.due("gpu-01", [JUPYTER]) == [JUPYTER]


# --- stopping from the page ------------------------------------------------------------------------------------------------------


class Stops(Calls):
    def __init__(self) -> None:
        super().__init__()
        self.stops: list[tuple[str, str]] = []
        self.refreshed: list[str] = []
        self.stop_error: Exception | None = None

    def stop(self, host: str, name: str):
        self.stops.append((host, name))
        if self.stop_error is not None:
            raise self.stop_error
        return SimpleNamespace(host=host, name=name, changed=True, detail="stopped")


def serve(tmp_path: Path, allow: bool):
    calls = Stops()
    desk = Desk(calls.read_log, calls.cancel, tmp_path, allow, calls.poke, stop=calls.stop, stopped=calls.refreshed.append)  # type: ignore[arg-type]
    dash = Dashboard(StubFeeds(), TOKEN, "127.0.0.1", 0, desk=desk)  # type: ignore[arg-type]
    dash.serve()
    return dash, calls


@pytest.fixture
def actions(tmp_path):
    dash, calls = serve(tmp_path, allow=True)
    yield dash, calls
    dash.close()


STOP = "/api/hosts/gpu-01/containers/jupyter/stop"


def test_a_stop_from_the_page_reaches_the_library_and_lands_in_the_history(actions):
    dash, calls = actions
    status, headers, body = ask(dash, "POST", STOP, **page(dash))
    assert status == 200 and json.loads(body) == {"host": "gpu-01", "container": "jupyter", "result": "stopped", "detail": "stopped"}
    assert calls.stops == [("gpu-01", "jupyter")] and calls.refreshed == ["gpu-01"]  # its engine is asked again at once
    [line] = (dash.desk.root / ACTIONS_LOG).read_text().splitlines()
    assert TOKEN not in line and dash.gate.csrf not in line
    entry = json.loads(line)
    assert (entry["action"], entry["container"], entry["host"], entry["result"], entry["by"]) == ("stop", "jupyter", "gpu-01", "stopped", "dashboard")
    [shown] = [e for e in read_history(dash.desk.root).entries if e["kind"] == "action"]
    assert (shown["action"], shown["container"], shown["host"]) == ("stop", "jupyter", "gpu-01")


def test_read_only_refuses_a_stop(tmp_path):
    dash, calls = serve(tmp_path, allow=False)
    try:
        status, _, body = ask(dash, "POST", STOP, **page(dash))
        assert (status, body) == (403, (READ_ONLY + "\n").encode())
    finally:
        dash.close()
    assert calls.stops == [] and not (tmp_path / ACTIONS_LOG).exists()


@pytest.mark.parametrize(("over", "status"), [
    ({"Origin": "http://evil.example"}, 403), ({"Origin": None}, 403), ({"Sec-Fetch-Site": "cross-site"}, 403),
    ({CSRF_HEADER: None}, 403), ({CSRF_HEADER: "guess"}, 403), ({"Cookie": None}, 401), ({"Cookie": f"{COOKIE}=wrong"}, 401),
    ({"Cookie": None, "Authorization": f"Bearer {TOKEN}"}, 403),
])
def test_a_refused_stop_never_reaches_the_host_nor_the_history(actions, over, status):
    dash, calls = actions
    got, _, body = ask(dash, "POST", STOP, **page(dash, **over))
    assert got == status and body.count(b"\n") == (1 if status == 403 else 0)
    assert calls.stops == [] and not (dash.desk.root / ACTIONS_LOG).exists()


def test_a_container_gpurig_did_not_deploy_is_refused_and_the_refusal_recorded(actions):
    dash, calls = actions
    calls.stop_error = containerlife.NoSuchContainer("no container named postgres that gpurig deployed on gpu-01", host="gpu-01")
    status, _, body = ask(dash, "POST", "/api/hosts/gpu-01/containers/postgres/stop", **page(dash))
    assert status == 404 and b"was not stopped" in body and b"gpurig deployed" in body and body.count(b"\n") == 1
    calls.stop_error = HostError("unreachable: connection refused", host="gpu-01")
    assert ask(dash, "POST", STOP, **page(dash))[0] == 502
    for bad in ("/api/hosts/gpu-01/containers/..%2Fx/stop", "/api/hosts/gpu-01/containers/-x/stop", "/api/hosts/gpu-01/containers/a/b/stop"):
        assert ask(dash, "POST", bad, **page(dash))[0] == 404
    assert calls.stops == [("gpu-01", "postgres"), ("gpu-01", "jupyter")]  # a bad name never reached the library
    results = [(e["container"], e["result"]) for e in (json.loads(x) for x in (dash.desk.root / ACTIONS_LOG).read_text().splitlines())]
    assert results == [("postgres", "refused"), ("jupyter", "failed")]


class LabelledEngine:
    """An engine's containers and its label filter (Docker's ``label=KEY``), recording what it was asked to stop."""

    def __init__(self, containers) -> None:
        self.all = containers
        self.stopped: list[tuple[str, int]] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def containers(self, label=None):
        return [c for c in self.all if label is None or label in c.labels]

    def stop(self, name, timeout=10):
        self.stopped.append((name, timeout))


def test_the_librarys_stop_never_touches_a_container_deploy_did_not_make(monkeypatch):
    from gpurig.connect import engineopen

    engine = LabelledEngine([inspected(JUPYTER, "jupyter", DEPLOYED), inspected(STRANGER, "postgres"),
                             inspected("c" * 64, "old", {"io.gpurig.deploy.name": "old"}, status="exited")])
    monkeypatch.setattr(engineopen, "open_engine", lambda conn: engine)
    work = containerlife.lifecycle_work
    said = work(["postgres"], containerlife.stop_act, containerlife.stop_done_already)(SimpleNamespace())
    assert said.status == Status.FAILED and "no gpurig container named postgres" in said.detail and engine.stopped == []
    said = work(["old"], containerlife.stop_act, containerlife.stop_done_already)(SimpleNamespace())
    assert said.status == Status.OK and said.detail == "old: already stopped" and engine.stopped == []
    said = work(["jupyter"], containerlife.stop_act, containerlife.stop_done_already, check=True)(SimpleNamespace())
    assert said.status == Status.CHANGED and engine.stopped == []  # --check: what it would do
    said = work(["jupyter"], containerlife.stop_act, containerlife.stop_done_already)(SimpleNamespace())
    assert said.status == Status.CHANGED and said.data == ("jupyter",) and engine.stopped == [("jupyter", containerlife.STOP_TIMEOUT)]


def test_stop_container_says_which_refusal_is_which_before_and_after_the_host(monkeypatch):
    from gpurig.connect import fleet
    from gpurig.results import FleetReport, HostResult

    monkeypatch.setattr(containerlife, "select_hosts", lambda opts: [SimpleNamespace(name="gpu-01")])
    monkeypatch.setattr(containerlife, "make_connector", lambda opts: SimpleNamespace(close=lambda: None))
    answers: list[HostResult] = []
    asked: list[str] = []

    def run_fleet(hosts, work, **kw):
        asked.extend(h.name for h in hosts)
        return FleetReport(results=(answers.pop(0),), started="", duration_s=0.0)

    monkeypatch.setattr(fleet, "run_fleet", run_fleet)
    opts = SimpleNamespace(check=False)
    with pytest.raises(containerlife.NoSuchContainer, match="is not a container name"):
        containerlife.stop_container(opts, "gpu-01", "../etc")  # type: ignore[arg-type]
    with pytest.raises(containerlife.NoSuchContainer, match="not among the selected hosts"):
        containerlife.stop_container(opts, "gpu-99", "jupyter")  # type: ignore[arg-type]
    assert asked == []  # neither reached a host
    answers.append(HostResult("gpu-01", Status.FAILED, "no gpurig container named postgres here", data=()))
    with pytest.raises(containerlife.NoSuchContainer, match="no container named postgres that gpurig deployed on gpu-01"):
        containerlife.stop_container(opts, "gpu-01", "postgres")  # type: ignore[arg-type]
    answers.append(HostResult("gpu-01", Status.UNREACHABLE, "connection refused", fix="start sshd"))
    with pytest.raises(HostError, match="unreachable: connection refused"):
        containerlife.stop_container(opts, "gpu-01", "jupyter")  # type: ignore[arg-type]
    answers.append(HostResult("gpu-01", Status.OK, "jupyter: already stopped", data=()))
    done = containerlife.stop_container(opts, "gpu-01", "jupyter")  # type: ignore[arg-type]
    assert (done.changed, done.detail) == (False, "jupyter: already stopped")
    answers.append(HostResult("gpu-01", Status.CHANGED, "", data=("jupyter",)))
    assert containerlife.stop_container(opts, "gpu-01", "jupyter").changed  # type: ignore[arg-type]


def test_the_feeds_ask_a_hosts_engine_only_for_the_containers_its_samples_name(monkeypatch):
    from gpurig.connect import engineopen
    from gpurig.dashboard.feeds import Feeds

    class Engine(LabelledEngine):
        def container(self, ref):
            self.asked.append(ref)
            return next((c for c in self.all if c.id == ref), None)

    engine = Engine([inspected(JUPYTER, "jupyter", DEPLOYED)])
    engine.asked = []
    opened: list[str] = []

    def open_engine(conn):
        opened.append(conn)
        if conn == "down":
            raise HostError("docker is not running", "start it", host="gpu-02")
        return engine

    monkeypatch.setattr(engineopen, "open_engine", open_engine)
    hosts = [SimpleNamespace(name=f"gpu-0{i}", groups=()) for i in (1, 2, 3)]
    connector = SimpleNamespace(open=lambda host: "down" if host.name == "gpu-02" else host.name, close=lambda: None)
    feeds = Feeds(SimpleNamespace(settings=SimpleNamespace(inventory="hosts.yaml")), hosts, 1.0, connector=lambda: connector)  # type: ignore[arg-type]
    feeds.run.add("gpu-01", {"type": "sample", "t": T0, "cpu": {"percent": 1.0}, "gpus": [
        {"index": 0, "util_gpu": 1, "processes": [{"pid": 4242, "user": "alice", "name": "python", "used_mib": 10, "container": JUPYTER}]}]})
    feeds.run.add("gpu-02", {"type": "sample", "t": T0, "cpu": {"percent": 1.0}, "gpus": [
        {"index": 0, "util_gpu": 1, "processes": [{"pid": 9, "container": STRANGER}]}]})
    feeds.run.add("gpu-03", {"type": "sample", "t": T0, "cpu": {"percent": 1.0}, "gpus": [{"index": 0, "util_gpu": 1, "processes": [{"pid": 9}]}]})
    feeds.read_containers()
    assert opened == ["gpu-01", "down"] and engine.asked == [JUPYTER]  # gpu-03 holds no container: its engine is never asked
    doc, _, _ = feeds.document()
    [jupyter] = doc["live"]["hosts"]["gpu-01"]["gpus"]["0"]["holders"]
    assert jupyter["text"] == "jupyter (alice)" and jupyter["known"] is False and jupyter["no_stop"] == ""
    [stranger] = doc["live"]["hosts"]["gpu-02"]["gpus"]["0"]["holders"]
    assert "could not be asked: docker is not running" in stranger["no_stop"]
    feeds.read_containers()
    assert opened == ["gpu-01", "down"]  # nothing new, nothing due: no engine asked again
    feeds.container_changed("gpu-01")
    feeds.read_containers()
    assert opened[-1] == "gpu-01"
