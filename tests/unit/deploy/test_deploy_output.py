"""Where the deploy task puts a started Jupyter's access lines, which hold its token: a person's stream, never the JSON.

The task runs in-process over one local host, with everything before and
inside the host's work replaced: the image spec and the containers are not
what is tested, and ``deploy_host`` answers with the result a Jupyter
container's start gives (its access lines, the token in the URL).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from invoke import Context

from gpurig.cli import deploy as deploy_task
from gpurig.deploy import apply, containers, imagesource
from gpurig.image.spec import load_spec
from gpurig.inventory import Host
from gpurig.status import Status
from gpurig.steps.plan import Change, StepResult

SPEC = load_spec(Path(__file__).resolve().parents[3] / "images" / "pytorch.yaml")
TOKEN = "9c0ffee1d5a7e2b84f03a6c1"
ACCESS = (f"Jupyter: http://gpu-01:8888/lab?token={TOKEN}", "SSH: ssh -p 2222 gpurig@gpu-01")


@pytest.fixture
def deploy(monkeypatch, tmp_path, capsys):
    """``deploy(**flags)`` -> (stdout, stderr, whether the token was asked for) of the task over one local host."""
    asked: list[bool] = []

    def deploy_host(conn, job):
        asked.append(job.show_token)
        return [StepResult("gpurig-jupyter", Status.CHANGED, "", (Change("create gpurig-jupyter"),),
                           details={"image": "pytorch:2.14.1-cu130-jupyter", "access": ACCESS})]

    monkeypatch.setattr(apply, "deploy_host", deploy_host)
    monkeypatch.setattr(deploy_task, "load_project_spec", lambda c, spec: SPEC)
    monkeypatch.setattr(deploy_task, "select_hosts", lambda opts: [Host("gpu-01", (), {}, connection="local")])
    monkeypatch.setattr(imagesource, "local_engine_if_any", lambda: None)  # the task imports it when it runs
    monkeypatch.setattr(containers, "load_containers", lambda *args, **kwargs: ([], []))
    monkeypatch.chdir(tmp_path)

    def run(**flags):
        capsys.readouterr()
        deploy_task.deploy(Context(), **flags)
        out, err = capsys.readouterr()
        return out, err, asked[-1]

    return run


def test_json_on_stdout_is_only_the_report_and_the_access_lines_go_to_stderr(deploy):
    out, err, asked = deploy(json="-", show_token=True)
    doc = json.loads(out)  # nothing but the report: an access line on stdout would break it
    assert asked and TOKEN not in out
    assert [c["name"] for h in doc["hosts"] for c in h["containers"]] == ["gpurig-jupyter"]
    assert ACCESS[0] in err and ACCESS[1] in err  # --show-token: the person still sees them, on stderr


def test_a_json_file_never_holds_the_token_even_with_show_token(deploy, tmp_path):
    out, _, asked = deploy(json=str(tmp_path / "deploy.json"), show_token=True)
    written = (tmp_path / "deploy.json").read_text()
    assert asked and json.loads(written)["hosts"][0]["containers"][0]["name"] == "gpurig-jupyter"
    assert TOKEN not in written and "access" not in written
    assert ACCESS[0] in out  # the table's reader gets them
