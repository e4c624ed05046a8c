"""The installed package is the product: gpurig's wheel and sdist, each installed in a fresh venv outside the checkout, do what the README says.

Both artifacts are built once per session from a copy of the checkout (so it
gets no build/ or egg-info) without build isolation (no download: setuptools
is already installed) and installed with ``--no-deps`` into a venv made with
``--system-site-packages``, whose own site-packages come first: the gpurig
that runs is the installed copy (asserted), its dependencies the machine's.
Every command runs with the venv's ``gpurig`` script, from a project made by
``gpurig init``, with no PYTHONPATH and HOME in a scratch directory; the host
is a loopback sshd (tests/integration/hosts) logging in as a sudo user, so
facts, exec, provision --check, verify, monitor and deploy --check cross real
SSH. These are the README's "Without this checkout" lines (with --json
where the test reads a result, and --no-deps / --no-build-isolation because
the dependencies are installed already); ``test_readme_lines_run_as_written``
runs the README's cheap command lines word for word.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
# What a source checkout may hold that is not part of the source.
_NOT_SOURCE = (".git", "build", "dist", "*.egg-info", "__pycache__", "build-contexts", "reports", ".venv", ".pytest_cache", ".bench-venv")
HOST = "rig-01"
CONTAINER_IMAGE = "debian:bookworm-slim"  # the integration fixtures' base image; deploy --check only looks at it


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    """The wheel and the sdist, built once for this module."""
    work = tmp_path_factory.mktemp("artifacts")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*_NOT_SOURCE), symlinks=True)
    dist = work / "dist"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w", str(dist)], cwd=src)
    run([sys.executable, "setup.py", "-q", "sdist", "-d", str(dist)], cwd=src)
    (wheel,) = dist.glob("gpurig-*.whl")
    (sdist,) = dist.glob("gpurig-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{' '.join(argv[:4])}: {proc.stderr[-2000:]}"
    return proc


@dataclass
class Installed:
    """gpurig installed from one artifact, in a venv of its own, and a project made there by ``gpurig init``."""

    kind: str
    venv: Path
    project: Path
    env: dict[str, str]

    def gpurig(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        argv = [str(self.venv / "bin" / "gpurig"), *args]
        return subprocess.run(argv, cwd=self.project, env=self.env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module", params=["wheel", "sdist"])
def installed(request, artifacts, tmp_path_factory, farm, client_key, login_user) -> Installed:
    base = tmp_path_factory.mktemp(f"installed-{request.param}")
    venv = base / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], cwd=base)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SSH_AUTH_SOCK") and not k.startswith("GPURIG_")}
    env.update(HOME=str(base), COLUMNS="250", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    py = str(venv / "bin" / "python")
    # pip from the system site-packages; an sdist is built into a wheel here, by its own setup.py
    run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(artifacts[request.param])], cwd=base, env=env)
    where = run([py, "-c", "import gpurig; print(gpurig.__file__)"], cwd=base, env=env).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed copy, not the checkout
    # invoke's console script, as pip writes it when it installs gpurig's dependencies (--no-deps left it out):
    # `invoke` in the project then runs the venv's Python, so its tasks.py imports the installed gpurig
    (venv / "bin" / "invoke").write_text(f"#!{py}\nimport sys\nfrom invoke.main import program\nsys.exit(program.run())\n")
    (venv / "bin" / "invoke").chmod(0o755)

    run([str(venv / "bin" / "gpurig"), "init", "myrig"], cwd=base, env=env)
    project = base / "myrig"
    [host] = farm.start(1, prefix=f"inst-{request.param}")
    inventory = {"all": {"hosts": {HOST: {
        "ansible_host": "127.0.0.1", "ansible_port": host.port, "ansible_user": login_user,
        "ansible_ssh_private_key_file": str(client_key), "ansible_become": True, "gpurig_gpu_count": 0,
        # memlock within any dockerd's hard limit (Linux's default is 64 KiB or more): the preflight must pass on any machine
        "gpurig_containers": [{"variant": "slim", "image": CONTAINER_IMAGE, "gpus": "none", "user": "inst", "ulimits": {"memlock": 65536}}],
    }}}}
    (project / "inventory" / "hosts.yaml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    return Installed(request.param, venv, project, env)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return proc


def test_init_gives_the_project_the_files_gpurig_ships(installed):
    for path in ("images/pytorch.yaml", "templates/Dockerfile.j2", "checks/verify_host.py", "checks/gpu_sampler.py", ".hadolint.yaml"):
        assert (installed.project / path).read_bytes() == (ROOT / path).read_bytes(), path
    assert (installed.project / "gpurig.yaml").is_file()


def test_matrix_render_lint(installed):
    assert "2.14.1" in ok(installed.gpurig("matrix")).stdout
    ok(installed.gpurig("render"))
    dockerfile = installed.project / "build-contexts" / "pytorch" / "2.14.1-cu130-slim" / "Dockerfile"
    assert dockerfile.read_text().startswith("# syntax=") or "FROM" in dockerfile.read_text()
    assert (dockerfile.parent / "checks" / "verify_torch.py").is_file()
    ok(installed.gpurig("lint"))


def test_facts_exec_and_provision_check_over_ssh(installed):
    report = installed.project / "facts.json"
    ok(installed.gpurig("facts", "-l", HOST, "--json", str(report)))
    [host] = json.loads(report.read_text())["hosts"]
    assert host["status"] == "ok" and host["data"]["os"]["id"] and host["data"]["missing"] == []

    said = json.loads(ok(installed.gpurig("exec", "-l", HOST, "--json", "-", "--", "echo", "hello")).stdout)
    assert [(h["host"], h["data"]["stdout"]) for h in said["hosts"]] == [(HOST, "hello\n")]  # the host's echo, over SSH

    plan = ok(installed.gpurig("provision", "-l", HOST, "--check", "--json", "-"))
    [host] = json.loads(plan.stdout)["hosts"]
    assert host["host"] == HOST and host["status"] in ("ok", "changed"), host
    steps = {s["step"]: s for s in host["steps"]}
    assert {"gpus", "driver", "docker", "container-toolkit", "daemon"} <= set(steps)
    assert steps["driver"]["status"] == "skipped" and steps["driver"]["reason"] == "no NVIDIA GPU on this host"


def test_verify_of_a_gpu_less_host_fails_with_the_driver_reason(installed):
    proc = installed.gpurig("verify", "-l", HOST, "--json", "verify.json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = json.loads((installed.project / "verify.json").read_text())
    assert doc["passed"] is False
    [host] = doc["hosts"]
    assert host["status"] == "failed" and host["reason"].startswith("host.driver: no NVIDIA GPU on this host: none on its PCI bus"), host["reason"]
    records = {r["id"]: r for r in host["data"]["records"]}
    assert records["host.driver"]["status"] == "fail"  # the probe ran on the host: not 'skip', not a missing probe
    row = next(line for line in proc.stdout.splitlines() if line.startswith(HOST))
    assert " fail " in row and "host.driver" in row


def test_monitor_writes_its_csv_and_plot(installed):
    out_csv, png = installed.project / "run.csv", installed.project / "run.png"
    ok(installed.gpurig("monitor", "-l", HOST, "--duration", "3", "--csv", str(out_csv), "--plot", str(png)))
    with open(out_csv, newline="") as fh:
        rows = list(csv.DictReader(fh, skipinitialspace=True))  # nvidia-smi's own ", " separators
    assert len(rows) >= 2 and {r["hostname"] for r in rows} == {HOST}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_deploy_check_plans_without_changing_the_host(installed):
    proc = installed.gpurig("deploy", "-l", HOST, "--check", "--json", "-")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    [host] = json.loads(proc.stdout)["hosts"]
    assert host["host"] == HOST and host["status"] == "changed", host
    [container] = host["containers"]
    assert (container["name"], container["action"], container["image"]) == ("gpurig-slim-inst", "create", CONTAINER_IMAGE)
    # check mode: the host's engine knows no such container afterwards, and no workspace was made
    docker = shutil.which("docker") or "docker"
    seen = run([docker, "ps", "-aq", "--filter", "name=^/gpurig-slim-inst$"], cwd=installed.project).stdout
    assert seen.strip() == ""
    assert not Path("/srv/gpurig/gpurig-slim-inst").exists()


@pytest.fixture
def job_image(installed):
    """A few-MB image in this machine's engine (the loopback host's), from this machine's own binaries; removed afterwards."""
    from deploy.gpuhost import IMAGE_SCRIPT, JOB_BINARIES

    ref = f"gpurig-installed-job:{installed.kind}"
    docker = shutil.which("docker") or "docker"
    env = {**os.environ, "PATH": f"{Path(docker).parent}:{os.environ.get('PATH', '')}"}
    subprocess.run(["sh", "-s", "--", ref, *JOB_BINARIES], input=IMAGE_SCRIPT, text=True, check=True, capture_output=True, env=env, timeout=120)
    try:
        yield ref
    finally:
        subprocess.run([docker, "image", "rm", "-f", ref], capture_output=True)


def test_run_jobs_and_logs_with_the_shipped_job_agent(installed, job_image):
    work = installed.project / "work"
    work.mkdir(exist_ok=True)
    (work / "job.sh").write_text("mkdir -p out; echo \"args: $*\" > out/args.txt; echo from the job\n")
    proc = installed.gpurig("run", "-l", HOST, "--image", job_image, "--gpus", "none", "--ulimit", "memlock=65536", "--workdir", str(work),
                            "--artifacts", "out", "--wait", "--json", "run.json", "--", "sh", "job.sh", "a b")
    doc = json.loads((installed.project / "run.json").read_text())["job"]
    try:
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert proc.stdout == "from the job\n" and doc["state"] == "succeeded"
        assert (work / "gpurig-runs" / doc["id"] / "out" / "args.txt").read_text() == "args: a b\n"
        listed = json.loads(ok(installed.gpurig("jobs", "-l", HOST, "--json", "-")).stdout)["jobs"]
        assert [j["id"] for j in listed if j["id"] == doc["id"]] == [doc["id"]]
        assert ok(installed.gpurig("logs", "--job", doc["id"])).stdout == "from the job\n"
    finally:
        shutil.rmtree(f"/srv/gpurig/jobs/{doc['id']}", ignore_errors=True)


def test_invoke_runs_gpurigs_tasks_in_the_new_project(installed):
    # init writes tasks.py: `invoke TASK` works in the project as `gpurig TASK` does, with the installed gpurig
    def invoke(*args: str) -> subprocess.CompletedProcess:
        argv = [str(installed.venv / "bin" / "python"), "-m", "invoke", *args]
        return subprocess.run(argv, cwd=installed.project, env=installed.env, capture_output=True, text=True, timeout=120)

    listed = ok(invoke("--list")).stdout
    assert all(re.search(rf"^  {t}\b", listed, re.M) for t in ("init", "build", "provision", "deploy", "verify", "monitor")), listed
    assert ok(invoke("hosts", "--format", "tsv")).stdout.splitlines()[1].startswith(f"{HOST}\t127.0.0.1")
    assert ok(invoke("matrix", "--format", "tsv")).stdout == ok(installed.gpurig("matrix", "--format", "tsv")).stdout


README = ROOT / "README.md"
# The tasks whose README lines this test runs as written: they need no host, no GPU and no image build.
RUN_HERE = ("matrix", "render", "lint", "images", "hosts", "inventory")
# The README's other command lines, and the tests that run them instead.
ELSEWHERE = {
    "init": "the `installed` fixture above (gpurig init myrig)",
    "build": "tests/integration/images (test_slim.py builds slim; a build takes minutes)",
    "facts": "test_facts_exec_and_provision_check_over_ssh (HOST is the loopback sshd)",
    "exec": "test_facts_exec_and_provision_check_over_ssh",
    "provision": "test_facts_exec_and_provision_check_over_ssh (--check); tests/integration/hosts_systemd for real runs",
    "verify": "test_verify_of_a_gpu_less_host_fails_with_the_driver_reason",
    "monitor": "test_monitor_writes_its_csv_and_plot",
    "deploy": "test_deploy_check_plans_without_changing_the_host",
    "run": "test_run_jobs_and_logs_with_the_shipped_job_agent (an image made here); tests/integration/deploy/test_jobs.py for the rest",
    "jobs": "test_run_jobs_and_logs_with_the_shipped_job_agent",
    "logs": "test_run_jobs_and_logs_with_the_shipped_job_agent (--job); tests/integration/deploy/test_deploy.py (containers)",
    "attach": "tests/integration/deploy/test_jobs.py",
    "fetch": "tests/integration/deploy/test_jobs.py",
    "cancel": "tests/integration/deploy/test_jobs.py",
    "ci": "tests/integration/deploy/test_ci_chain.py",
    "outdated": "tests/integration/images/test_outdated_cli.py (a folder index); test_cli_hosts.py (the fleet asked over SSH)",
    "rollout": "tests/integration/deploy/test_rollout.py (three hosts, one rolled back)",
    "promote": "tests/integration/deploy/test_rollout.py (after a rollout)",
}


def readme_command_lines() -> list[tuple[str, str | None]]:
    """(line, the output the README shows for it or None) for each `gpurig`/`invoke` line of its indented code blocks.

    A comment after the command (a space, then #) is cut off; a line written
    as a shell prompt (`$ invoke ...`) is followed in the README by what it prints.
    """
    lines = README.read_text().splitlines()
    found = []
    for i, raw in enumerate(lines):
        if not raw.startswith("    "):
            continue
        text = re.split(r"\s#", raw.strip())[0].strip()
        prompt = text.startswith("$ ")
        text = text.removeprefix("$ ")
        if text.split()[:1] in (["gpurig"], ["invoke"]):
            found.append((text, lines[i + 1].strip() if prompt else None))
    return found


def test_readme_lines_run_as_written(installed):
    commands = readme_command_lines()
    tasks = {line.split()[1] for line, _ in commands}
    assert tasks <= {*RUN_HERE, *ELSEWHERE}, f"a README line runs a task this test does not place: {tasks - {*RUN_HERE, *ELSEWHERE}}"
    ran = []
    for line, shown in commands:
        if line.split()[1] not in RUN_HERE:
            continue
        proc = subprocess.run(["bash", "-c", line], cwd=installed.project, env=installed.env, capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)
        assert "Traceback" not in proc.stderr, f"{line}: {proc.stderr[-2000:]}"
        if shown is None:
            assert proc.returncode == 0, f"{line}: {proc.stderr[-2000:]}"
        else:  # an error the README quotes: the same line, word for word
            assert proc.returncode != 0 and proc.stderr.strip() == shown, f"{line}: {proc.stderr}"
        ran.append(line)
    assert {"invoke matrix", "invoke render --all", "invoke lint", "gpurig matrix", "gpurig render", "gpurig lint"} <= set(ran), ran
    for task in ("logs", "init", "provision"):  # the README's "`invoke <task> --help` describes every flag"
        helped = subprocess.run(["bash", "-c", f"invoke {task} --help"], cwd=installed.project, env=installed.env,
                                capture_output=True, text=True, timeout=120)
        assert helped.returncode == 0 and "Options:" in helped.stdout, helped.stderr
    assert not (installed.project / "--help").exists()
