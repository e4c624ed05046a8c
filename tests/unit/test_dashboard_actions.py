"""The dashboard beyond reading: a job's log tail, and with --allow-actions cancelling a job, each behind its checks.

The gate's rules for a POST are asked directly (token cookie, Origin, Sec-Fetch-Site, the anti-CSRF header, read-only mode);
the server is then asked over loopback, with a Desk whose library calls are stand-ins that record what reached them, so a
refused request is seen never to reach a host. The history line an action leaves is read back by the dashboard's own reader.
The library's side (a host that cannot be reached says so) runs against a real closed port.
"""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpurig.dashboard.actions import ACTIONS_LOG, Desk, read_actions
from gpurig.dashboard.history import read_history
from gpurig.dashboard.webauth import COOKIE, CSRF_HEADER, READ_ONLY, Gate, allowed_hosts
from gpurig.dashboard.webserver import Dashboard
from gpurig.errors import ConfigError, GpurigError, HostError
from gpurig.jobs.views import NoSuchJob, job_view

TOKEN = "t0ken-" + "y" * 37
LOCAL = allowed_hosts("127.0.0.1", 8080)
ORIGIN = "http://127.0.0.1:8080"


# --- the gate ------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def gate() -> Gate:
    return Gate(TOKEN, LOCAL, actions=True)


def post(gate: Gate, host: str = "127.0.0.1:8080", **headers: str):
    return gate.admit("POST", "/api/jobs/abc123/cancel", {"Host": host, **headers})


def good(gate: Gate, **over: str) -> dict[str, str]:
    headers = {"Cookie": f"{COOKIE}={TOKEN}", "Origin": ORIGIN, "Sec-Fetch-Site": "same-origin", CSRF_HEADER: gate.csrf or ""}
    headers.update(over)
    return {k: v for k, v in headers.items() if v is not None}


def test_an_action_from_the_page_itself_is_let_through(gate):
    assert post(gate, **good(gate)).status is None
    assert post(gate, **good(gate, **{"Sec-Fetch-Site": None})).status is None  # a browser that does not send it: Origin decides
    assert post(gate, "localhost:8080", **good(gate, Origin="http://localhost:8080")).status is None  # its own origin by either name


def test_an_action_without_the_token_is_401_and_without_the_cookie_403(gate):
    assert post(gate, **good(gate, Cookie=None)).status == 401
    assert post(gate, **good(gate, Cookie=f"{COOKIE}=wrong")).status == 401
    bearer = post(gate, **good(gate, Cookie=None, Authorization=f"Bearer {TOKEN}"))
    assert bearer.status == 403 and "cookie" in bearer.text


@pytest.mark.parametrize("origin", [None, "", "null", "http://evil.example", "http://127.0.0.1:8081", "https://127.0.0.1:8080",
                                    "http://localhost:8080", "http://127.0.0.1:8080.evil.example"])
def test_an_action_from_another_origin_is_403(gate, origin):
    said = post(gate, **good(gate, Origin=origin))
    assert said.status == 403 and said.text.startswith("cross-origin"), said


@pytest.mark.parametrize("site", ["cross-site", "same-site", "none"])
def test_an_action_the_browser_says_came_from_elsewhere_is_403(gate, site):
    said = post(gate, **good(gate, **{"Sec-Fetch-Site": site}))
    assert said.status == 403 and said.text.startswith("cross-site")


@pytest.mark.parametrize("csrf", [None, "", "wrong", "é"])
def test_an_action_without_the_anti_csrf_value_is_403(gate, csrf):
    said = post(gate, **good(gate, **{CSRF_HEADER: csrf}))
    assert said.status == 403 and CSRF_HEADER in said.text


def test_the_anti_csrf_value_is_fresh_per_dashboard_and_not_the_token():
    one, two = Gate(TOKEN, LOCAL, actions=True), Gate(TOKEN, LOCAL, actions=True)
    assert one.csrf and two.csrf and one.csrf != two.csrf and TOKEN not in (one.csrf, two.csrf)
    assert post(one, **good(two)).status == 403  # another dashboard's value is not this one's


def test_read_only_refuses_every_action_with_one_line_whatever_it_carries(gate):
    read_only = Gate(TOKEN, LOCAL)
    assert read_only.csrf is None
    said = post(read_only, **good(gate))
    assert (said.status, said.text) == (403, READ_ONLY)
    assert read_only.admit("DELETE", "/", {"Host": "127.0.0.1:8080", "Cookie": f"{COOKIE}={TOKEN}"}).status == 405


def test_a_host_header_of_another_name_is_refused_before_anything_else(gate):
    assert post(gate, "evil.example:8080", **good(gate, Origin="http://evil.example:8080")).status == 403


# --- the server ------------------------------------------------------------------------------------------------------------------


class Calls:
    """The library's calls as the Desk makes them: what reached them, and what each answers."""

    def __init__(self) -> None:
        self.logs: list[tuple[str, int]] = []
        self.cancels: list[str] = []
        self.pokes = 0
        self.log_text = "line 1\n"
        self.log_error: Exception | None = None
        self.cancel_error: Exception | None = None

    def read_log(self, job: str, lines: int):
        self.logs.append((job, lines))
        if self.log_error is not None:
            raise self.log_error
        return SimpleNamespace(text=self.log_text, view=job_view("gpu-01", {"id": job}), lines=lines, cut=False)

    def cancel(self, job: str):
        self.cancels.append(job)
        if self.cancel_error is not None:
            raise self.cancel_error
        return SimpleNamespace(view=job_view("gpu-01", {"id": job, "state": "running"}), changed=True, detail=f"job {job}: cancelled")

    def poke(self) -> None:
        self.pokes += 1


class StubFeeds:
    interval = 0.2

    def document(self):
        return {"schema": "gpurig.dashboard/1", "live": {"hosts": {}}}, {}, {}


def serve(tmp_path: Path, allow: bool):
    calls = Calls()
    desk = Desk(calls.read_log, calls.cancel, tmp_path, allow, calls.poke)  # type: ignore[arg-type]
    dash = Dashboard(StubFeeds(), TOKEN, "127.0.0.1", 0, desk=desk)  # type: ignore[arg-type]
    dash.serve()
    return dash, calls


@pytest.fixture
def actions(tmp_path):
    dash, calls = serve(tmp_path, allow=True)
    yield dash, calls
    dash.close()


@pytest.fixture
def read_only(tmp_path):
    dash, calls = serve(tmp_path, allow=False)
    yield dash, calls
    dash.close()


def ask(dash, method: str, path: str, **headers: str):
    conn = http.client.HTTPConnection("127.0.0.1", dash.port, timeout=10)
    try:
        conn.request(method, path, body=b"" if method == "POST" else None, headers={"Host": f"127.0.0.1:{dash.port}", **headers})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def page(dash, **over: str | None) -> dict[str, str]:
    """What the page's own script sends with a POST."""
    headers = {"Cookie": f"{COOKIE}={TOKEN}", "Origin": f"http://127.0.0.1:{dash.port}", "Sec-Fetch-Site": "same-origin",
               CSRF_HEADER: dash.gate.csrf or ""}
    headers.update(over)
    return {k: v for k, v in headers.items() if v is not None}


def test_a_log_with_html_in_it_is_sent_as_plain_text_byte_for_byte(read_only):
    dash, calls = read_only
    calls.log_text = '<script>alert("x")</script><img src=x onerror=alert(1)>\nhé ✓\n'
    status, headers, body = ask(dash, "GET", "/api/jobs/abc123/log?lines=50", Cookie=f"{COOKIE}={TOKEN}")
    assert status == 200 and body.decode() == calls.log_text
    assert headers["Content-Type"] == "text/plain; charset=utf-8" and headers["X-Content-Type-Options"] == "nosniff"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert calls.logs == [("abc123", 50)]
    ask(dash, "GET", "/api/jobs/abc123/log", Cookie=f"{COOKIE}={TOKEN}")
    assert calls.logs[-1] == ("abc123", 200)  # the last 200 lines by default


def test_a_log_asks_nothing_without_the_token(read_only):
    dash, calls = read_only
    for headers in ({}, {"Cookie": f"{COOKIE}=wrong"}, {"Authorization": "Bearer wrong"}):
        assert ask(dash, "GET", "/api/jobs/abc123/log", **headers)[0::2] == (401, b"")
    assert calls.logs == []


def test_an_unknown_job_is_404_with_one_line_and_an_unreachable_host_says_so(read_only):
    dash, calls = read_only
    auth = {"Cookie": f"{COOKIE}={TOKEN}"}
    calls.log_error = NoSuchJob("no job abc123 on the 2 hosts searched", "see the jobs with `gpurig jobs`")
    status, _, body = ask(dash, "GET", "/api/jobs/abc123/log", **auth)
    assert status == 404 and body == b"no job abc123 on the 2 hosts searched\n"
    status, _, body = ask(dash, "GET", "/api/jobs/NOT%20AN%20ID/log", **auth)
    assert status == 404 and body.count(b"\n") == 1 and b"is not a job id" in body
    calls.log_error = HostError("unreachable: connection refused", "start sshd", host="gpu-01")
    status, _, body = ask(dash, "GET", "/api/jobs/abc123/log", **auth)
    assert status == 502 and body.count(b"\n") == 1
    assert b"could not be read" in body and b"gpu-01" in body and b"unreachable: connection refused" in body
    assert ask(dash, "GET", "/api/jobs/abc123/log?lines=all", **auth)[0] == 400


def test_read_only_offers_no_action_and_refuses_every_post(read_only):
    dash, calls = read_only
    status, _, body = ask(dash, "GET", "/api/session", Cookie=f"{COOKIE}={TOKEN}")
    assert status == 200 and json.loads(body) == {"actions": False, "csrf": None, "log_lines": 200}
    status, _, body = ask(dash, "POST", "/api/jobs/abc123/cancel", **page(dash))
    assert (status, body) == (403, (READ_ONLY + "\n").encode())
    assert calls.cancels == [] and not (dash.desk.root / ACTIONS_LOG).exists()


def test_a_cancel_from_the_page_goes_through_and_lands_in_the_history(actions):
    dash, calls = actions
    status, _, body = ask(dash, "GET", "/api/session", Cookie=f"{COOKIE}={TOKEN}")
    session = json.loads(body)
    assert session["actions"] is True and session["csrf"] == dash.gate.csrf
    status, headers, body = ask(dash, "POST", "/api/jobs/abc123/cancel", **page(dash))
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"job": "abc123", "host": "gpu-01", "result": "cancelled", "detail": "job abc123: cancelled"}
    assert calls.cancels == ["abc123"] and calls.pokes == 1  # the feeds read the jobs again at once
    [line] = (dash.desk.root / ACTIONS_LOG).read_text().splitlines()
    assert TOKEN not in line and dash.gate.csrf not in line  # secrets never in the history
    entry = json.loads(line)
    assert {k: entry[k] for k in ("action", "job", "host", "result", "by", "client")} == {
        "action": "cancel", "job": "abc123", "host": "gpu-01", "result": "cancelled", "by": "dashboard", "client": "127.0.0.1"}
    [shown] = [e for e in read_history(dash.desk.root).entries if e["kind"] == "action"]
    assert shown["job"] == "abc123" and shown["result"] == "cancelled" and shown["file"] == "actions.jsonl"


@pytest.mark.parametrize(("over", "status"), [
    ({"Origin": "http://evil.example"}, 403), ({"Origin": None}, 403), ({"Sec-Fetch-Site": "cross-site"}, 403),
    ({CSRF_HEADER: None}, 403), ({CSRF_HEADER: "guess"}, 403), ({"Cookie": None}, 401),
    ({"Cookie": None, "Authorization": f"Bearer {TOKEN}"}, 403),
])
def test_a_refused_cancel_never_reaches_the_host_nor_the_history(actions, over, status):
    dash, calls = actions
    got, _, body = ask(dash, "POST", "/api/jobs/abc123/cancel", **page(dash, **over))
    assert got == status and body.count(b"\n") == (1 if status == 403 else 0)
    assert calls.cancels == [] and not (dash.desk.root / ACTIONS_LOG).exists()


def test_a_cancel_that_fails_says_why_and_is_recorded_as_failed(actions):
    dash, calls = actions
    calls.cancel_error = HostError("unreachable: connection refused", host="gpu-01")
    status, _, body = ask(dash, "POST", "/api/jobs/abc123/cancel", **page(dash))
    assert status == 502 and b"was not cancelled" in body and b"unreachable" in body and body.count(b"\n") == 1
    calls.cancel_error = NoSuchJob("no job zzz999 on the 1 host searched")
    assert ask(dash, "POST", "/api/jobs/zzz999/cancel", **page(dash))[0] == 404
    results = [(e["job"], e["result"]) for e in read_actions(dash.desk.root).entries]
    assert results == [("abc123", "failed"), ("zzz999", "failed")]
    assert ask(dash, "POST", "/api/jobs/abc123/stop", **page(dash))[0] == 404


def test_actions_need_a_project_to_record_them_in():
    with pytest.raises(ConfigError, match="--allow-actions records every action"):
        Desk(lambda job, lines: None, lambda job: None, None, allow=True)  # type: ignore[arg-type,return-value]


# --- the library: an unreachable host is said, never an empty log ---------------------------------------------------------------


def test_a_job_on_a_host_that_cannot_be_reached_is_one_line_not_an_empty_log(tmp_path):
    from gpurig.config import Settings
    from gpurig.flows.fleettask import HostOptions
    from gpurig.flows.jobact import cancel_job, log_tail

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"all:\n  hosts:\n    gpu-01:\n      ansible_host: 127.0.0.1\n      ansible_port: {port}\n")
    settings = Settings(root=tmp_path, inventory=inventory, forks=2, connect_timeout=3.0, host_key_policy="accept-new",
                        known_hosts=tmp_path / "known_hosts")
    opts = HostOptions(settings=settings, limit=())
    for call in (lambda: log_tail(opts, "abc123"), lambda: cancel_job(opts, "abc123")):
        with pytest.raises(GpurigError) as caught:
            call()
        assert not isinstance(caught.value, NoSuchJob)  # not "no such job": the host was never asked
        assert "could not be asked" in str(caught.value) and "gpu-01" in str(caught.value)


def test_a_log_tail_keeps_its_last_mib_and_a_slurm_log_its_last_lines(monkeypatch):
    from gpurig.flows import jobact, jobfind

    view = job_view("gpu-01", {"id": "abc123", "state": "running"})
    monkeypatch.setattr(jobfind, "find_job", lambda opts, wanted: view)
    said: dict[str, object] = {}

    def on_host(opts, found, work, label):
        said.update(found=found, label=label)
        work(SimpleNamespace())  # the agent's logs verb, stood in for below
        return None

    big = "x" * 1023 + "\n"
    monkeypatch.setattr(jobact, "on_host_quietly", on_host)
    monkeypatch.setattr(jobact, "log_work", lambda v, on_text, follow, tail: lambda conn: on_text(big * 1100 + "the end\n"))
    tail = jobact.log_tail(SimpleNamespace(), "abc123", 200)  # type: ignore[arg-type]
    assert tail.cut and len(tail.text.encode()) == jobact.MAX_LOG_BYTES and tail.text.endswith("the end\n")
    assert said == {"found": view, "label": "logs"} and tail.view is view

    slurm = job_view("ctl", {"id": "42", "state": "running", "mode": "slurm"})
    monkeypatch.setattr(jobfind, "find_job", lambda opts, wanted: slurm)
    from gpurig.slurm import scheduler

    monkeypatch.setattr(scheduler, "the_cluster", lambda inventory: None)
    monkeypatch.setattr(jobact, "slurm_reach", lambda opts: None)
    monkeypatch.setattr(scheduler, "follow", lambda reach, cluster, v, out, follow_it: out(b"".join(b"%d\n" % i for i in range(500))))
    tail = jobact.log_tail(SimpleNamespace(settings=SimpleNamespace(inventory=None)), "42", 3)  # type: ignore[arg-type]
    assert tail.text == "497\n498\n499\n" and not tail.cut
