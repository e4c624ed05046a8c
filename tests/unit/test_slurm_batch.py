"""The Slurm batch script run for real by /bin/sh, with stand-ins for srun, scontrol, sudo and docker on its PATH.

The stand-ins behave as the real ones do where the script depends on them:
srun starts one task a node (SLURM_NODEID) in its own process group, stops
the others with SIGTERM when one exits non-zero (--kill-on-bad-exit=1) and
returns the highest code (128 + N for a signal), as srun's man page says;
``sudo -n`` resets the environment (sudo's env_reset); docker refuses a user
outside its group and records what a container would get (its env from
``--env NAME=value``, ``--env NAME`` and ``--env-file``), then exits with the
code a test gives its rank, or waits for the TERM that stops it (143).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from gpurig.deploy.containers import ContainerSpec
from gpurig.jobs.request import RunRequest
from gpurig.slurm import sbatch

SRUN = r'''#!/usr/bin/env python3
import os, signal, subprocess, sys
args = sys.argv[1:]
kill = "--kill-on-bad-exit=1" in args
command = args[next(i for i, a in enumerate(args) if not a.startswith("-")):]
tasks = {}
for rank in range(int(os.environ["SLURM_NNODES"])):
    p = subprocess.Popen(command, env={**os.environ, "SLURM_NODEID": str(rank)}, start_new_session=True)
    tasks[p.pid] = p
codes = []
while tasks:
    pid, status = os.wait()
    if pid not in tasks:
        continue
    del tasks[pid]
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    codes.append(code)
    if code and kill:
        for p in tasks.values():
            os.killpg(p.pid, signal.SIGTERM)
sys.exit(max(codes))
'''

DOCKER = r'''#!/usr/bin/env python3
import json, os, signal, stat, sys
here = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(here, "denied")) and "SUDO_USER" not in os.environ:
    print("permission denied while trying to connect to the Docker daemon socket", file=sys.stderr)
    sys.exit(1)
args = sys.argv[1:]
if args[0] != "run":
    sys.exit(0)
env, i = {}, 1
while args[i] != "img:1":
    if args[i] == "--env":
        name, eq, value = args[i + 1].partition("=")
        env[name] = value if eq else os.environ.get(name, "")
    if args[i] == "--env-file":
        path = args[i + 1]
        mode = stat.S_IMODE(os.stat(path).st_mode)
        for line in open(path).read().splitlines():
            if line:
                name, _, value = line.partition("=")
                env[name] = value
    i += 1 + (args[i] in ("--env", "--env-file", "--name", "--label", "--network", "--mount", "--workdir", "--ulimit"))
rank = env["NODE_RANK"]
record = os.path.join(here, "..", f"rank{rank}.json")
with open(record + ".part", "w") as f:  # whole or not at all: srun may stop this rank mid-write when the other one fails
    json.dump({"env": env, "env_file_mode": mode, "argv": args}, f)
os.replace(record + ".part", record)
then = open(os.path.join(here, f"exit{rank}")).read()
if then.strip() == "wait":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with open(os.path.join(here, f"waiting{rank}"), "w") as f:  # the fixture stops a rank that srun never stopped
        f.write(str(os.getpid()))
    while True:
        signal.pause()
sys.exit(int(then))
'''

SUDO = '#!/bin/sh\n[ "$1" = -n ] && shift\nexec env -i PATH="$PATH" SUDO_USER=job "$@"\n'
SCONTROL = '#!/bin/sh\nprintf "node-a\\nnode-b\\n"\n'


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A folder with the stand-ins' bin/, the sync folder's tree, and a runner of the batch script: (exit code, per-rank records)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"srun": SRUN, "docker": DOCKER, "sudo": SUDO, "scontrol": SCONTROL}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setattr(sbatch, "SYNC_ROOT", str(tmp_path / "sync"))
    tree = Path(sbatch.folder("alice", "work-01")) / "tree"
    tree.mkdir(parents=True)
    (tree / "train.py").write_text("print(1)\n")

    def run(script: str, *, in_docker_group: bool, exits: dict[int, str]) -> tuple[int, dict[int, dict]]:
        if not in_docker_group:
            (bin_dir / "denied").touch()
        for rank, then in exits.items():
            (bin_dir / f"exit{rank}").write_text(then)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NNODES": "2"}
        done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
        records = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
        return done.returncode, records

    yield run
    for waiting in bin_dir.glob("waiting*"):  # a rank left waiting for a TERM (a failed test, a timeout) ends with the test
        try:
            os.kill(int(waiting.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def script(**env: str) -> str:
    spec = ContainerSpec(host="n1", name="gpurig-job-slurm", variant="", image="img:1", entry=None, env=tuple(env.items()))
    request = RunRequest(argv=("python", "train.py"), workdir=Path("."), name="train")
    return sbatch.batch_script(request, sbatch.SlurmRequest(nodes=2), spec, "img:1", "alice", "work-01")


@pytest.mark.parametrize("in_docker_group", [True, False], ids=["docker", "sudo-docker"])
def test_every_rank_gets_the_rendezvous_and_the_jobs_env_whatever_the_path_to_docker(cluster, in_docker_group):
    code, records = cluster(script(TOKEN="s p$(x)'"), in_docker_group=in_docker_group, exits={0: "0", 1: "0"})
    assert code == 0 and sorted(records) == [0, 1]
    for rank, record in records.items():
        env = record["env"]
        assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["NODE_RANK"], env["NNODES"]) == ("node-a", "20042", str(rank), "2")
        assert env["SLURM_JOB_ID"] == "42" and env["TOKEN"] == "s p$(x)'" and record["env_file_mode"] == 0o600
        assert not any("s p$(x)" in a for a in record["argv"])  # the secret is never in docker's argv, which ps shows
    runs = Path(sbatch.folder("alice", "work-01")) / "runs" / "42"
    assert not list(runs.glob("*.env")) and not list(runs.glob("*.exit"))  # the env files are gone once the job ends


def test_the_secret_is_never_in_the_argv_srun_runs():
    text = script(TOKEN="hunter2")
    srun_line = next(line for line in text.splitlines() if line.startswith("srun --kill-on-bad-exit=1"))
    assert "hunter2" not in srun_line  # srun's argv, and each node's sh -c, are in ps for every user


@pytest.mark.parametrize(("exits", "expected"), [
    ({0: "4", 1: "wait"}, 4),  # rank 0 failed; the other rank was stopped by srun (SIGTERM: 143)
    ({0: "wait", 1: "5"}, 5),  # rank 1 failed on its own and rank 0 was stopped because of it
    ({0: "3", 1: "0"}, 3),
    ({0: "0", 1: "7"}, 7),
    ({0: "0", 1: "0"}, 0),
], ids=["rank0-fails", "rank1-fails-rank0-stopped", "rank0-fails-alone", "rank1-fails-alone", "both-succeed"])
def test_a_multi_node_jobs_exit_code_is_the_failing_ranks_own_not_the_signal_that_stopped_the_others(cluster, exits, expected):
    code, _ = cluster(script(), in_docker_group=False, exits=exits)
    assert code == expected

