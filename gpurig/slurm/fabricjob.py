"""``verify --level fabric --scheduler slurm``'s job, pure: the batch script, and its log read back into a FabricRun.

One Slurm job over the chosen nodes, one task a node, in two steps (``srun``):
checks/fabric_facts.py in the image on every node (with ``--to`` the
rendezvous' address as that node resolves it), then checks/fabric_allreduce.py,
rank ``$SLURM_NODEID`` of ``$SLURM_NNODES``, the rendezvous from Slurm: the
allocation's first node by name (as ``run --scheduler slurm`` gives
MASTER_ADDR) on ``gpurig_fabric.port``. Each probe runs in a container of the
image with host networking, labelled with the job's id (the Epilog removes
what a cancelled job leaves), on the GPU Slurm gave the task where the nodes
have GPUs. Each node writes what its probes said as lines
``gpurig-fabric KIND NODEID TEXT`` to a file of its own
(``~/.cache/gpurig/fabric-JOB.out``, the login user's), which gpurig reads
over SSH and removes; ``parse_log`` turns them into facts and rank documents
per node. Not through srun's output: srun forwards a task's output in 1 kB
pieces, and two nodes' long lines (a facts document is a few kB) came back
cut and interleaved. The batch script's own words (srun's errors) go to
``fabric-JOB.batch`` on the batch host. Every value gpurig puts in the script
is a quoted shell word; only Slurm's own variables are expanded there.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpurig.slurm.conf import JOB_LABEL

MARK = "gpurig-fabric"
FABRIC_LABEL = "io.gpurig.fabric"  # as the SSH path's containers: the run's id
SHM = "16g"  # as the SSH path's containers (verify.runner.IMAGE_SHM_BYTES)
FOLDER = '"$HOME/.cache/gpurig"'  # on each node, the login user's: fabric-JOB.out (the node's lines), fabric-JOB.batch (the batch host's)
_LINE = re.compile(rf"^{MARK} (node|to|facts|rank|exit-facts|exit-rank) (\d+) ?(.*)$")


@dataclass(frozen=True)
class FabricNode:
    """A node of the job: the inventory's name for it, Slurm's NodeName, and its gpurig_fabric.interface."""

    host: str
    node: str
    interface: str | None = None


@dataclass(frozen=True)
class FabricJob:
    """What one fabric job runs: on which nodes, the image, the rendezvous port, the ranks' watchdog, sizes, GPUs per node."""

    nodes: tuple[FabricNode, ...]
    image: str
    port: int
    timeout: float  # fabric_allreduce.py's --timeout: the rendezvous, and each all-reduce
    sizes: tuple[int, ...]
    run_id: str
    partition: str | None = None
    gpus_per_node: int = 0
    facts: bool = True  # the culprit's pair jobs measure only
    iters: int = 20
    facts_timeout_s: float = 120.0

    @property
    def minutes(self) -> int:
        """The job's time limit: the facts step, the ranks' every watchdog phase and a container start each, rounded up."""
        ranks = self.timeout * (3 + len(self.sizes)) + 60
        return int((self.facts_timeout_s if self.facts else 0) + ranks + 59) // 60 + 1


def sbatch_line(comment: str) -> list[str]:
    """``sbatch`` reading the script on its stdin, printing the job id alone."""
    return ["sbatch", "--parsable", f"--comment={comment}"]


def batch_script(job: FabricJob, facts_source: str, rank_source: str) -> str:
    """The sbatch script: the rendezvous from the allocation, the facts step (unless a pair's job), the ranks' step."""
    from gpurig.connect.launcher import embedded

    q = shlex.quote
    names = ",".join(n.node for n in job.nodes)
    lines = [
        "#!/bin/sh",
        "#SBATCH --job-name=gpurig-fabric",
        "#SBATCH --output=/dev/null",
        f"#SBATCH --nodes={len(job.nodes)}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --nodelist={names}",
        f"#SBATCH --time={job.minutes}",
        *([f"#SBATCH --partition={job.partition}"] if job.partition else []),
        *([f"#SBATCH --gres=gpu:{job.gpus_per_node}"] if job.gpus_per_node else []),
        "# gpurig verify --level fabric --scheduler slurm: facts, then one all-reduce rank a node, in the image",
        f"mkdir -p {FOLDER} && exec >{FOLDER}/fabric-$SLURM_JOB_ID.batch 2>&1",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_ADDR",
    ]
    words = {"facts": embedded(facts_source, "fabric_facts.py", ["--json"]),
             "rank": embedded(rank_source, "fabric_allreduce.py", rank_args(job))}
    for kind in steps(job):
        lines.append(f"srun --kill-on-bad-exit=0 --ntasks-per-node=1 sh -c {q(node_script(job, kind, words[kind]))}")
    return "\n".join(lines) + "\n"


def rank_args(job: FabricJob) -> list[str]:
    """fabric_allreduce.py's fixed words; rank, world and the rendezvous' host come from Slurm on each node (``node_script``)."""
    return ["--json", "--master-port", str(job.port), "--sizes", ",".join(str(s) for s in job.sizes), "--iters", str(job.iters),
            "--timeout", f"{job.timeout:g}"]


def node_script(job: FabricJob, kind: str, argv: Sequence[str]) -> str:
    """What each node runs for one step: its probe's container, its output and exit code as ``gpurig-fabric`` lines."""
    q = shlex.quote
    python, *args = argv
    if kind == "rank":
        own = '--rank "$SLURM_NODEID" --world "$SLURM_NNODES" --master-addr "$MASTER_ADDR" ${iface:+--interface "$iface"}'
    else:  # the route toward the rendezvous' address as this node resolves the name
        own = '${to:+--to "$to"}'
    # the facts probe is stdlib work of seconds: a container that hangs is given up (its container goes with the job, by the Epilog);
    # the ranks have their own watchdog, and the job its time limit
    bound = f"timeout -k 5 {job.facts_timeout_s:g} " if kind == "facts" else ""
    cases = "".join(f"    {q(n.node)}) iface={q(n.interface)} ;;\n" for n in job.nodes if n.interface)
    return "\n".join([
        "set -u",
        f"log={FOLDER}/fabric-$SLURM_JOB_ID.out",
        'mkdir -p "${log%/*}" || exit 1',
        "if docker info >/dev/null 2>&1; then d=docker; else d='sudo -n docker'; fi",
        'iface=""',
        *([f'case "$SLURMD_NODENAME" in\n{cases}esac'] if cases else []),
        "to=$(getent ahostsv4 \"$MASTER_ADDR\" | awk 'NR == 1 {print $1}')",
        'gpus=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}} devices=""',
        'if [ -n "$gpus" ]; then',
        '    if $d info 2>/dev/null | grep -q "Runtimes:.*nvidia"; then devices="--gpus device=$gpus"',
        '    else for i in $(echo "$gpus" | tr , " "); do devices="$devices --device /dev/nvidia$i"; done',
        '        for f in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do [ -e "$f" ] && devices="$devices --device $f"; done; fi',
        "fi",
        f'if ! $d image inspect {q(job.image)} >/dev/null 2>&1; then out="image "{q(job.image)}" is not on the Docker of $SLURMD_NODENAME: '
        'gpurig deploy puts it there" code=125; else',
        f'out=$({bound}$d run --rm --name "gpurig-fabric-$SLURM_JOB_ID-{kind}-$SLURM_NODEID" --label "{JOB_LABEL}=$SLURM_JOB_ID" '
        f"--label {q(f'{FABRIC_LABEL}={job.run_id}')} --network host --shm-size {SHM} $devices --entrypoint {q(python)} "
        f"{q(job.image)} {' '.join(q(a) for a in args)} {own} 2>&1)",
        "code=$?; fi",
        "{",
        *([f'echo {MARK} node "$SLURM_NODEID" "$SLURMD_NODENAME"', f'echo {MARK} to "$SLURM_NODEID" "$to"'] if kind == steps(job)[0] else []),
        f'printf "%s\\n" "$out" | sed "s/^/{MARK} {kind} $SLURM_NODEID /"',
        f'echo {MARK} exit-{kind} "$SLURM_NODEID" "$code"',
        '} >>"$log"',
    ])


def steps(job: FabricJob) -> tuple[str, ...]:
    return ("facts", "rank") if job.facts else ("rank",)


# ---- the log read back ----------------------------------------------------------------------------


@dataclass
class NodeOutput:
    """What one node's tasks printed: each step's lines and exit code, and the rendezvous' address as it resolved it."""

    lines: dict[str, list[str]] = field(default_factory=lambda: {"facts": [], "rank": []})
    codes: dict[str, int] = field(default_factory=dict)
    to: str = ""


@dataclass(frozen=True)
class JobLog:
    names: Mapping[int, str]  # node id -> Slurm's NodeName, as each node said its own: id 0 is the rendezvous'
    outputs: Mapping[int, NodeOutput]
    other: tuple[str, ...] = ()  # lines that are no node's probe output (srun's words, a node whose output could not be read)

    def of(self, nodes: Sequence[FabricNode]) -> list[tuple[FabricNode, NodeOutput]]:
        """Every node of the job with its output, in the allocation's order; a node that left none (empty) after the others."""
        ids = {name: i for i, name in self.names.items()}
        ordered = sorted(nodes, key=lambda n: ids.get(n.node, len(ids) + nodes.index(n)))
        return [(n, self.outputs.get(ids[n.node], NodeOutput()) if n.node in ids else NodeOutput()) for n in ordered]


def parse_log(text: str) -> JobLog:
    """The nodes' files together: each node's id and name, probe lines, exit codes and resolved rendezvous address."""
    names: dict[int, str] = {}
    outputs: dict[int, NodeOutput] = {}
    other = []
    for line in text.splitlines():
        found = _LINE.match(line)
        if not found:
            if line.strip():
                other.append(line.strip())
            continue
        kind, ident, rest = found.groups()
        out = outputs.setdefault(int(ident), NodeOutput())
        if kind == "node":
            names[int(ident)] = rest.strip()
        elif kind == "to":
            out.to = rest.strip()
        elif kind.startswith("exit-"):
            out.codes[kind[5:]] = int(rest) if rest.strip().isdecimal() else -1
        else:
            out.lines[kind].append(rest)
    return JobLog(names, outputs, tuple(other))


def rank_documents(log: JobLog, nodes: Sequence[FabricNode]) -> dict[str, dict]:
    """Each node's rank document, by inventory name in rank order; a stand-in with one fail record (its container's last words, or
    that it left nothing) where it gave none."""
    from gpurig.verify.fabric import document

    docs = {}
    for node, out in log.of(nodes):
        doc = document("\n".join(out.lines["rank"]), "fabric")
        if doc is None:
            said = next((x for x in reversed(out.lines["rank"]) if x.strip()), "")
            why = said or (f"exit {out.codes['rank']}" if "rank" in out.codes else "its task left no output")
            doc = {"probe": "fabric", "sizes": [], "records": [{
                "id": "fabric.rank", "status": "fail", "detail": f"its rank gave no result: {why}",
                "fix": "run checks/fabric_allreduce.py --text in the image on that node to see why"}]}
        docs[node.host] = doc
    return docs


def fact_documents(log: JobLog, nodes: Sequence[FabricNode]) -> dict[str, dict]:
    """Each node's fabric facts, by inventory name, where its facts step gave them."""
    from gpurig.verify.fabric import document

    found = {}
    for node, out in log.of(nodes):
        doc = document("\n".join(out.lines["facts"]), "fabric_facts")
        if doc is not None:
            found[node.host] = doc
    return found


def master_address(log: JobLog) -> str:
    """The rendezvous' address as the other nodes resolved the first node's name (what its route and records are about); the name
    where none resolved it."""
    resolved = [out.to for i, out in sorted(log.outputs.items()) if i != 0 and out.to]
    return resolved[0] if resolved else log.names.get(0, "")
