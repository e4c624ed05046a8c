"""What `run` and `logs --follow` say and do when a signal stops them, how `run --wait` reports a job that failed, and what they say
while a job waits.

The tasks run in-process over one host whose connection is scripted: the
submission is gpurig's own (``submit_job``) over a host that answers as its
job agent would (its facts, engine and the tar of the sync stand in), and the
job agent's verbs answer as the host's would. The signal arrives where the
test says (while syncing, while the submission is on its way, while the log
is followed), as Ctrl-C or a CI runner's SIGTERM does: the main thread gets
it, and the command running stops as a real connection's does.
"""

from __future__ import annotations

import _thread
import json
import signal
from types import SimpleNamespace

import pytest
from fakes import RecordedEngine, ScriptedConnection
from invoke import Context
from invoke.exceptions import Exit

from gpurig.cli import base, jobqueue, options
from gpurig.cli import run as run_task
from gpurig.flows import fleettask, jobfind, jobrun
from gpurig.inventory import Host
from gpurig.jobs import submit
from gpurig.jobs.sync import SyncPlan, SyncResult

HOST = Host("gpu-01", (), {}, connection="ssh")


def verb(line: str) -> str:
    """The job agent's verb in a command line (the agent travels in front of it)."""
    return line.rsplit("))' ", 1)[1].split()[0]


class StreamingConnection(ScriptedConnection):
    """A scripted host whose commands' output also comes as a real connection gives it while they run: stdout to ``Streams.on_bytes``,
    stderr to ``on_output``."""

    def _execute(self, line, shown, *, timeout, on_output, watcher=None, streams=None):
        result = super()._execute(line, shown, timeout=timeout, on_output=on_output, watcher=watcher, streams=streams)
        if streams is not None and streams.on_bytes is not None and result.stdout:
            streams.on_bytes(result.stdout.encode())
        if on_output is not None and result.stderr:
            on_output("stderr", result.stderr)
        return result


class Host1:
    """The host as the agent on it answers; ``signum`` is sent to this process at the step ``stop_at`` names: "sync" (the tar of the
    working directory on its way), "submit" (the submission sent; ``made`` says whether the agent made the job before it was stopped)
    or "logs" (the log followed)."""

    def __init__(self, signum: int | None = None, ended: dict | None = None, stop_at: str = "logs", made: bool = False,
                 waits: tuple[tuple[str, str], ...] = ()) -> None:
        self.signum = signum
        self.ended = ended or {"state": "succeeded", "exit_code": 0}
        self.stop_at = stop_at if signum is not None else ""
        self.made_when_stopped = made
        self.waits = waits  # (state, reason) the agent's logs --follow says while the job is pending
        self.asked: list[str] = []
        self.job = ""
        self.made = False
        self.unreadable = False  # its job list cannot be read (after the interrupt)

    def stop(self, conn: ScriptedConnection):
        assert self.signum is not None
        _thread.interrupt_main(self.signum)  # the signal reaches the main thread, as the terminal's or the runner's does
        assert conn._interrupted.wait(30), "the fleet never stopped the command"
        return conn._interrupted_error()  # what a real connection raises for a command it stopped

    def listed(self) -> dict:
        if not self.made:
            return {"jobs": []}
        if self.stop_at in ("logs", "submit"):  # interrupted while the job went on
            return {"jobs": [{"id": self.job, "mode": "exec", "container": "box", "state": "running", "reason": ""}]}
        return {"jobs": [{"id": self.job, "mode": "exec", "container": "box", **self.ended,
                          "reason": f"exited {self.ended['exit_code']}" if self.ended["exit_code"] else ""}]}

    def connection(self) -> ScriptedConnection:
        conn: ScriptedConnection

        def answer(line: str):
            self.asked.append(verb(line))
            if self.asked[-1] == "submit":
                self.job = line.split("--id ", 1)[1].split()[0]
                if self.stop_at == "submit":
                    self.made = self.made_when_stopped
                    raise self.stop(conn)
                self.made = True
                return 0, json.dumps({"id": self.job, "state": "pending", "supervisor": "detached process"}), ""
            if self.asked[-1] == "logs":
                if self.stop_at == "logs":
                    raise self.stop(conn)
                waited = "".join("gpurig-job-wait: " + json.dumps({"state": st, "reason": why}) + "\n" for st, why in self.waits)
                return 0, "hi\n", waited + "gpurig-job-state: " + json.dumps(self.ended) + "\n"
            if self.asked[-1] == "list":
                if self.unreadable:
                    return 1, "", "sudo: unable to resolve host\n"
                return 0, json.dumps(self.listed()), ""
            if self.asked[-1] == "artifacts":
                return 0, json.dumps({"files": {"model.pt": [5, "0" * 64, 0o644, 0]}}), ""
            if self.asked[-1] == "pack" and self.stop_at == "pack":
                raise self.stop(conn)
            if self.asked[-1] == "samples":
                return 0, '{"records": []}', ""
            if self.asked[-1] == "cancel":
                if not self.made:
                    return 1, "", "gpurig-agent-error: " + json.dumps({"problem": f"there is no job {self.job} on this host"}) + "\n"
                return 0, json.dumps({"id": self.job, "state": "cancelled", "changed": True, "reason": "cancelled"}), ""
            raise AssertionError(f"unexpected command: {line[-200:]}")

        conn = StreamingConnection(HOST.name, answer)
        return conn


class FakeConnector:
    def __init__(self, host: Host1) -> None:
        self.host = host

    def open(self, _host: Host) -> ScriptedConnection:
        return self.host.connection()

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def sigint_raises():
    """Ctrl-C raises KeyboardInterrupt here, whatever the test runner set."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def gpu_host(monkeypatch, tmp_path, sigint_raises):
    """``gpu_host(signal=None, ended=..., stop_at=..., made=...)`` -> the scripted host `run` submits to and follows the job on."""
    made: list[Host1] = []

    def make(signum: int | None = None, ended: dict | None = None, **how) -> Host1:
        host = Host1(signum, ended, **how)
        made.append(host)
        return host

    def sync(agent, key, tree, *, job=None, job_files=None):
        if made[-1].stop_at == "sync":  # the tar of the working directory was on its way
            raise made[-1].stop(agent.conn)
        return SyncResult(SyncPlan((), (), 0), 0, 0)

    # what submit_job reads of the host before it syncs: no GPUs, the deployed container "box" the job runs in
    monkeypatch.setattr(submit, "gather_complete", lambda conn: SimpleNamespace(gpus=()))
    monkeypatch.setattr(submit, "open_engine", lambda conn: RecordedEngine([SimpleNamespace(name="box", raw={}, image="box:1")]))
    monkeypatch.setattr(submit, "sync", sync)
    for module in (run_task, jobqueue):
        monkeypatch.setattr(module, "select_hosts", lambda opts: [HOST])
    for module in (fleettask, jobrun, run_task, jobqueue):
        monkeypatch.setattr(module, "make_connector", lambda opts, early=None: FakeConnector(made[-1]), raising=False)
    monkeypatch.setattr(base, "PROGRAM_ARGV", ["gpurig", "run", "--", "sh", "train.sh"])
    (tmp_path / "train.sh").write_text("echo hi\n")
    monkeypatch.chdir(tmp_path)
    return make


def run(capsys, **flags) -> tuple[int, str]:
    """`gpurig run --container box --wait ... -- sh train.sh`: its exit code and all it wrote on stderr (its last line included)."""
    c = Context()
    c.remainder = "sh train.sh"
    capsys.readouterr()
    try:
        run_task.run(c, **{"container": "box", "wait": True, **flags})
        code, last = 0, ""
    except Exit as stop:
        code, last = stop.code, str(stop.message or "")
    return code, capsys.readouterr().err + last


@pytest.mark.parametrize(("signum", "code", "head"), [(signal.SIGINT, 130, "gpurig: interrupted; "),
                                                      (signal.SIGTERM, 143, "gpurig: terminated (SIGTERM); ")])
def test_a_signal_during_run_wait_detaches_and_says_once_how_to_follow_and_stop_the_job(gpu_host, capsys, signum, code, head):
    host = gpu_host(signum)
    got, said = run(capsys)
    job = host.job
    assert got == code
    assert said.strip().splitlines()[-1] == (f"{head}detached from job {job}, which goes on: follow it with gpurig logs --job {job} "
                                             f"--follow; stop it with gpurig cancel {job}")
    assert "run again" not in said and said.count(job) == 3  # one line: not "the command was stopped", not a recap of it
    assert "cancel" not in host.asked  # the job was left alone


def test_a_second_ctrl_c_while_gpurig_stops_still_says_what_became_of_the_job(gpu_host, capsys, monkeypatch):
    from gpurig.connect import fleet
    from gpurig.results import FleetInterrupted

    real = fleet.run_fleet

    def impatient(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except FleetInterrupted:
            raise KeyboardInterrupt from None  # the person's second Ctrl-C, landing while the fleet stopped its commands

    monkeypatch.setattr(fleet, "run_fleet", impatient)
    host = gpu_host(signal.SIGINT)
    got, said = run(capsys)
    assert got == 130 and said.strip().splitlines()[-1].startswith(f"gpurig: interrupted; detached from job {host.job}, which goes on")



@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_cancel_on_interrupt_cancels_the_job_on_its_host_and_says_so(gpu_host, capsys, tmp_path, signum, code):
    from gpurig.flows.cichain import first_reason

    host = gpu_host(signum)
    got, said = run(capsys, cancel_on_interrupt=True, json=str(tmp_path / "run.json"))
    assert got == code
    assert host.asked[-1] == "cancel"
    assert said.strip().splitlines()[-1].endswith(f"; cancelled job {host.job} (cancelled)")
    assert "goes on" not in said and "run again" not in said
    assert json.loads((tmp_path / "run.json").read_text())["job"]["state"] == "cancelled"  # the report, too, says what became of it
    assert first_reason(tmp_path / "run.json") == f"job {host.job} cancelled (cancelled)"  # ci's line when its runner cancels it


def test_cancel_on_interrupt_needs_wait(gpu_host, capsys):
    host = gpu_host()
    got, said = run(capsys, wait=False, cancel_on_interrupt=True)
    assert got == 2 and "--cancel-on-interrupt needs --wait" in said and host.asked == []


def test_a_job_that_exited_3_is_failed_in_the_recap_and_run_wait_exits_3(gpu_host, capsys, tmp_path):
    host = gpu_host(ended={"state": "failed", "exit_code": 3})
    got, said = run(capsys, json=str(tmp_path / "run.json"))
    assert got == 3
    assert f"gpu-01: job {host.job} failed (exited 3)" in said
    assert "failed=1" in said and "changed=1" not in said
    assert json.loads((tmp_path / "run.json").read_text())["hosts"][0]["status"] == "failed"


def test_a_job_that_succeeded_is_changed_and_exits_0(gpu_host, capsys):
    gpu_host()
    got, said = run(capsys)
    assert got == 0 and "changed=1" in said and "failed=0" in said


@pytest.mark.parametrize("task", ["logs --job ID --follow", "attach ID"])
def test_ctrl_c_on_logs_follow_or_attach_ends_quietly_in_one_line_with_130(gpu_host, capsys, monkeypatch, task):
    host = gpu_host(signal.SIGINT)
    host.job = "abc12345"
    from gpurig.jobs.views import job_view

    monkeypatch.setattr(jobfind, "find_job", lambda opts, wanted: job_view(HOST.name, {"id": host.job, "state": "running"}))
    capsys.readouterr()
    with pytest.raises(Exit) as stop:
        if task.startswith("logs"):
            jobqueue.logs(Context(), name=host.job, job=True, follow=True)
        else:
            jobqueue.attach(Context(), job=host.job)
    said = capsys.readouterr().err
    assert stop.value.code == 130
    assert str(stop.value.message) == f"gpurig: interrupted; stopped following job {host.job}, which goes on (gpurig cancel {host.job} stops it)"
    assert said == ""  # no recap, no "failed", no "run again"


def test_ci_runs_its_job_with_cancel_on_interrupt_unless_told_otherwise(monkeypatch, tmp_path):
    from gpurig.flows import cichain

    asked: list[dict] = []
    monkeypatch.setattr(jobrun, "run_job", lambda opts, host, request, **flags: asked.append(flags))
    (tmp_path / "run.json").write_text("{}")

    class Box:
        name, entry = "box", None

    opts = options.host_options(Context(), inventory=str(tmp_path / "hosts.yaml"))
    for cancel in (True, False):
        run = cichain.CiRun(opts, HOST, None, tmp_path, ("sh", "train.sh"), Box(), skipped=["build", "deploy", "verify"], cancel=cancel)
        cichain.run_chain(run, tmp_path, keep_reports=False)
    assert [a["cancel"] for a in asked] == [True, False]


@pytest.fixture
def slurm_job(monkeypatch, tmp_path):
    """`run --scheduler slurm --wait` whose following of Slurm job 42 a SIGTERM stops; what was cancelled, in ``cancelled``."""
    from types import SimpleNamespace

    from gpurig.jobs.views import job_view
    from gpurig.slurm import scheduler

    cancelled: list[str] = []
    node = Host("node-01", (), {}, connection="ssh")

    def follow(*args, **kwargs):
        raise base.Terminated()  # what the task's SIGTERM handler raises in the main thread

    def cancel(reach, cluster, job):
        cancelled.append(job)
        return job_view("ctl", {"id": job, "state": "cancelled", "mode": "slurm"})

    monkeypatch.setattr(scheduler, "the_cluster", lambda source: SimpleNamespace(nodes=(node,), controller=SimpleNamespace(name="ctl")))
    monkeypatch.setattr(scheduler, "submit", lambda *args, **kwargs: scheduler.Submitted("42", ("node-01",), "", "sbatch"))
    monkeypatch.setattr(scheduler, "find", lambda reach, cluster, job: job_view("ctl", {"id": job, "state": "running", "mode": "slurm"}))
    monkeypatch.setattr(scheduler, "follow", follow)
    monkeypatch.setattr(scheduler, "cancel", cancel)
    monkeypatch.setattr(base, "PROGRAM_ARGV", ["gpurig", "run", "--", "sh", "train.sh"])
    monkeypatch.chdir(tmp_path)
    return cancelled


@pytest.mark.parametrize("cancel", [True, False])
def test_a_sigterm_during_a_slurm_run_wait_scancels_the_job_only_when_asked(slurm_job, capsys, cancel):
    code, said = run(capsys, scheduler="slurm", cancel_on_interrupt=cancel)
    assert code == 143
    last = said.strip().splitlines()[-1]
    if cancel:
        assert slurm_job == ["42"] and last == "gpurig: terminated (SIGTERM); cancelled slurm job 42 (cancelled)"
    else:
        assert slurm_job == [] and last == ("gpurig: terminated (SIGTERM); detached from slurm job 42, which goes on: "
                                            "follow it with gpurig logs --job 42 --follow; stop it with gpurig cancel 42")


# --- a signal while run starts the job: what exists on the host decides the line ---------------------------------------------------


def last_line(said: str) -> str:
    return said.strip().splitlines()[-1]


@pytest.mark.parametrize("wait", [True, False])
def test_a_signal_while_the_working_directory_syncs_says_no_job_was_started_and_to_run_again(gpu_host, capsys, tmp_path, wait):
    host = gpu_host(signal.SIGINT, stop_at="sync")
    got, said = run(capsys, wait=wait, json=str(tmp_path / "run.json"))
    assert got == 130
    job = json.loads((tmp_path / "run.json").read_text())["job"]
    assert last_line(said) == (f"gpurig: interrupted; job {job['id']} was not started on gpu-01 (interrupted while syncing the working "
                               f"directory): nothing runs there; run again")
    assert "submit" not in host.asked and job["state"] == "not started"


@pytest.mark.parametrize("wait", [True, False])
def test_a_signal_while_the_submission_is_on_its_way_names_the_job_the_host_made_and_never_says_run_again(gpu_host, capsys, tmp_path, wait):
    host = gpu_host(signal.SIGTERM, stop_at="submit", made=True)
    got, said = run(capsys, wait=wait, json=str(tmp_path / "run.json"))
    assert got == 143
    assert last_line(said) == (f"gpurig: terminated (SIGTERM); job {host.job} was started on gpu-01 before the interrupt (running) and goes "
                               f"on: follow it with gpurig logs --job {host.job} --follow; stop it with gpurig cancel {host.job}")
    assert "run again" not in said  # a second run would start a second job
    assert json.loads((tmp_path / "run.json").read_text())["job"]["state"] == "running"


def test_cancel_on_interrupt_cancels_a_job_the_host_made_while_its_submission_was_interrupted(gpu_host, capsys):
    host = gpu_host(signal.SIGTERM, stop_at="submit", made=True)
    got, said = run(capsys, cancel_on_interrupt=True)
    assert got == 143 and host.asked[-1] == "cancel"
    assert last_line(said) == f"gpurig: terminated (SIGTERM); cancelled job {host.job} (cancelled)"


def test_a_submission_stopped_before_the_host_made_the_job_says_nothing_runs(gpu_host, capsys):
    host = gpu_host(signal.SIGINT, stop_at="submit", made=False)
    got, said = run(capsys, cancel_on_interrupt=True)
    assert got == 130 and "cancel" not in host.asked
    assert last_line(said) == (f"gpurig: interrupted; job {host.job} was not started on gpu-01 (interrupted while submitting it, before the "
                               f"host made it): nothing runs there; run again")


def test_a_submission_whose_fate_cannot_be_read_says_how_to_find_the_job(gpu_host, capsys, tmp_path):
    host = gpu_host(signal.SIGINT, stop_at="submit", made=True)
    host.unreadable = True
    got, said = run(capsys, json=str(tmp_path / "run.json"))
    assert got == 130 and "run again" not in said
    assert last_line(said).startswith(f"gpurig: interrupted; job {host.job} may have been started on gpu-01 (interrupted while submitting it; ")
    assert last_line(said).endswith(f"see it with gpurig jobs --job {host.job}; stop it with gpurig cancel {host.job}")
    job = json.loads((tmp_path / "run.json").read_text())["job"]
    assert job["state"] == "unknown" and "could not be read" in job["reason"]


# --- the JSON report after an interrupt -------------------------------------------------------------------------------------------


def test_the_json_report_of_a_detached_job_holds_the_state_its_host_gives_after_the_interrupt(gpu_host, capsys, tmp_path):
    gpu_host(signal.SIGINT)
    run(capsys, json=str(tmp_path / "run.json"))
    job = json.loads((tmp_path / "run.json").read_text())["job"]
    assert job["state"] == "running" and job["detached"] is True  # it said "pending", the state of its submission


def test_an_interrupted_artifact_fetch_says_so_in_the_report_and_that_none_of_the_files_moved(gpu_host, capsys, tmp_path):
    host = gpu_host(signal.SIGINT, stop_at="pack")
    got, said = run(capsys, artifacts=["model.pt"], json=str(tmp_path / "run.json"))
    doc = json.loads((tmp_path / "run.json").read_text())
    into = tmp_path / "gpurig-runs" / host.job
    assert got == 130
    assert doc["hosts"][0]["reason"] == (f"fetching job {host.job}'s artifacts was interrupted: 1 file to fetch, none of them moved into "
                                         f"{into}")
    assert doc["job"]["state"] == "succeeded" and doc["job"]["error"] == doc["hosts"][0]["reason"]
    assert last_line(said) == (f"gpurig: interrupted; job {host.job} had already ended (succeeded, exit code 0); bring its artifacts with "
                               f"gpurig fetch {host.job}")
    assert not (into / "model.pt").exists()


# --- a job that waits says why ------------------------------------------------------------------------------------------------------


QUEUED = ("pending", "waiting in the queue: 1 job ahead (ef012345 first)")
HELD = ("pending", "waiting for GPU 0 (held by job ef012345)")


def test_run_wait_on_a_job_that_waits_says_why_once_and_again_when_why_changes(gpu_host, capsys):
    host = gpu_host(waits=(("pending", "starting"), QUEUED, QUEUED, HELD, ("running", "")))
    got, said = run(capsys)
    lines = [line for line in said.splitlines() if line.startswith(f"job {host.job} is ")]
    assert got == 0 and lines[:2] == [f"job {host.job} is pending: {QUEUED[1]}", f"job {host.job} is pending: {HELD[1]}"]
    assert len(lines) == 3 and lines[2].startswith(f"job {host.job} is running (it waited ")


def test_logs_follow_on_a_waiting_job_says_why_it_waits(gpu_host, capsys, monkeypatch):
    from gpurig.jobs.views import job_view

    host = gpu_host(waits=(HELD, ("running", "")))
    host.job = "abc12345"
    monkeypatch.setattr(jobfind, "find_job", lambda opts, wanted: job_view(HOST.name, {"id": host.job, "state": "pending"}))
    capsys.readouterr()
    jobqueue.logs(Context(), name=host.job, job=True, follow=True)
    out, err = capsys.readouterr()
    assert out == "hi\n" and f"job abc12345 is pending: {HELD[1]}\n" in err


def test_a_slurm_job_pending_on_its_partition_says_slurms_reason_and_each_change(monkeypatch):
    from gpurig.jobs.views import job_view
    from gpurig.slurm import scheduler

    def view(state: str, reason: str):
        return job_view("ctl", {"id": "42", "state": state, "reason": reason, "mode": "slurm"})

    polls = iter([view("pending", "Resources"), view("pending", "Priority"), view("failed", "NodeFail")])
    explained = {"Resources": "Resources; partition gpu has no node Slurm gives jobs: node-01 (drained: gpurig: ecc)"}
    last = [view("pending", "Resources")]

    class Controller:
        cluster = SimpleNamespace(nodes=())

        def find(self, job, explain=False):
            if explain:
                return view(last[0].state, explained.get(last[0].reason, last[0].reason))
            last[0] = next(polls)
            return last[0]

    heard: list[tuple[str, str]] = []
    monkeypatch.setattr(scheduler, "POLL_S", 0)
    with pytest.raises(Exception, match="never ran on a node"):
        scheduler._follow(None, Controller(), last[0], lambda data: None, True, lambda state, why: heard.append((state, why)))
    assert heard == [("pending", explained["Resources"]), ("pending", "Priority"), ("failed", "NodeFail")]
