"""The CI chain driven from Python, without Invoke's program or context: gpurig.flows.cichain over stand-in stages.

The stages' library functions (build_images, deploy_fleet, verify_fleet,
run_job) are replaced by ones that record how the chain called them and
write the JSON report a real stage writes; no Docker, no host. What `gpurig
ci` does end to end on a real host: tests/integration/deploy/test_ci_chain.py.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gpurig.config import Settings
from gpurig.errors import ConfigError, Finished, SpecError
from gpurig.flows import cichain, fleetdeploy, fleetverify, imagebuild, jobrun
from gpurig.flows.fleettask import HostOptions
from gpurig.inventory import Host

HOST = Host("gpu-01", (), {}, connection="ssh")
SPEC = SimpleNamespace(name="pytorch")  # the chain hands the spec on; only the stages read it


class Terminated(KeyboardInterrupt):
    exit_code = 143  # what a CI runner's SIGTERM raises in the main thread (gpurig.cli.base.Terminated)


@pytest.fixture
def stages(monkeypatch, tmp_path):
    """The four stages replaced: ``stages.calls`` in order; ``stages.fail[name]`` is what that stage raises (after writing its report)."""
    calls: list[tuple[str, dict]] = []
    fail: dict[str, BaseException] = {}
    reports: dict[str, dict] = {}

    def stage(name):
        def record(*args, **kwargs):
            calls.append((name, {"args": args, **kwargs}))
            opts = next((a for a in args if isinstance(a, HostOptions)), None)
            if opts is not None and name in reports:
                with open(opts.json, "w") as f:
                    json.dump(reports[name], f)
            if name in fail:
                raise fail[name]
        return record

    monkeypatch.setattr(imagebuild, "build_images", stage("build"))
    monkeypatch.setattr(fleetdeploy, "deploy_fleet", stage("deploy"))
    monkeypatch.setattr(fleetverify, "verify_fleet", stage("verify"))
    monkeypatch.setattr(jobrun, "run_job", stage("run"))
    into = tmp_path / "work" / "gpurig-runs" / "abc12345"
    reports["run"] = {"job": {"id": "abc12345", "state": "succeeded", "artifacts": {"into": str(into)}}}
    return SimpleNamespace(calls=calls, fail=fail, reports=reports)


def chain(tmp_path, capsys, **given) -> tuple[int, str]:
    """run_chain over HOST with the job `sh train.sh` in the deployed container box: its exit code and what it said on stderr."""
    settings = Settings(root=tmp_path, inventory=tmp_path / "hosts.yaml", forks=4, connect_timeout=5.0, host_key_policy="accept-new",
                        known_hosts=tmp_path / "known_hosts")
    box = SimpleNamespace(name="box", entry=SimpleNamespace(torch="2.14.1", cuda="cpu"))
    run = cichain.CiRun(HostOptions(settings=settings, limit=("gpu-01",), verbose=1), HOST, SPEC, tmp_path, ("sh", "train.sh"), box,
                        workdir=str(tmp_path), artifacts=["out"], **given)
    out = tmp_path / "reports"
    out.mkdir(exist_ok=True)
    capsys.readouterr()
    try:
        cichain.run_chain(run, out, keep_reports=True)
        code = 0
    except Finished as stop:
        code = stop.code
    return code, capsys.readouterr().err


def test_each_stage_gets_the_host_its_report_and_the_job(stages, tmp_path, capsys):
    code, said = chain(tmp_path, capsys)
    assert code == 0
    assert [name for name, _ in stages.calls] == ["build", "deploy", "verify", "run"]
    build, deploy, verify, run = (kw for _, kw in stages.calls)
    assert build["args"] == (SPEC, tmp_path) and (build["variant"], build["torch"], build["cuda"]) == ("slim", "2.14.1", "cpu")
    out = tmp_path / "reports"
    for kw, report in ((deploy, "deploy.json"), (verify, "verify.json"), (run, "run.json")):
        opts = kw["args"][0]
        assert opts.json == str(out / report) and opts.limit == ("gpu-01",) and opts.verbose == 1 and not opts.check
        assert kw["args"][1] in ([HOST], HOST)  # deploy and verify take the hosts, run the one host
    assert verify["args"][2].container == "box" and verify["junit"] == str(out / "verify.xml")
    request = run["args"][2]
    assert request.argv == ("sh", "train.sh") and request.container == "box" and request.artifacts == ("out",)
    assert run["wait"] and run["cancel"] and run["junit"] == str(out / "run.xml")
    for line in ("ci: build ok", "ci: deploy ok", "ci: verify ok", "ci: run ok",
                 f"ci: collect ok (artifacts in {tmp_path / 'work' / 'gpurig-runs' / 'abc12345'}; reports in {out})"):
        assert line in said, said


def test_a_failing_stage_stops_the_chain_with_its_first_reason_and_its_code(stages, tmp_path, capsys):
    stages.reports["deploy"] = {"hosts": [{"host": "gpu-01", "status": "failed", "reason": "slim: failed",
                                           "containers": [{"name": "gpurig-slim", "status": "failed", "reason": "no /nonexistent/data"}]}]}
    stages.fail["deploy"] = Finished(1)
    code, said = chain(tmp_path, capsys, skipped=["build"])
    assert code == 1
    assert [name for name, _ in stages.calls] == ["deploy"]
    assert "ci: build skipped (--skip)" in said
    assert said.strip().splitlines()[-1] == "ci: stopped at deploy (exit 1: gpu-01: gpurig-slim: no /nonexistent/data); not run: verify, run, collect"


def test_a_job_that_exited_4_stops_the_chain_with_the_scripts_code(stages, tmp_path, capsys):
    stages.reports["run"] = {"job": {"id": "abc12345", "state": "failed", "reason": "exited 4"}}
    stages.fail["run"] = Finished(4)
    code, said = chain(tmp_path, capsys, skipped=["build", "deploy", "verify"])
    assert code == 4
    assert said.strip().splitlines()[-1] == "ci: stopped at run (exit 4: job abc12345 failed (exited 4)); not run: collect"


def test_a_stage_error_is_the_line_its_task_prints_then_where_the_chain_stopped(stages, tmp_path, capsys):
    stages.fail["build"] = SpecError("images/pytorch.yaml: no such variant", "choose slim")
    code, said = chain(tmp_path, capsys)
    assert code == 2
    assert said.strip().splitlines()[-2:] == ["gpurig: images/pytorch.yaml: no such variant; fix: choose slim",
                                              "ci: stopped at build (exit 2); not run: deploy, verify, run, collect"]


def test_a_runners_sigterm_during_a_stage_ends_the_chain_with_143(stages, tmp_path, capsys):
    stages.fail["verify"] = Terminated()
    code, said = chain(tmp_path, capsys)
    assert code == 143
    assert said.strip().splitlines()[-2:] == ["gpurig: terminated (SIGTERM)", "ci: stopped at verify (exit 143); not run: run, collect"]


def test_the_job_runs_with_cancel_on_interrupt_unless_told_otherwise(stages, tmp_path, capsys):
    chain(tmp_path, capsys, cancel=False)
    assert [kw["cancel"] for name, kw in stages.calls if name == "run"] == [False]


def test_only_build_deploy_and_verify_may_be_skipped():
    assert cichain.skipped_stages(" build, verify ") == ["build", "verify"]
    with pytest.raises(ConfigError) as refused:
        cichain.skipped_stages("build,run")
    assert "--skip 'run' is not a stage that may be left out" in str(refused.value)
