"""verify --level fabric --scheduler slurm, without a cluster: the job's script (run by a real sh against a stand-in docker, so
the quoting is proven, not read), its log read back into a FabricRun, which nodes it gets, and the pending/overrun/Ctrl-C decisions.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import zlib
from types import SimpleNamespace

import pytest

from gpurig.errors import ConfigError, Finished
from gpurig.flows import fabricslurm
from gpurig.jobs.views import job_view
from gpurig.slurm import fabricjob, fabricqueue
from gpurig.slurm.fabricjob import FabricJob, FabricNode
from gpurig.verify.fabric import FabricRun
from gpurig.verify.fabric_checks import fabric_records
from tests.unit.verify.test_fabric_rules import facts, rank0

HOSTILE = "eth0;touch /tmp/x $(id) 'q'"
NODES = (FabricNode("a100-01", "n1", "eth0"), FabricNode("a100-02", "n2", HOSTILE))


def job(**kw) -> FabricJob:
    base = {"nodes": NODES, "image": "reg.example.com/ml/pytorch:2.9.1-cu128-slim", "port": 29500, "timeout": 30.0,
            "sizes": (4096, 256 << 20), "run_id": "abcd1234", "partition": "gpu", "gpus_per_node": 1}
    return FabricJob(**{**base, **kw})


# ---- the script ------------------------------------------------------------------------------------


def test_the_batch_script_asks_slurm_for_exactly_the_nodes_one_task_each_and_a_time_limit_covering_every_phase():
    script = fabricjob.batch_script(job(), "print('facts')", "print('rank')")
    head = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert head == ["#SBATCH --job-name=gpurig-fabric", "#SBATCH --output=/dev/null", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                    "#SBATCH --nodelist=n1,n2", f"#SBATCH --time={job().minutes}", "#SBATCH --partition=gpu", "#SBATCH --gres=gpu:1"]
    assert job().minutes * 60 >= 120 + 30 * (3 + 2) + 60  # facts, the rendezvous, warm-up, latency, each size, a start
    assert script.count("srun ") == 2 and script.index("fabric_facts") < script.index("fabric_allreduce")
    pair = fabricjob.batch_script(job(facts=False, sizes=(256 << 20,)), "", "print('rank')")
    assert pair.count("srun ") == 1 and "fabric_facts" not in pair
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)  # the whole script parses


def run_node(tmp_path, kind: str, node: str, node_id: int, image_there: bool = True) -> list[list[str]]:
    """One node's step run by sh, with a stand-in docker that prints its argv as JSON: what the probe's container was given."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "docker").write_text("#!/usr/bin/env python3\nimport json, sys\n"
                                   f"if sys.argv[1] == 'image': sys.exit(0 if {image_there!r} else 1)\n"
                                   "if sys.argv[1] == 'info': print(' Runtimes: nvidia runc'); sys.exit(0)\n"
                                   "print(json.dumps(sys.argv[1:]))\n")
    (bindir / "docker").chmod(0o755)
    (bindir / "getent").write_text("#!/bin/sh\necho '10.0.0.1 STREAM n1'\n")
    (bindir / "getent").chmod(0o755)
    words = {"facts": ["python3", "-c", "FACTS", "--json"], "rank": ["python3", "-c", "RANK", *fabricjob.rank_args(job())]}
    script = fabricjob.node_script(job(), kind, words[kind])
    assert ("gpurig-fabric node" in script) == (kind == "facts")
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HOME": str(tmp_path), "SLURMD_NODENAME": node, "SLURM_NODEID": str(node_id), "SLURM_NNODES": "2",
           "SLURM_JOB_ID": "77", "MASTER_ADDR": "n1", "SLURM_STEP_GPUS": "1"}
    subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=True, cwd=tmp_path)
    assert not (tmp_path / "x").exists()
    written = tmp_path / ".cache" / "gpurig" / "fabric-77.out"  # the node's own file, read back over SSH (not srun's output)
    log = fabricjob.parse_log(written.read_text())
    written.unlink()
    if kind == "facts":  # the job's first step: each node says who it is and where the rendezvous resolves
        assert log.names == {node_id: node} and log.outputs[node_id].to == "10.0.0.1"
    lines = log.outputs[node_id].lines[kind]
    assert log.outputs[node_id].codes[kind] == (0 if image_there else 125)
    return [json.loads(x) for x in lines if x.startswith("[")] or [lines]


def test_each_nodes_rank_gets_its_rank_the_world_the_rendezvous_and_its_own_interface_word_for_word(tmp_path):
    [argv] = run_node(tmp_path, "rank", "n2", 1)
    assert argv[:2] == ["run", "--rm"] and "--network" in argv and argv[argv.index("--network") + 1] == "host"
    assert argv[argv.index("--name") + 1] == "gpurig-fabric-77-rank-1"
    assert "io.gpurig.slurm.job=77" in argv and "io.gpurig.fabric=abcd1234" in argv  # the Epilog removes a cancelled job's
    assert argv[argv.index("--entrypoint") + 1] == "python3" and argv[argv.index("--gpus") + 1] == "device=1"
    image = argv.index(job().image)
    assert argv[image + 1:] == ["-c", "RANK", "--json", "--master-port", "29500", "--sizes", f"4096,{256 << 20}", "--iters", "20",
                                "--timeout", "30", "--rank", "1", "--world", "2", "--master-addr", "n1", "--interface", HOSTILE]
    [argv] = run_node(tmp_path, "rank", "n1", 0)
    assert argv[-2:] == ["--interface", "eth0"]


def test_the_facts_step_routes_toward_the_rendezvous_as_the_node_resolves_it(tmp_path):
    [argv] = run_node(tmp_path, "facts", "n2", 1)
    assert argv[-5:] == ["-c", "FACTS", "--json", "--to", "10.0.0.1"]
    assert "timeout -k 5 120 $d run" in fabricjob.node_script(job(), "facts", ["python3"])  # a hung facts container is given up
    assert "timeout" not in fabricjob.node_script(job(), "rank", ["python3"])  # the rank's own watchdog bounds it


def test_an_image_missing_on_a_node_is_said_instead_of_a_pull(tmp_path):
    [lines] = run_node(tmp_path, "rank", "n1", 0, image_there=False)
    assert lines == [f"image {job().image} is not on the Docker of n1: gpurig deploy puts it there"]


def test_the_probes_travel_in_the_script_whole():
    script = fabricjob.batch_script(job(), "FACTS_SOURCE = 1", "RANK_SOURCE = 2")
    packed = re.findall(r"b64decode\(\W+([A-Za-z0-9+/=]{16,})", script)  # inside two layers of shell quoting
    assert {zlib.decompress(base64.b64decode(p)).decode() for p in packed} == {"FACTS_SOURCE = 1", "RANK_SOURCE = 2"}


# ---- the log read back ------------------------------------------------------------------------------


def log_text(rank_doc=None, second_rank: str | None = None) -> str:
    m = fabricjob.MARK
    lines = [f"{m} node 0 n1", f"{m} to 0 127.0.1.1", f"{m} node 1 n2", f"{m} to 1 10.0.0.1",
             f"{m} facts 0 {json.dumps(facts('n1'))}", f"{m} exit-facts 0 0", f"{m} facts 1 {json.dumps(facts('n2'))}", f"{m} exit-facts 1 0",
             "srun: error: n2: task 1: Exited with exit code 1",
             f"{m} rank 0 {json.dumps(rank_doc or rank0(world=2))}", f"{m} exit-rank 0 0",
             f"{m} rank 1 {second_rank if second_rank is not None else json.dumps({**rank0(world=2), 'rank': 1})}", f"{m} exit-rank 1 0"]
    return "\n".join(lines) + "\n"


def test_the_log_fills_the_fabric_run_in_the_allocations_order_for_the_same_records_as_over_ssh():
    log = fabricjob.parse_log(log_text())
    nodes = (FabricNode("a100-02", "n2"), FabricNode("a100-01", "n1"))
    assert log.names == {0: "n1", 1: "n2"} and log.other == ("srun: error: n2: task 1: Exited with exit code 1",)
    ranks = fabricjob.rank_documents(log, nodes)
    assert list(ranks) == ["a100-01", "a100-02"]  # rank order is Slurm's node ids, whatever order gpurig listed them in
    run = FabricRun(tuple(ranks), fabricjob.fact_documents(log, nodes), ranks, master=fabricjob.master_address(log))
    assert run.master == "10.0.0.1"  # as the other node resolved n1: rank 0's own 127.0.1.1 is no address for the others
    got = {r.id: r for r in fabric_records(run)}
    assert got["fabric.allreduce.256MB"].measured == 11.0 and got["fabric.busbw"].status == "pass"
    assert got["fabric.rendezvous"].status == "pass" and "fabric.checked" not in got


def test_a_node_whose_rank_printed_no_document_fails_with_its_last_words():
    log = fabricjob.parse_log(log_text(second_rank="docker: Error response from daemon: OCI runtime create failed"))
    docs = fabricjob.rank_documents(log, (FabricNode("n1", "n1"), FabricNode("n2", "n2")))
    [record] = docs["n2"]["records"]
    assert record["status"] == "fail" and record["detail"] == "its rank gave no result: docker: Error response from daemon: OCI runtime create failed"
    # a node whose output could not be read at all is still in the run, after the others, failing: never dropped
    silent = fabricjob.parse_log(f"{fabricjob.MARK} node 0 n1\n")
    docs = fabricjob.rank_documents(silent, (FabricNode("b", "n2"), FabricNode("a", "n1")))
    assert list(docs) == ["a", "b"] and docs["b"]["records"][0]["detail"] == "its rank gave no result: its task left no output"
    assert fabricjob.master_address(silent) == "n1"


# ---- which nodes ------------------------------------------------------------------------------------


SINFO = "n1|gpu*|idle|none\nn2|gpu*|drained|gpurig: host.xid: Xid 79\nn3|gpu*|mixed|none\nn4|cpu|idle|none\n"


def cluster():
    hosts = [SimpleNamespace(name=n) for n in ("n1", "n2", "n3", "n4")]
    return SimpleNamespace(nodes=hosts, partitions={"n1": ("gpu",), "n2": ("gpu",), "n3": ("gpu",), "n4": ("cpu",)})


def test_the_job_gets_the_partitions_nodes_slurm_gives_jobs_and_the_others_are_said_with_slurms_reason():
    c = cluster()
    got = fabricqueue.choose(SINFO, "n1|gpu:a100:2\nn3|gpu:4(S:0-1)\n", c, "gpu", c.nodes, {}, {"n1": "eth0"})
    assert got.nodes == (FabricNode("n1", "n1", "eth0"), FabricNode("n3", "n3", None))
    assert got.left_out == {"n2": "Slurm gives it no job: drained (gpurig: host.xid: Xid 79)"} and got.gpus_per_node == 1
    assert fabricqueue.choose(SINFO, "n1|(null)\nn3|gpu:1\n", c, "gpu", c.nodes, {}, {}).gpus_per_node == 0  # gloo on the CPUs


def test_a_left_out_node_warns_naming_it():
    record = fabricslurm.left_out_record({"n2": "Slurm gives it no job: drained (x)"}, ["n1", "n3"])
    assert record is not None and record.status == "warn" and "proven for n1, n3 only" in record.detail
    assert fabricslurm.left_out_record({}, ["n1"]) is None


# ---- pending, overrun, Ctrl-C -----------------------------------------------------------------------


def view(state: str, reason: str = "", batch: str = "") -> object:
    return job_view("ctl", {"id": "12", "state": state, "reason": reason, "batch_host": batch, "started_at": 1.0 if batch else None})


class FakeController:
    def __init__(self, views):
        self.views, self.ran = list(views), []
        self.conn = SimpleNamespace(run=self.run, name="ctl")

    def run(self, argv, **kw):
        self.ran.append(list(argv))
        return SimpleNamespace(ok=True, failed=False, stdout="12\n", stderr="")

    def find(self, job, explain=False):
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


def test_a_job_pending_past_its_bound_is_cancelled_and_said_with_slurms_reason_never_a_pass():
    ctl, clock, told = FakeController([view("pending", "Resources")]), Clock(), []
    got = fabricqueue.wait(ctl, "12", 5, 600, lambda s, r: told.append((s, r)), clock, clock.sleep)  # type: ignore[arg-type]
    assert isinstance(got, fabricqueue.Stuck) and got.detail.startswith("slurm job 12 stayed pending for 5 s (Resources) and was cancelled")
    assert ctl.ran == [["scancel", "12"]] and told == [("pending", "Resources")]
    assert fabricqueue.stuck_pending("12", 4.9, "Priority", 5) is None


def test_a_job_that_ran_is_followed_to_its_end_and_one_that_overruns_is_cancelled():
    ctl, clock = FakeController([view("pending", "Priority"), view("running", batch="n1"), view("succeeded", batch="n1")]), Clock()
    got = fabricqueue.wait(ctl, "12", 60, 600, lambda s, r: None, clock, clock.sleep)  # type: ignore[arg-type]
    assert not isinstance(got, fabricqueue.Stuck) and got.state == "succeeded" and ctl.ran == []
    ctl, clock = FakeController([view("running", batch="n1")]), Clock()
    got = fabricqueue.wait(ctl, "12", 60, 10, lambda s, r: None, clock, clock.sleep)  # type: ignore[arg-type]
    assert isinstance(got, fabricqueue.Stuck) and "ran past its 10 s" in got.detail and ctl.ran == [["scancel", "12"]]
    assert got.ran  # its nodes hold its output: read and removed all the same


def test_a_job_cancelled_before_it_ran_is_said_so():
    got = fabricqueue.stuck_ended(view("cancelled"))  # type: ignore[arg-type]
    assert got is not None and got.detail == "slurm job 12 never ran (cancelled)"


def test_ctrl_c_while_the_job_runs_cancels_it_and_says_so(monkeypatch):
    ctl = FakeController([view("running", batch="n1")])

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(fabricqueue, "wait", interrupted)
    cluster_ = SimpleNamespace(controller=SimpleNamespace(name="ctl"), nodes=[])
    with pytest.raises(Finished) as stopped:
        fabricslurm.one_job(ctl, None, cluster_, job(), "", "", 60)  # type: ignore[arg-type]
    assert stopped.value.code == 130 and stopped.value.message.endswith("cancelled slurm job 12 (scancel)")
    assert ctl.ran[0][0] == "sbatch" and ctl.ran[-1] == ["scancel", "12"]


@pytest.mark.parametrize(("args", "said"), [
    (("quick", "slurm", None, None), "--scheduler slurm verifies the fabric only"),
    (("fabric", "gpurig", "gpu", None), "--partition and --pending-timeout go with --scheduler slurm"),
    (("fabric", "slurm", "gpu;rm", None), "is not a partition name"),
    (("fabric", "slurm", None, "soon"), "--pending-timeout .soon. is not a number of seconds"),
])
def test_bad_flags_are_one_line_before_any_host_is_contacted(args, said):
    with pytest.raises(ConfigError, match=said.replace("(", r"\(")):
        fabricslurm.slurm_flags(*args)
    assert fabricslurm.slurm_flags("fabric", "slurm", None, "30") == 30.0
