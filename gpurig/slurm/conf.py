"""A Slurm cluster as data (``SlurmCluster``, made from the inventory's groups and each node's facts) and the files it needs, as text.

Pure: no host is touched here. The controller is the one host of the
``slurm_controller`` group; the nodes are the hosts of ``slurm_nodes`` and
each child group of it is a partition (none: one partition, ``gpu``, of every
node). A node's line is what its own ``slurmd -C`` prints (CPUs, boards,
sockets, cores, threads; RealMemory a little under MemTotal, which moves with
kernels and firmware) with ``Gres=gpu:<type>:<n>`` from its GPU device files,
and gres.conf names each of them: Debian's Slurm has no NVML plugin, so
gpurig's facts stand in for autodetection. Every file is the same on every
host. The Prolog and Epilog keep the GPU -> job mapping the monitor reads
(dcgm-exporter's HPC job mapping format) and remove a job's containers.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from gpurig.inventory.profile import SlurmSettings

CONTROLLER_GROUP = "slurm_controller"
NODES_GROUP = "slurm_nodes"
DEFAULT_PARTITION = "gpu"
SLURM_CONF = "/etc/slurm/slurm.conf"
GRES_CONF = "/etc/slurm/gres.conf"
CGROUP_CONF = "/etc/slurm/cgroup.conf"
LIBEXEC = "/usr/local/libexec/gpurig"
HEALTH = f"{LIBEXEC}/slurm_health.py"
HEALTH_PROBE = f"{LIBEXEC}/verify_host.py"
HEALTH_SETTINGS = "/etc/gpurig/slurm-health.json"
PROLOG = f"{LIBEXEC}/slurm-prolog"
EPILOG = f"{LIBEXEC}/slurm-epilog"
GPU_JOBS_DIR = "/run/gpurig/slurm-gpus"  # <GPU index>: the ids of the jobs holding it, one a line (dcgm-exporter's format)
JOB_USERS_DIR = "/run/gpurig/slurm-jobs"  # <job id>: user= and uid= of its owner
JOB_LABEL = "io.gpurig.slurm.job"  # on the containers a job's batch script runs; the Epilog removes them
JWT_KEY = "/var/lib/slurm/slurmctld/jwt_hs256.key"  # slurmctld's key for slurmrestd's tokens (made on the controller, slurm's 0600)
REST_DROPIN = "/etc/systemd/system/slurmrestd.service.d/gpurig.conf"
REST_SOCKET = "/run/slurmrestd/slurmrestd.socket"
REST_PORT = 6820  # on the controller's loopback only: gpurig reaches it through its SSH connection
MEMORY_HEADROOM = 0.97  # RealMemory as a share of what slurmd -C reports: a node whose MemTotal shrinks a little stays in service
_HARDWARE_KEYS = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class SlurmNode:
    host: str  # the inventory's name for it
    name: str  # its NodeName: the host's own hostname, which slurmd registers with
    hardware: tuple[tuple[str, int], ...]  # from slurmd -C: CPUs, Boards, SocketsPerBoard, CoresPerSocket, ThreadsPerCore, RealMemory
    gpus: tuple[int, ...] = ()  # the minor numbers of its /dev/nvidiaN files
    gpu_type: str | None = None  # e.g. a100, from its GPUs' model (nvidia-smi), None when unknown
    partitions: tuple[str, ...] = (DEFAULT_PARTITION,)

    @property
    def gres(self) -> str:
        if not self.gpus:
            return ""
        return f"gpu:{self.gpu_type}:{len(self.gpus)}" if self.gpu_type else f"gpu:{len(self.gpus)}"


@dataclass(frozen=True)
class SlurmCluster:
    name: str
    controller: str  # the controller's hostname (SlurmctldHost)
    controller_host: str  # and its inventory name
    nodes: tuple[SlurmNode, ...]
    settings: SlurmSettings = SlurmSettings()
    version: tuple[int, int] = (22, 5)  # the controller's Slurm (its REST API's version follows it)

    def node(self, host: str) -> SlurmNode | None:
        return next((n for n in self.nodes if n.host == host), None)

    @property
    def partitions(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for n in self.nodes:
            for p in n.partitions:
                found.setdefault(p, []).append(n.name)
        return dict(sorted(found.items()))


def parse_slurmd_c(text: str) -> tuple[tuple[str, int], ...] | None:
    """The hardware of ``slurmd -C``'s first line (``NodeName=n1 CPUs=2 Boards=1 ... RealMemory=24105``), or None."""
    first = next((line for line in text.splitlines() if line.startswith("NodeName=")), "")
    found = dict(w.split("=", 1) for w in first.split()[1:] if "=" in w)
    values = []
    for key in _HARDWARE_KEYS:
        value = found.get(key, "")
        if not value.isdecimal() or not value.isascii() or len(value) > 12:
            return None
        values.append((key, int(value)))
    return tuple(values)


def gpu_type(model: str | None) -> str | None:
    """A Gres type from a GPU's model: 'NVIDIA A100-SXM4-80GB' -> a100, 'NVIDIA H100 80GB HBM3' -> h100 (None when nothing fits)."""
    if not model:
        return None
    words = [w for w in re.split(r"[\s_-]+", model.lower()) if w not in ("nvidia", "tesla", "geforce", "quadro", "rtx")]
    word = next((w for w in words if re.fullmatch(r"[a-z]+[0-9]+[a-z0-9]*", w)), None)
    return word[:16] if word else None


def slurm_conf(cluster: SlurmCluster) -> str:
    s = cluster.settings
    lines = [
        "# Written by gpurig (gpurig provision): the same file on every host of the cluster; edits are replaced.",
        f"ClusterName={cluster.name}",
        f"SlurmctldHost={cluster.controller}",
        "SlurmUser=slurm",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        *(["AuthAltTypes=auth/jwt", f"AuthAltParameters=jwt_key={JWT_KEY}"] if s.rest else []),
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "ReturnToService=2",
        "MpiDefault=none",
        "# cgroups confine each job to the GPUs, cores and memory it was given (cgroup.conf)",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup,task/affinity",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "GresTypes=gpu",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0",
        f"MinJobAge={s.min_job_age}",
        "# without a default a job is given the node's whole memory and a second one cannot start beside it",
        f"DefMemPerCPU={s.def_mem_per_cpu}",
        "JobCompType=jobcomp/filetxt",
        "JobCompLoc=/var/log/slurm/jobcomp.log",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "# which job holds which GPU, for gpurig's monitor; the Epilog also removes the containers a job left",
        f"Prolog={PROLOG}",
        f"Epilog={EPILOG}",
        "PrologFlags=Alloc",
        "# gpurig's host probe on every node: a node it fails is drained with its reason, and resumed when it passes",
        f"HealthCheckProgram={HEALTH}",
        f"HealthCheckInterval={s.health_interval}",
        "HealthCheckNodeState=ANY",
    ]
    for n in cluster.nodes:
        hardware = " ".join(f"{k}={_memory(v) if k == 'RealMemory' else v}" for k, v in n.hardware)
        lines.append(f"NodeName={n.name} {hardware}" + (f" Gres={n.gres}" if n.gres else "") + " State=UNKNOWN")
    for i, (name, nodes) in enumerate(cluster.partitions.items()):
        lines.append(f"PartitionName={name} Nodes={','.join(nodes)} Default={'YES' if i == 0 else 'NO'} MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _memory(mib: int) -> int:
    return max(1, int(mib * MEMORY_HEADROOM))


def gres_conf(cluster: SlurmCluster) -> str:
    lines = ["# Written by gpurig: each node's GPU device files (Debian's Slurm has no NVML autodetection)."]
    for n in cluster.nodes:
        for minor in n.gpus:
            kind = f" Type={n.gpu_type}" if n.gpu_type else ""
            lines.append(f"NodeName={n.name} Name=gpu{kind} File=/dev/nvidia{minor}")
    return "\n".join(lines) + "\n"


CGROUP = """\
# Written by gpurig: a job sees only its GPUs (devices), its cores and its memory.
ConstrainCores=yes
ConstrainDevices=yes
ConstrainRAMSpace=yes
"""

# Run by slurmd as root with no PATH. $SLURM_JOB_GPUS lists the global indexes (the gres.conf order) of the job's GPUs.
PROLOG_SCRIPT = f"""\
#!/bin/sh
# gpurig: which job holds which GPU (one file per GPU index, holding job ids: dcgm-exporter's HPC job mapping format)
PATH=/usr/sbin:/usr/bin:/sbin:/bin
job=$SLURM_JOB_ID
case $job in ''|*[!0-9_]*) exit 0 ;; esac
mkdir -p {GPU_JOBS_DIR} {JOB_USERS_DIR}
printf 'user=%s\\nuid=%s\\n' "$SLURM_JOB_USER" "$SLURM_JOB_UID" > {JOB_USERS_DIR}/$job.tmp && mv {JOB_USERS_DIR}/$job.tmp {JOB_USERS_DIR}/$job
IFS=,
for i in $SLURM_JOB_GPUS; do
    case $i in ''|*[!0-9]*) continue ;; esac
    {{ grep -vx "$job" {GPU_JOBS_DIR}/$i 2>/dev/null; echo "$job"; }} > {GPU_JOBS_DIR}/$i.tmp && mv {GPU_JOBS_DIR}/$i.tmp {GPU_JOBS_DIR}/$i
done
exit 0
"""

EPILOG_SCRIPT = f"""\
#!/bin/sh
# gpurig: forget the job's GPUs; remove the containers its batch script ran (they live outside the job's cgroup)
PATH=/usr/sbin:/usr/bin:/sbin:/bin
job=$SLURM_JOB_ID
case $job in ''|*[!0-9_]*) exit 0 ;; esac
IFS=,
for i in $SLURM_JOB_GPUS; do
    case $i in ''|*[!0-9]*) continue ;; esac
    if [ -f {GPU_JOBS_DIR}/$i ]; then
        grep -vx "$job" {GPU_JOBS_DIR}/$i > {GPU_JOBS_DIR}/$i.tmp
        if [ -s {GPU_JOBS_DIR}/$i.tmp ]; then mv {GPU_JOBS_DIR}/$i.tmp {GPU_JOBS_DIR}/$i; else rm -f {GPU_JOBS_DIR}/$i.tmp {GPU_JOBS_DIR}/$i; fi
    fi
done
unset IFS
rm -f {JOB_USERS_DIR}/$job
if command -v docker >/dev/null 2>&1; then
    ids=$(docker ps -aq --filter label={JOB_LABEL}=$job)
    [ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1
fi
exit 0
"""


def health_settings(node: SlurmNode) -> str:
    """What the node's health program checks against: its GPU count (and model), as the inventory and its facts say."""
    import json

    doc = {"expect_gpus": len(node.gpus)}
    return json.dumps(doc, sort_keys=True) + "\n"


def rest_api(version: tuple[int, int]) -> str:
    """slurmrestd's OpenAPI version for a Slurm release: 22.05 serves v0.0.38, 23.02 v0.0.39, 23.11 v0.0.40, 24.05 v0.0.41, 24.11 v0.0.42."""
    known = {(22, 5): "v0.0.38", (23, 2): "v0.0.39", (23, 11): "v0.0.40", (24, 5): "v0.0.41", (24, 11): "v0.0.42"}
    return known.get(version) or ("v0.0.38" if version < (23, 2) else "v0.0.42")


def rest_dropin(version: tuple[int, int]) -> str:
    """slurmrestd as its own user (its unit has none, and it refuses root), JWT auth, on a unix socket and the loopback."""
    plugin = "openapi/slurmctld" if version >= (23, 11) else f"openapi/{rest_api(version)}"  # 23.11 renamed the plugins
    return (f"# Written by gpurig: slurmrestd for gpurig run's submissions (JWT), listening on {REST_SOCKET} and 127.0.0.1 only.\n"
            "[Service]\nUser=slurmrestd\nGroup=slurmrestd\nRuntimeDirectory=slurmrestd\nRuntimeDirectoryMode=0755\n"
            "Environment=SLURM_JWT=daemon\nExecStart=\n"
            f"ExecStart=/usr/sbin/slurmrestd -a rest_auth/jwt -s {plugin} unix:{REST_SOCKET} 127.0.0.1:{REST_PORT}\n")


def files_for(cluster: SlurmCluster, host: str) -> dict[str, tuple[str, int]]:
    """path -> (content, mode) of every file gpurig writes on ``host`` (the controller gets no health or job scripts)."""
    files = {SLURM_CONF: (slurm_conf(cluster), 0o644), GRES_CONF: (gres_conf(cluster), 0o644), CGROUP_CONF: (CGROUP, 0o644)}
    if host == cluster.controller_host and cluster.settings.rest:
        files[REST_DROPIN] = (rest_dropin(cluster.version), 0o644)
    node = cluster.node(host)
    if node is not None:
        files[PROLOG] = (PROLOG_SCRIPT, 0o755)
        files[EPILOG] = (EPILOG_SCRIPT, 0o755)
        files[HEALTH_SETTINGS] = (health_settings(node), 0o644)
    return files


def name_problem(name: str) -> str | None:
    """Why a hostname cannot be a NodeName (slurm.conf and gres.conf lines, a shell word in the scripts), or None."""
    return None if _NAME.fullmatch(name) else f"{shlex.quote(name)} is not a host name Slurm can use (letters, digits, '.', '_', '-')"
