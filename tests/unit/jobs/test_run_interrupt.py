"""What `run --wait` and `logs --follow` say and do when a signal stops them, and how `run --wait` reports a job that failed.

The tasks run in-process over one host whose connection is scripted: the
submission is replaced (the job is on the host once it returns), and the job
agent's verbs answer as the host's would. The signal arrives while the log is
being followed, as Ctrl-C or a CI runner's SIGTERM does: the main thread gets
it, and the command reading the log stops as a real connection's does.
"""

from __future__ import annotations

import _thread
import json
import signal

import pytest
from fakes import ScriptedConnection
from invoke import Context
from invoke.exceptions import Exit

from gpurig.cli import base, jobqueue, options
from gpurig.cli import run as run_task
from gpurig.flows import fleettask, jobrun
from gpurig.inventory import Host
from gpurig.jobs import submit
from gpurig.jobs.sync import SyncPlan

HOST = Host("gpu-01", (), {}, connection="ssh")


def verb(line: str) -> str:
    """The job agent's verb in a command line (the agent travels in front of it)."""
    return line.rsplit("))' ", 1)[1].split()[0]


class Host1:
    """The host as the agent on it answers; ``signal`` is sent to this process when the log is being followed."""

    def __init__(self, signum: int | None = None, ended: dict | None = None) -> None:
        self.signum = signum
        self.ended = ended or {"state": "succeeded", "exit_code": 0}
        self.asked: list[str] = []
        self.job = ""

    def connection(self) -> ScriptedConnection:
        conn: ScriptedConnection

        def answer(line: str):
            self.asked.append(verb(line))
            if self.asked[-1] == "logs":
                if self.signum is not None:
                    _thread.interrupt_main(self.signum)  # the signal reaches the main thread, as the terminal's or the runner's does
                    assert conn._interrupted.wait(30), "the fleet never stopped the command"
                    raise conn._interrupted_error()  # what a real connection raises for a command it stopped
                return 0, "", "gpurig-job-state: " + json.dumps(self.ended) + "\n"
            if self.asked[-1] == "list":
                return 0, json.dumps({"jobs": [{"id": self.job, "mode": "exec", "container": "box", **self.ended,
                                                "reason": f"exited {self.ended['exit_code']}" if self.ended["exit_code"] else ""}]}), ""
            if self.asked[-1] == "samples":
                return 0, '{"records": []}', ""
            if self.asked[-1] == "cancel":
                return 0, json.dumps({"id": self.job, "state": "cancelled", "changed": True, "reason": "cancelled"}), ""
            raise AssertionError(f"unexpected command: {line[-200:]}")

        conn = ScriptedConnection(HOST.name, answer)
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
    """``gpu_host(signal=None, ended=...)`` -> the scripted host `run` submits to and follows the job on."""
    made: list[Host1] = []

    def make(signum: int | None = None, ended: dict | None = None) -> Host1:
        host = Host1(signum, ended)
        made.append(host)
        return host

    def submit_job(conn, target):
        made[-1].job = target.job
        return submit.Submitted(target.job, "pending", {}, SyncPlan((), (), 0))

    monkeypatch.setattr(submit, "submit_job", submit_job)
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

    monkeypatch.setattr(jobqueue, "find_job", lambda opts, wanted: job_view(HOST.name, {"id": host.job, "state": "running"}))
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
