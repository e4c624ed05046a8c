"""The fleet runner against many real sshd hosts: partial failure, dead hosts, Ctrl-C, facts, known_hosts under load."""

from __future__ import annotations

import _thread
import json
import threading
import time

import pytest

from gpurig.connect.connector import Connector
from gpurig.connect.fleet import run_fleet
from gpurig.facts import Facts, gather
from gpurig.inventory import load_inventory
from gpurig.results import FleetInterrupted, Outcome


@pytest.fixture(scope="module")
def many(farm):
    """60 hosts, each its own sshd with its own host key."""
    return farm.start(60, prefix="many")


def _inventory(write_inventory, hosts, **extra):
    return load_inventory(write_inventory({h.name: {"ansible_host": "127.0.0.1", "ansible_port": h.port} for h in hosts} | extra))


def test_facts_from_sixty_hosts_and_known_hosts_written_safely_in_parallel(many, write_inventory, connector, tmp_path):
    inv = _inventory(write_inventory, many)
    report = run_fleet(inv.hosts.values(), gather, connector=connector, forks=60, report_path=tmp_path / "r.json")
    assert report.summary == {"ok": 60, "changed": 0, "failed": 0, "unreachable": 0, "skipped": 0}, report.summary
    assert report.exit_code == 0
    facts = report.by_host()[many[0].name].data
    assert isinstance(facts, Facts) and facts.os.id == "debian" and facts.cpus >= 1 and facts.kernel
    # 60 threads recorded 60 new keys at once: every one is there, exactly once, each line whole.
    lines = connector.settings.project_known_hosts.read_text().splitlines()
    assert sorted(line.split()[0] for line in lines) == sorted(h.known_hosts_name for h in many)
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["summary"]["ok"] == 60 and saved["hosts"][0]["data"]["os"]["id"] == "debian"


def test_one_bad_host_never_stops_the_others(many, write_inventory, connector, silent_port, refused_port, tmp_path):
    inv = _inventory(
        write_inventory,
        many[:5],
        dead={"ansible_host": "127.0.0.1", "ansible_port": refused_port},
        hung={"ansible_host": "127.0.0.1", "ansible_port": silent_port},
    )
    conn_settings = connector.settings.__class__(**{**connector.settings.__dict__, "connect_timeout": 1})
    c = Connector(conn_settings)

    def work(conn):
        if conn.name == many[1].name:
            conn.run("exit 4")
        if conn.name == many[2].name:
            return Outcome(changed=True, detail="wrote /etc/thing")
        return conn.run("hostname").ok

    report = run_fleet(inv.hosts.values(), work, connector=c, report_path=tmp_path / "report.json")
    by = report.by_host()
    assert by["dead"].status == "unreachable" and "refused" in by["dead"].reason
    assert by["hung"].status == "unreachable" and "handshake" in by["hung"].reason
    assert by[many[1].name].status == "failed" and "exited 4" in by[many[1].name].reason
    assert by[many[2].name].status == "changed"
    assert [by[h.name].status for h in (many[0], many[3], many[4])] == ["ok"] * 3
    assert report.exit_code == 1
    assert json.loads((tmp_path / "report.json").read_text())["summary"] == report.summary


def test_host_whose_sshd_dies_mid_run_fails_and_the_rest_finish(farm, write_inventory, connector):
    hosts = farm.start(4, prefix="die")
    victim = hosts[0]
    inv = _inventory(write_inventory, hosts)

    def work(conn):
        if conn.name == victim.name:
            def on_output(stream, text):
                if "started" in text:
                    threading.Thread(target=farm.kill, args=(victim,)).start()
            # Never ends by itself: only the host dying (or the 30 s timeout) stops it.
            return conn.run("echo started; exec tail -f /dev/null", on_output=on_output, timeout=30)
        return conn.run("echo fine").stdout

    start = time.monotonic()
    report = run_fleet(inv.hosts.values(), work, connector=connector)
    by = report.by_host()
    assert by[victim.name].status == "failed" and "connection lost" in by[victim.name].reason
    assert all(by[h.name].status == "ok" and by[h.name].data == "fine\n" for h in hosts[1:])
    assert time.monotonic() - start < 15


def test_ctrl_c_stops_cleanly_writes_the_report_and_closes_connections(many, write_inventory, connector, tmp_path):
    inv = _inventory(write_inventory, many[:8])
    first = many[0].name

    def work(conn):
        if conn.name == first:
            conn.run("true")
            _thread.interrupt_main()  # what Ctrl-C does to the main thread
        return conn.run("exec tail -f /dev/null", timeout=60)

    start = time.monotonic()
    with pytest.raises(FleetInterrupted) as err:
        run_fleet(inv.hosts.values(), work, connector=connector, forks=4, report_path=tmp_path / "r.json")
    assert time.monotonic() - start < 30  # half the 60 s commands: one that waited for them fails, however loaded the machine
    report = err.value.report
    assert report.interrupted and report.exit_code == 130
    assert all(r.status == "failed" and "interrupted" in r.reason for r in report.results)
    assert json.loads((tmp_path / "r.json").read_text())["interrupted"] is True


def test_local_host_runs_without_ssh(write_inventory, connector):
    inv = load_inventory(write_inventory({"localhost": {"ansible_connection": "local"}}))
    report = run_fleet(inv.hosts.values(), gather, connector=connector)
    assert report.results[0].status == "ok"
    assert report.results[0].data.os.id == "debian"
