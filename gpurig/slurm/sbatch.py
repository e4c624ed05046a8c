"""Jobs through Slurm (``gpurig run --scheduler slurm``): a batch script that runs the project's image on the GPUs Slurm allocated.

The working directory is synced to every node of the cluster beforehand (no
shared filesystem is assumed; a re-sync moves what changed), the image is on
every node, and ``sbatch`` on the controller (over SSH, as the login user; the
script on its stdin) queues the job. On each node of the allocation (one
``srun`` task a node) the job copies the synced tree (hard links) and runs the
image with ``docker run --rm`` (``--init`` only for an image that is not
gpurig's: gpurig's run tini as PID 1 themselves), giving it only the GPUs Slurm gave the
job (``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS``: ``--gpus device=...`` where
NVIDIA's runtime is, else the device files themselves), the job's memory and
CPUs (a container is dockerd's child, outside the job's cgroup, so Slurm's own
limits do not reach it), and the rendezvous of a multi-node run
(``MASTER_ADDR`` the first node, ``MASTER_PORT`` from the job id,
``NODE_RANK``, ``NNODES``, each passed as NAME=value: ``sudo -n docker``
keeps no variable); with ``--launcher torchrun`` the command is started by
torchrun with them. The job's env travels in srun's environment and reaches
docker as an env file (0600, removed when the container ends), never an argv.
The job's exit code is its failing rank's own (each node records its
container's, the batch script exits with it), not srun's highest or the
SIGTERM that stopped the other ranks. The Epilog removes whatever container a
cancelled job left. States and exit codes come from ``squeue --json``
(Slurm 22.05's and 24.11's shapes); the log is read on the batch host.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from gpurig.deploy.containers import ContainerSpec
from gpurig.errors import ConfigError, HostError
from gpurig.jobs.request import RunRequest
from gpurig.jobs.views import JobView, job_view

SYNC_ROOT = "/srv/gpurig/sync"
JOB_LABEL = "io.gpurig.slurm.job"
LAUNCHERS = ("none", "torchrun")
_RUNNING = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STAGE_OUT", "SIGNALING")
STATES = {"PENDING": "pending", "RUNNING": "running", "CONFIGURING": "running", "COMPLETING": "running", "SUSPENDED": "running",
          "COMPLETED": "succeeded", "CANCELLED": "cancelled"}


@dataclass(frozen=True)
class SlurmRequest:
    nodes: int = 1
    partition: str | None = None
    launcher: str = "none"
    gpus_per_node: int = 0


def folder(login: str, key: str) -> str:
    """The login user's sync folder for this working directory on every node (the job agent's layout: tree/, and runs/ beside)."""
    return f"{SYNC_ROOT}/{login}/{key}"


def log_path(login: str, key: str, job: str) -> str:
    return f"{folder(login, key)}/runs/{job}.log"


def time_limit(request: RunRequest) -> int | None:
    """The job's --timeout as Slurm's time limit, in whole minutes (at least one); None without one."""
    return max(1, int(request.timeout // 60)) if request.timeout else None


def docker_flags(spec: ContainerSpec) -> list[str]:
    """The job's container settings as `docker run` flags: deploy's init, /dev/shm, ulimits and datasets (each one word).

    Never the env: a flag's value is in the docker client's argv, which every user of the node sees in ps (``env_file``).
    """
    flags = ["--init"] if spec.init else []  # gpurig's images run tini as PID 1; a second init warns in every job's log
    flags += ["--ipc", spec.ipc] if spec.ipc != "private" else []
    if spec.shm_size:
        flags += ["--shm-size", str(spec.shm_size)]
    for u in spec.ulimits:
        flags += ["--ulimit", f"{u.name}={u.soft}:{u.hard}"]
    for v in spec.volumes:
        flags += ["--mount", f"type=bind,source={v.source},target={v.target}" + (",readonly" if v.read_only else "")]
    return flags


def batch_script(request: RunRequest, slurm: SlurmRequest, spec: ContainerSpec, image: str, login: str, key: str) -> str:
    """The sbatch script. Every value gpurig puts in it is a quoted shell word; the command reaches the container as its argv."""
    q = shlex.quote
    base = folder(login, key)
    argv = list(request.argv)
    words = " ".join(q(a) for a in argv)
    if slurm.launcher == "torchrun":  # the rendezvous from Slurm's environment, expanded by each node's shell
        script = argv[1:] if argv and argv[0] in ("python", "python3") else argv
        words = ('torchrun --nnodes="$SLURM_NNODES" --node_rank="$SLURM_NODEID" --nproc_per_node="$nproc" --rdzv_backend=c10d '
                 '--rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv_id="$SLURM_JOB_ID" ' + " ".join(q(a) for a in script))
    flags = " ".join(q(f) for f in docker_flags(spec))
    lines = [
        "#!/bin/sh",
        f"#SBATCH --job-name={request.name}",
        f"#SBATCH --output={log_path(login, key, '%j')}",
        f"#SBATCH --nodes={slurm.nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gres=gpu:{slurm.gpus_per_node}"] if slurm.gpus_per_node else []),
        *([f"#SBATCH --partition={slurm.partition}"] if slurm.partition else []),
        *([f"#SBATCH --time={time_limit(request)}"] if request.timeout else []),
        "# gpurig run --scheduler slurm: one task a node runs the image on the GPUs Slurm allocated there",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        # the job's env reaches each node in srun's environment (only its user and root read it), never in an argv
        f"GPURIG_ENV=$(cat <<'{ENV_END}'\n{env_file(spec)}{ENV_END}\n)",
        "export MASTER_ADDR MASTER_PORT GPURIG_ENV",
        f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 sh -c {q(node_script(base, image, flags, words))}",
        "ran=$?",
        "# the job's exit code: each node's, gathered from its own disk (srun's own is the highest, or the signal that stopped the others)",
        f"codes=$(srun --kill-on-bad-exit=0 --ntasks-per-node=1 sh -c {q(GATHER)} '' {q(base)})",
        f"exit $(printf '%s\\n' \"$codes\" | awk -v ran=\"$ran\" {q(PICK)})",
    ]
    return "\n".join(lines) + "\n"


ENV_END = "GPURIG_ENV_END"
# On each node after the job's step: what its container exited with (rank, code, 1 when a signal stopped it), and no env file left behind.
GATHER = 'r=$1/runs/$SLURM_JOB_ID/node$SLURM_NODEID; cat "$r.exit" 2>/dev/null; rm -f "$r.exit" "$r.env"'
# Rank 0's code when it failed on its own; else the lowest rank's that failed on its own (the others were stopped because of it);
# else the lowest failing rank's; else srun's (0 when every rank succeeded, or a node that recorded nothing).
PICK = """$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && $2 != 0 {
    if ($3 == 0 && (own == "" || $1 < own_rank)) { own = $2; own_rank = $1 }
    if (any == "" || $1 < any_rank) { any = $2; any_rank = $1 }
}
END { print (own != "" ? own : any != "" ? any : ran) }"""


def env_file(spec: ContainerSpec) -> str:
    """The job's env as the lines of docker's --env-file, written 0600 by each node's shell and removed when its container ends."""
    for name, value in spec.env:
        if "\n" in value or "\r" in value:
            raise ConfigError(f"--env {name}: a value with a line break cannot go through Slurm's docker run (its --env-file is one line a value)",
                              "put it in a file in the working directory and read it from there")
    return "".join(f"{name}={value}\n" for name, value in spec.env)


def node_script(base: str, image: str, flags: str, words: str) -> str:
    """What each node of the allocation runs: its copy of the tree, then the container on the job's own GPUs, memory and CPUs.

    Every value the container gets is in docker's argv as NAME=value, or in the env file: ``sudo -n docker`` (a user
    outside the docker group) resets the environment, so a bare ``--env NAME`` would pass nothing. The node records
    its container's exit code for the batch script (GATHER), and whether a signal stopped it (the job's end, or
    another rank's failure).
    """
    q = shlex.quote
    return "\n".join([
        "set -u",
        f"runs={q(base)}/runs/$SLURM_JOB_ID",
        'envs=$runs/node$SLURM_NODEID.env work=$runs/node$SLURM_NODEID killed=0 started=""',
        'finish() { rm -f "$envs"; printf \'%s %s %s\\n\' "$SLURM_NODEID" "$1" "$killed" > "$runs/node$SLURM_NODEID.exit"; exit "$1"; }',
        "# stopped before its container: it ends here; once docker runs, docker stops the container and the node records how it ended",
        """trap 'killed=1; [ -n "$started" ] || finish 143' HUP INT TERM""",
        'mkdir -p "$runs" && (umask 077 && : > "$envs" && if [ -n "$GPURIG_ENV" ]; then printf \'%s\\n\' "$GPURIG_ENV" > "$envs"; fi) || finish 125',
        "unset GPURIG_ENV",
        'gpus=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}',
        f'mkdir -p "$work" && cp -al {q(base)}/tree/. "$work"/ || finish 125',
        "if docker info >/dev/null 2>&1; then d=docker; else d='sudo -n docker'; fi",
        'devices=""; nproc=1',
        'if [ -n "$gpus" ]; then',
        '    nproc=$(echo "$gpus" | tr , "\\n" | grep -c .)',
        '    if $d info 2>/dev/null | grep -q "Runtimes:.*nvidia"; then devices="--gpus device=$gpus"',
        '    else for i in $(echo "$gpus" | tr , " "); do devices="$devices --device /dev/nvidia$i"; done',
        '        for f in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do [ -e "$f" ] && devices="$devices --device $f"; done; fi',
        "fi",
        'mem=""; [ -n "${SLURM_MEM_PER_NODE:-}" ] && mem="--memory ${SLURM_MEM_PER_NODE}m"',
        "cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)",
        'started=1; [ "$killed" = 0 ] || finish 143',
        f"$d run --rm --name gpurig-slurm-$SLURM_JOB_ID-$SLURM_NODEID --label {JOB_LABEL}=$SLURM_JOB_ID --network host "
        '$devices $mem ${cpus:+--cpuset-cpus $cpus} '
        f'--mount type=bind,source="$work",target=/workspace --workdir /workspace '
        '--env "MASTER_ADDR=$MASTER_ADDR" --env "MASTER_PORT=$MASTER_PORT" --env "NODE_RANK=$SLURM_NODEID" --env "NNODES=$SLURM_NNODES" '
        '--env "SLURM_JOB_ID=$SLURM_JOB_ID" '
        f'--env-file "$envs" {flags} {q(image)} {words}',
        'finish "$?"',
    ])


def submit_line(comment: str) -> list[str]:
    """``sbatch`` reading its script from stdin; prints the job id alone (--parsable)."""
    return ["sbatch", "--parsable", f"--comment={comment}"]


def parse_submitted(stdout: str, host: str) -> str:
    first = (stdout.strip().splitlines() or [""])[0].split(";")[0].strip()
    if not first.isdecimal():
        raise HostError(f"sbatch printed no job id ({stdout.strip()[:120] or 'nothing'})", "see what sbatch says on the controller", host=host)
    return first


def exit_status(code: Any) -> int | None:
    """The job's exit code from squeue's JSON: 22.05's raw wait status (768: exit 3; 9: killed by 9) or 24.11's object."""
    if isinstance(code, bool):
        return None
    if isinstance(code, int):
        signal, rc = code & 0x7F, code >> 8
        return 128 + signal if signal else rc
    if isinstance(code, dict):
        sig = (code.get("signal") or {}).get("id") or {}
        if sig.get("set") and sig.get("number"):
            return 128 + int(sig["number"])
        returned = code.get("return_code") or {}
        if returned.get("set"):
            return int(returned.get("number") or 0)
    return None


def job_state(job: dict) -> str:
    state = job.get("job_state")
    words = [state] if isinstance(state, str) else [s for s in state or () if isinstance(s, str)]
    return words[0] if words else "UNKNOWN"


def view_of(host: str, job: dict) -> JobView:
    """A Slurm job as gpurig's JobView: state, reason, exit code, times, nodes."""
    raw = job_state(job)
    state = STATES.get(raw, "failed")
    comment = str(job.get("comment") or "")
    command = comment.split(" ", 1)[1] if comment.startswith("gpurig:") and " " in comment else ""
    said = str(job.get("state_reason") or "")
    said = "" if said == "None" else said  # Slurm's word for no reason (a cancelled job's): never shown as "cancelled (None)"
    reason = "" if state in ("running", "succeeded") else raw.lower() if state == "failed" else said
    if state == "pending" and not reason:
        reason = "queued"

    def when(key: str) -> float | None:
        value = job.get(key)
        if isinstance(value, dict):
            value = value.get("number") if value.get("set") else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None

    code = exit_status(job.get("exit_code")) if state not in ("pending", "running") else None
    doc = {"id": str(job.get("job_id")), "name": job.get("name") or "", "state": state, "reason": reason,
           "argv": shlex.split(command) if command else [], "submitted_at": when("submit_time"), "started_at": when("start_time"),
           "ended_at": when("end_time") if state not in ("pending", "running") else None, "exit_code": code,
           "mode": "slurm", "container": job.get("nodes") or "", "batch_host": job.get("batch_host") or "",
           "slurm": {"state": raw, "nodes": job.get("nodes"), "user": job.get("user_name"), "comment": comment,
                     "partition": str(job.get("partition") or "")}}
    return job_view(host, doc)


def gpurig_jobs(squeue_json: str, host: str) -> list[JobView]:
    """gpurig's jobs among ``squeue --json``'s (Slurm 22.05 ignores its filters: every job in slurmctld's memory comes)."""
    try:
        doc = json.loads(squeue_json)
    except ValueError:
        raise HostError("squeue --json printed no JSON", "see what `squeue --json` prints on the controller", host=host) from None
    return [view_of(host, j) for j in doc.get("jobs") or () if isinstance(j, dict) and str(j.get("comment") or "").startswith("gpurig:")]


FOLLOW = r"""f=$1 id=$2 pos=0
while :; do
    if [ -f "$f" ]; then size=$(stat -c %s "$f"); if [ "$size" -gt "$pos" ]; then tail -c +$((pos + 1)) "$f" | head -c $((size - pos)); pos=$size; fi; fi
    case $(squeue -h -j "$id" -o %T 2>/dev/null) in
        PENDING|CONFIGURING|RUNNING|COMPLETING|SUSPENDED|REQUEUED|RESIZING|STAGE_OUT|SIGNALING) sleep 0.5 ;;
        *) [ -f "$f" ] && tail -c +$((pos + 1)) "$f"; break ;;
    esac
done
"""


def follow_line(path: str, job: str, follow: bool) -> list[str]:
    """On the batch host: the job's log (to its end when ``follow``, the job's end read from squeue there)."""
    if not follow:
        return ["cat", "--", path]
    return ["sh", "-c", FOLLOW, "gpurig-follow", path, job]


def is_active(view: JobView) -> bool:
    return view.raw.get("slurm", {}).get("state") in _RUNNING
