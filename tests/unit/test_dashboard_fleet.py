"""The dashboard's fleet row beyond facts and verify: a Slurm node's state as its controller has it, and provision's drift (--check).

The Slurm lines are sinfo's answer on a node: the state and reason columns as the recorded cluster view has them
(tests/fixtures/slurm/sinfo-drained.txt and sinfo-idle.txt, Slurm 22.05), with the %H column gpurig now asks for beside them
in the format sinfo prints it (ISO local time; ``Unknown`` where the node has no reason). The drift is built from provision's
own StepResults, as a check run returns them.
"""

from __future__ import annotations

from pathlib import Path

from fakes import ScriptedConnection

from gpurig.dashboard.snapshot import fleet_rows, slurm_cell
from gpurig.errors import HostError
from gpurig.flows.fleetprovision import drift
from gpurig.results import FleetReport, HostResult
from gpurig.slurm.health import SINFO, read_node
from gpurig.status import Status
from gpurig.steps.plan import Change, StepResult

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "tests" / "fixtures" / "slurm"


def recorded(name: str) -> tuple[str, str]:
    """(state, reason) of the first node of a recorded ``sinfo -N -o '%N|%P|%T|%E'``."""
    _, _, state, reason = (SLURM / name).read_text().splitlines()[0].split("|", 3)
    return state, reason


def node_result(answer, host="n1") -> HostResult:
    """The fleet's result for one node, its work what the dashboard runs: sinfo on the node, through read_node."""
    conn = ScriptedConnection(host, [answer])
    found = read_node(conn)
    assert conn.lines and "sinfo -h -n" in conn.lines[0] and "%T|%E|%H" in SINFO
    if isinstance(found, str):
        return HostResult(host, Status.FAILED, found)
    return HostResult(host, Status.OK, data=found)


def test_a_drained_node_shows_its_state_reason_and_since_when():
    state, reason = recorded("sinfo-drained.txt")
    cell = slurm_cell(node_result((0, f"{state}|{reason}|2026-12-04T10:31:12\n", "")), "", 1000.0)
    assert cell["state"] == "known" and cell["node"] == "drained" and cell["schedules"] is False
    assert cell["reason"].startswith("gpurig: host.driver: no NVIDIA driver loaded")
    assert cell["since"] == "2026-12-04T10:31:12" and cell["read_at"] == 1000.0


def test_an_idle_node_has_no_reason_and_no_time():
    state, reason = recorded("sinfo-idle.txt")
    cell = slurm_cell(node_result((0, f"{state}|{reason}|Unknown\n", "")), "")
    assert (cell["node"], cell["schedules"], cell["reason"], cell["since"]) == ("idle", True, "", "")


def test_a_node_not_responding_is_not_scheduling_whatever_its_state():
    cell = slurm_cell(node_result((0, "idle*|Not responding|2026-12-05T08:00:01\n", "")), "")
    assert (cell["node"], cell["responding"], cell["schedules"], cell["reason"]) == ("idle", False, False, "Not responding")


def test_a_reason_holding_a_bar_is_kept_whole():
    cell = slurm_cell(node_result((0, "down|disk a|b bad|2026-12-05T08:00:01\n", "")), "")
    assert (cell["node"], cell["reason"], cell["since"]) == ("down", "disk a|b bad", "2026-12-05T08:00:01")


def test_a_state_that_could_not_be_read_is_unknown_with_why_never_ok():
    failed = slurm_cell(node_result((1, "", "sinfo: error: Unable to contact slurm controller (connect failure)\n")), "")
    assert failed["state"] == "unknown" and "Unable to contact slurm controller" in failed["why"] and "exit 1" in failed["why"]
    silent = slurm_cell(node_result((0, "", "")), "")
    assert silent["state"] == "unknown" and "answered nothing" in silent["why"]
    lost = slurm_cell(node_result(HostError("connection lost", host="n1")), "")
    assert lost["state"] == "unknown" and "connection lost" in lost["why"]
    unreachable = slurm_cell(HostResult("n1", Status.UNREACHABLE, "connection refused"), "")
    assert unreachable["state"] == "unknown" and "connection refused" in unreachable["why"]
    assert slurm_cell(None, "")["state"] == "unknown" and slurm_cell(None, "")["why"]


def test_only_the_rows_given_a_slurm_cell_have_one():
    rows = fleet_rows(["n1", "web"], None, "facts are being read", {}, "", {}, {"n1": {"slurm": slurm_cell(None, "being read")}, "web": {}})
    assert rows[0]["slurm"] == {"state": "unknown", "why": "being read"} and "slurm" not in rows[1]


# --- provision's drift ------------------------------------------------------------------------------------------------------------


def checked(*steps: StepResult, status: Status = Status.OK) -> HostResult:
    return HostResult("a", status, data=tuple(steps))


def test_a_host_no_step_would_change_is_in_step():
    found = drift(checked(StepResult("docker", Status.OK, "docker 27.3 is installed"), StepResult("mig", Status.SKIPPED, "no MIG asked")))
    assert (found["state"], found["text"], found["would_change"]) == ("in step", "in step", [])


def test_steps_that_would_change_are_counted_and_named():
    found = drift(checked(StepResult("docker", Status.OK),
                          StepResult("daemon", Status.CHANGED, "would change (check mode): nvidia runtime missing",
                                     (Change("write /etc/docker/daemon.json"),)),
                          StepResult("persistence", Status.CHANGED, "would change (check mode): persistence off"), status=Status.CHANGED))
    assert found["state"] == "drift"
    assert found["text"] == "2 steps would change: daemon, persistence"
    assert found["reasons"]["daemon"].endswith("nvidia runtime missing")
    one = drift(checked(StepResult("python3", Status.CHANGED, "would change (check mode): install python3"), status=Status.CHANGED))
    assert one["text"] == "1 step would change: python3"


def test_what_was_not_seen_is_unknown_with_why():
    assert drift(None, "provision's check is running") == {"state": "unknown", "why": "provision's check is running"}
    assert drift(HostResult("a", Status.UNREACHABLE, "connection refused"))["why"] == "unreachable: connection refused"
    assert "sudo" in drift(HostResult("a", Status.FAILED, "sudo: a password is required"))["why"]
    planless = drift(checked(StepResult("gpus", Status.CHANGED, "would change (check mode): x"),
                             StepResult("driver", Status.FAILED, "facts incomplete"), StepResult("docker", Status.SKIPPED, "not run: step driver failed"),
                             status=Status.FAILED))
    assert planless["state"] == "unknown" and planless["why"] == "1 step could not plan: driver: facts incomplete"
    assert planless["would_change"] == ["gpus"]


def test_the_drift_cell_goes_into_the_row_beside_the_facts():
    report = FleetReport(results=(HostResult("a", Status.UNREACHABLE, "connection refused"),), started="", duration_s=0.0)
    row = fleet_rows(["a"], report, "", {}, "", {}, {"a": {"drift": drift(checked(status=Status.OK))}})[0]
    assert row["reach"] == "unreachable" and row["drift"]["state"] == "in step"


def test_the_feeds_ask_only_the_slurm_nodes_and_put_each_state_in_its_row():
    from types import SimpleNamespace

    from gpurig.dashboard.feeds import Feeds
    from gpurig.inventory import Host

    state, reason = recorded("sinfo-drained.txt")
    asked: list[str] = []

    def script(line: str):
        return (0, f"{state}|{reason}|2026-12-04T10:31:12\n", "") if "sinfo" in line else (1, "", "unexpected")

    def open_conn(host):
        asked.append(host.name)
        return ScriptedConnection(host.name, script)

    connector = SimpleNamespace(open=open_conn, close=lambda: None)
    opts = SimpleNamespace(settings=SimpleNamespace(forks=4, inventory="inventory/hosts.yaml", root=None))
    feeds = Feeds(opts, [Host("n1", ("slurm_nodes", "a100"), {}), Host("web", ("all",), {})], connector=lambda: connector)  # type: ignore[arg-type]
    rows = {r["host"]: r for r in feeds._section("fleet")["hosts"]}
    assert rows["n1"]["slurm"] == {"state": "unknown", "why": "the nodes' Slurm state is being read"} and "slurm" not in rows["web"]
    feeds._read_slurm()
    rows = {r["host"]: r for r in feeds._section("fleet")["hosts"]}
    assert asked == ["n1"]
    assert rows["n1"]["slurm"]["node"] == "drained" and rows["n1"]["slurm"]["since"] == "2026-12-04T10:31:12"
    assert rows["n1"]["slurm"]["read_at"] is not None and "slurm" not in rows["web"] and "drift" not in rows["n1"]


def test_verify_reads_the_same_line_and_still_fails_a_drained_node_with_its_reason():
    from gpurig.slurm.health import node_record

    state, reason = recorded("sinfo-drained.txt")
    record = node_record(ScriptedConnection("n1", [(0, f"{state}|{reason}|2026-12-04T10:31:12\n", "")]))
    assert record.status == "fail" and record.measured == "drained"
    assert record.detail.startswith("Slurm does not schedule on it: drained (gpurig: host.driver:") and "2026-12-04" not in record.detail
    idle = node_record(ScriptedConnection("n1", [(0, "idle|none|Unknown\n", "")]))
    assert (idle.status, idle.measured) == ("pass", "idle")


def test_an_idle_stop_line_goes_to_the_task_and_wakes_the_history_reader():
    from types import SimpleNamespace

    from gpurig.dashboard.feeds import Feeds

    lines: list[str] = []
    opts = SimpleNamespace(settings=SimpleNamespace(forks=4, inventory="inventory/hosts.yaml", root=None))
    feeds = Feeds(opts, [], connector=lambda: None, say=lines.append)  # type: ignore[arg-type]
    feeds.say("a100-01 jupyter: stopped")
    assert lines == ["a100-01 jupyter: stopped"] and feeds._wake["history"].is_set() and not feeds._wake["jobs"].is_set()
