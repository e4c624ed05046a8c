"""The dashboard's rules without a browser: who gets an answer (token, cookie, Host, methods, headers), and what the page is sent.

The live section is built from a recorded monitor run (tests/fixtures/monitor/runs/healthy: an H100's real
samples) read back by the monitor's own loader, so the page's series are the ones ``gpurig monitor`` shows.
"""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

import pytest

from gpurig.dashboard import DashboardError, webauth
from gpurig.dashboard.history import read_history
from gpurig.dashboard.snapshot import cursor_of, fleet_rows, jobs_section, live_section, newest_cuda
from gpurig.dashboard.webauth import COOKIE, CSP, Gate, allowed_hosts, bind_address, new_token
from gpurig.dashboard.webserver import Dashboard
from gpurig.deploy.rollplan import RolloutState, state_path
from gpurig.monitor.record import load_run
from gpurig.results import FleetReport, HostResult
from gpurig.status import Status

ROOT = Path(__file__).resolve().parents[2]
HEALTHY = ROOT / "tests" / "fixtures" / "monitor" / "runs" / "healthy"
TOKEN = "t0ken-" + "x" * 37
LOCAL = allowed_hosts("127.0.0.1", 8080)


# --- the gate ------------------------------------------------------------------------------------------------------------------


def admit(target="/", method="GET", host="127.0.0.1:8080", **headers):
    return Gate(TOKEN, LOCAL).admit(method, target, {"Host": host, **headers})


def test_tokens_are_fresh_and_long():
    assert new_token() != new_token()
    assert len(new_token()) >= 43  # 32 random bytes


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Cookie": f"{COOKIE}=wrong"},
                                     {"Authorization": f"Basic {TOKEN}"}, {"Cookie": f"other={TOKEN}"}, {"Cookie": "\x00;;=="}])
def test_no_token_or_a_wrong_one_is_401(headers):
    assert admit("/api/snapshot", **headers).status == 401


def test_the_token_in_a_header_or_the_cookie_is_served():
    assert admit("/api/snapshot", Authorization=f"Bearer {TOKEN}").status is None
    assert admit("/api/events", Cookie=f"a=b; {COOKIE}={TOKEN}").status is None


def test_the_token_in_the_url_becomes_a_strict_cookie_and_leaves_the_url():
    answer = admit(f"/?view=gpus&token={TOKEN}")
    assert answer.status == 303
    assert answer.location == "/?view=gpus"
    assert answer.set_cookie == f"{COOKIE}={TOKEN}; HttpOnly; SameSite=Strict; Path=/"
    assert admit(f"/?token={TOKEN}x").status == 401
    assert admit(f"/?token={TOKEN}&token={TOKEN}").status == 401
    assert admit("/?token=", Cookie=f"{COOKIE}={TOKEN}").status == 401  # a wrong URL token is not rescued by the cookie


def test_the_token_is_compared_in_constant_time(monkeypatch):
    seen = []
    monkeypatch.setattr(webauth.hmac, "compare_digest", lambda a, b: seen.append((a, b)) or a == b)
    assert admit(Authorization=f"Bearer {TOKEN}").status is None
    assert seen == [(TOKEN.encode(), TOKEN.encode())]


@pytest.mark.parametrize("host", ["evil.example:8080", "127.0.0.1:8081", "127.0.0.1", "", "localhost.evil.example:8080"])
def test_a_host_header_of_another_name_is_refused_even_with_the_token(host):
    # DNS rebinding: a page of evil.example whose name now points at 127.0.0.1
    assert admit(host=host, Authorization=f"Bearer {TOKEN}").status == 403


def test_only_reads_are_served():
    said = admit(method="POST", Cookie=f"{COOKIE}={TOKEN}", Origin="http://127.0.0.1:8080")
    assert (said.status, said.text) == (403, "read-only: start the dashboard with --allow-actions")  # no --allow-actions
    assert admit(method="PUT", Authorization=f"Bearer {TOKEN}").status == 405
    assert admit(method="HEAD", Authorization=f"Bearer {TOKEN}").status is None
    assert admit(method="POST").status == 401  # and nobody learns that much without the token


def test_allowed_hosts_on_loopback_and_beyond():
    assert LOCAL == {"localhost:8080", "127.0.0.1:8080", "[::1]:8080"}
    shared = allowed_hosts("10.0.0.5", 9000, ("gpu-head", "gpu-head.lab.example"))
    assert shared == {"10.0.0.5:9000", "gpu-head:9000", "gpu-head.lab.example:9000"}
    assert allowed_hosts("::1", 1) == {"[::1]:1", "localhost:1", "127.0.0.1:1"}
    every = allowed_hosts("0.0.0.0", 2, ("gpu-head", "10.0.0.5", "[fd00::2]"))  # every address: this machine's names and its own
    assert every == {"localhost:2", "127.0.0.1:2", "[::1]:2", "gpu-head:2", "10.0.0.5:2", "[fd00::2]:2"}


def test_bind_takes_an_address_and_shares_only_with_a_token():
    assert bind_address("localhost", None) == "127.0.0.1"
    assert bind_address("127.0.0.1", None) == "127.0.0.1"
    assert bind_address("10.0.0.5", TOKEN) == "10.0.0.5"
    with pytest.raises(DashboardError, match="without a token"):
        bind_address("10.0.0.5", None)
    with pytest.raises(DashboardError, match="not an IP address"):
        bind_address("gpu-head.example", TOKEN)
    with pytest.raises(DashboardError):
        Gate("", LOCAL)


# --- what the page is sent ------------------------------------------------------------------------------------------------------


def test_live_section_carries_the_monitors_samples_as_compact_series():
    run = load_run(HEALTHY)
    live = live_section(run, "running", "", 1.0, {})
    host = live["hosts"]["gpu-healthy"]
    samples = run.series("gpu-healthy")
    assert len(host["points"]) == len(samples)
    assert host["points"][-1][0] == round(samples[-1].t, 3)
    assert all(len(p) == 3 and 0 <= p[1] <= 100 and 0 <= p[2] <= 100 for p in host["points"])
    gpu = host["gpus"]["0"]
    assert gpu["name"] == samples[-1].gpus[0].name
    assert [len(p) for p in gpu["points"]] == [6] * len(samples)
    assert gpu["points"][-1][1] == samples[-1].gpus[0].util_gpu
    assert host["source"] == "nvml"
    json.dumps(live, allow_nan=False)  # plain JSON, no NaN


def test_a_delta_has_only_the_samples_after_the_cursor():
    run = load_run(HEALTHY)
    first = live_section(run, "running", "", 1.0, {}, points=10)
    assert len(first["hosts"]["gpu-healthy"]["points"]) == 10
    cursor = cursor_of(first)
    assert cursor == {"gpu-healthy": run.series("gpu-healthy")[-1].t}  # unrounded: a rounded cursor would send a sample again
    assert live_section(run, "running", "", 1.0, {}, after=cursor)["hosts"]["gpu-healthy"]["points"] == []
    earlier = {"gpu-healthy": run.series("gpu-healthy")[-3].t}
    assert len(live_section(run, "running", "", 1.0, {}, after=earlier)["hosts"]["gpu-healthy"]["points"]) == 2


def test_fleet_rows_never_say_ok_for_what_was_not_read():
    unread = fleet_rows(["a"], None, "facts are being read", {}, "", {})
    assert unread[0]["reach"] == "unknown" and unread[0]["reason"] == "facts are being read"
    assert unread[0]["verify"]["state"] == "unknown" and unread[0]["verify"]["why"]
    report = FleetReport(results=(HostResult("a", Status.UNREACHABLE, "connection refused", fix="start sshd"),), started="", duration_s=0.0)
    verdict = {"verdict": "failed", "level": "quick", "time": "2026-12-01T10:00:00+00:00", "image": "pytorch:x", "reason": "host.driver: old",
               "source": "rollout r.json"}
    row = fleet_rows(["a"], report, "", {"a": verdict}, "", {"a": "failed: sampler died"})[0]
    assert (row["reach"], row["reason"], row["fix"]) == ("unreachable", "connection refused", "start sshd")
    assert row["verify"] == {"state": "known", **verdict}
    assert row["sampler"] == {"state": "failed", "why": "failed: sampler died"}


def test_jobs_section_says_which_hosts_could_not_be_asked():
    assert jobs_section(None, [], "", None)["state"] == "unknown"
    report = FleetReport(results=(HostResult("b", Status.FAILED, "python3 not found"),), started="", duration_s=0.0)
    found = jobs_section(report, [], "", 1.0)
    assert found["state"] == "partial" and found["unread"] == [{"host": "b", "status": "failed", "why": "python3 not found"}]


def test_newest_cuda_of_a_driver_from_the_compat_table():
    assert newest_cuda("570.133.20") == "12.8"
    assert newest_cuda("580.95.05") == "13.0"
    assert newest_cuda("450.1") is None and newest_cuda(None) is None


def test_history_reads_rollouts_builds_promotions_and_names_what_it_cannot_read(tmp_path):
    state = RolloutState.load(state_path(tmp_path, ["gpu"], "slim"), target="pytorch:new")
    state.record("gpu01", state="done", image_ref="pytorch:new", image_id="sha256:1", verify="passed", level="quick")
    state.record("gpu02", state="rolled-back", image_ref="pytorch:old", image_id="sha256:0", verify="failed", level="quick",
                 reason="host.driver: 535 < 580 needed; fix: upgrade the driver")
    builds = tmp_path / "reports" / "builds" / "pytorch"
    builds.mkdir(parents=True)
    (builds / "2.13-slim.json").write_text(json.dumps({
        "image": "pytorch:2.13-slim", "image_id": "sha256:abc", "built_at": "2026-12-01T09:00:00+00:00", "variant": "slim",
        "torch": "2.13.0", "cuda": "13.0", "duration_s": 61.0,
        "promotions": [{"alias": "pytorch:stable", "at": "2026-12-02T09:00:00+00:00", "verified_on": [{"host": "gpu01"}]}]}))
    (builds / "broken.json").write_text("{not json")
    found = read_history(tmp_path)
    assert [e["kind"] for e in found.entries][-2:] == ["promotion", "build"]
    assert found.verdicts["gpu02"]["verdict"] == "failed" and "upgrade the driver" in found.verdicts["gpu02"]["reason"]
    assert found.verdicts["gpu01"]["verdict"] == "passed"
    assert [u["path"] for u in found.unread] == [str(builds / "broken.json")] and found.unread[0]["why"]


# --- the server, over loopback ---------------------------------------------------------------------------------------------------


class StubFeeds:
    """What the server asks of the feeds, from the recorded run."""

    interval = 0.2

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.run = load_run(HEALTHY)

    def document(self):
        live = live_section(self.run, "running", "", self.interval, {})
        return {"schema": "gpurig.dashboard/1", "live": live}, cursor_of(live), {}

    def delta(self, cursor, versions):
        return {"live": {"hosts": {}}}, cursor, versions


@pytest.fixture
def server():
    dash = Dashboard(StubFeeds(), TOKEN, "127.0.0.1", 0)  # type: ignore[arg-type]
    dash.serve()
    yield dash
    dash.close()


def get(dash, path, **headers):
    conn = http.client.HTTPConnection("127.0.0.1", dash.port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{dash.port}", **headers})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Cookie": f"{COOKIE}=nope"}])
@pytest.mark.parametrize("path", ["/", "/api/snapshot", "/api/events", "/static/dashboard.js", "/nowhere"])
def test_the_server_gives_nothing_without_the_token(server, path, headers):
    status, got, body = get(server, path, **headers)
    assert (status, body) == (401, b"")
    assert got["Content-Security-Policy"] == CSP and got["Referrer-Policy"] == "no-referrer"


def test_the_server_serves_the_page_its_assets_and_the_snapshot_with_the_token(server):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, headers, body = get(server, "/", **auth)
    assert status == 200 and b"/static/dashboard.js" in body and b"<script>" not in body  # no inline script: CSP allows none
    assert headers["X-Content-Type-Options"] == "nosniff" and "script-src 'self'" in headers["Content-Security-Policy"]
    assert get(server, "/static/dashboard.js", **auth)[1]["Content-Type"].startswith("text/javascript")
    status, headers, body = get(server, "/api/snapshot", **auth)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["live"]["hosts"]["gpu-healthy"]["gpus"]["0"]["points"]
    assert get(server, "/static/../webserver.py", **auth)[0] == 404
    status, headers, _ = get(server, f"/?token={TOKEN}")
    assert status == 303 and headers["Location"] == "/" and "HttpOnly" in headers["Set-Cookie"]


def test_the_event_stream_opens_with_the_snapshot(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/api/events", headers={"Host": f"localhost:{server.port}", "Cookie": f"{COOKIE}={TOKEN}"})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    assert response.readline() == b"event: snapshot\n"
    data = response.readline()
    assert data.startswith(b"data: ") and json.loads(data[6:])["live"]["hosts"]["gpu-healthy"]
    conn.close()


def test_a_taken_port_is_one_line(server):
    with pytest.raises(DashboardError, match="cannot listen"):
        Dashboard(StubFeeds(), TOKEN, "127.0.0.1", server.port)  # type: ignore[arg-type]


def test_a_delta_names_a_gpus_holders_only_when_they_changed():
    run = load_run(HEALTHY)
    samples = run.series("gpu-healthy")
    cursor = {"gpu-healthy": samples[-2].t}
    gpu = live_section(run, "running", "", 1.0, {}, after=cursor)["hosts"]["gpu-healthy"]["gpus"]["0"]
    assert len(gpu["points"]) == 1 and "processes" not in gpu  # the same python of alice's as in the sample before
    whole = live_section(run, "running", "", 1.0, {}, points=1)["hosts"]["gpu-healthy"]["gpus"]["0"]
    assert whole["processes"] == [{"pid": 4242, "user": "alice", "name": "python", "used_mib": 48128}]


@pytest.mark.parametrize(("flags", "said"), [
    (["--bind", "gpu-head.example"], "--bind 'gpu-head.example' is not an IP address"),
    (["--port", "70000"], "--port 70000 is not a port number"),
    (["--interval", "0"], "--interval '0' is not a number of seconds"),
])
def test_cli_bad_flags_are_one_line_before_any_host(tmp_path, flags, said):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", "from gpurig.cli import main; main()", "dashboard", "-i", str(tmp_path / "none.yaml"), *flags],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and said in proc.stderr, proc.stderr


def test_a_held_gpu_under_5_percent_is_idle_since_its_streak_began():
    from gpurig.monitor.idle import IdleTracker

    run = load_run(ROOT / "tests" / "fixtures" / "monitor" / "runs" / "slurm_jobs")  # GPU 0 at 2% under job 42, GPU 2 at 0% held by none
    tracker = IdleTracker()
    samples = run.series("gpu-slurm-jobs")
    for s in samples:
        tracker("gpu-slurm-jobs", {"type": "sample"}, s)
    assert tracker.of("gpu-slurm-jobs") == {"0": samples[0].t}
    gpus = live_section(run, "running", "", 1.0, {}, idle=tracker, idle_after=20)["hosts"]["gpu-slurm-jobs"]["gpus"]
    assert gpus["0"]["idle_since"] == samples[0].t and gpus["1"]["idle_since"] is None and gpus["2"]["idle_since"] is None
    busy = samples[-1].gpus[1]
    tracker("gpu-slurm-jobs", {}, type(samples[-1])(host="gpu-slurm-jobs", t=samples[-1].t + 1, cpu_percent=1.0,
                                                      gpus=(type(busy)(index=0, util_gpu=50.0, hpc_jobs=busy.hpc_jobs),)))
    assert tracker.of("gpu-slurm-jobs") == {}  # busy again: the streak ends
