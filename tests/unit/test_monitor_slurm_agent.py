"""Slurm job labels, the agent's side: checks/gpu_sampler.py names in each GPU record the jobs holding that GPU.

The node's mapping is dcgm-exporter's HPC job mapping folder (a file per GPU
index, or <index>.<GPU instance> for a MIG device, one job id a line) plus a
file per job with its user. tests/fixtures/monitor/slurm and slurm-mig are
hand-made in that format (their README says so); the hostile ones are made
here in tmp_path. The agent must never crash on them, never block on them and
never carry into a record what is not a job id or a user name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nvml_replay import AGENT, FIXTURES, FakeNvml, agent_records, sampler
from test_monitor_agent import fake_smi, run_agent

SLURM = FIXTURES / "slurm"
SLURM_MIG = FIXTURES / "slurm-mig"
NON_MIG = json.loads((FIXTURES / "nvml-h100-a100.json").read_text())
MIG = json.loads((FIXTURES / "nvml-mig.json").read_text())
SMI_CSV = FIXTURES / "nvidia-smi-query.csv"


def slurm_env(root: Path) -> dict:
    return {"GPURIG_SLURM_GPUS_DIR": str(root / "slurm-gpus"), "GPURIG_SLURM_JOBS_DIR": str(root / "slurm-jobs")}


def smi_env(tmp_path: Path) -> dict:
    return fake_smi(tmp_path, f'cat {SMI_CSV}\ncase "$*" in *-lms*) while sleep 0.05; do cat {SMI_CSV} || exit; done;; esac\n')


def jobs_of(gpus: list[dict]) -> list[tuple]:
    return [(g["index"], g.get("mig"), g.get("hpc_jobs"), g.get("hpc_users")) for g in gpus]


def with_jobs(gpus: list[dict], root: Path) -> list[dict]:
    sampler.add_slurm_jobs(gpus, str(root / "slurm-gpus"), str(root / "slurm-jobs"))
    return gpus


def test_the_agent_names_the_jobs_and_users_holding_each_gpu(tmp_path):
    records = run_agent("--interval", "0.1", "--count", "2", "--gpu-source", "nvidia-smi", env={**smi_env(tmp_path), **slurm_env(SLURM)})
    gpus = records[-2]["gpus"]
    # GPU 1 is shared by two jobs; job 44 has no file (its user is not known): its user is null, not guessed.
    assert jobs_of(gpus) == [(0, None, ["42"], ["alice"]), (1, None, ["43", "44"], ["bob", None]), (2, None, None, None), (3, None, None, None)]
    assert not {"hpc_jobs", "hpc_users"} & (set(gpus[2]) | set(gpus[3]))  # no job: no key at all


def test_without_the_mapping_the_agents_gpu_records_are_byte_identical(tmp_path):
    env = smi_env(tmp_path)

    def gpu_part(extra: dict) -> list[str]:
        proc = subprocess.run([sys.executable, str(AGENT), "--interval", "0.1", "--count", "2", "--gpu-source", "nvidia-smi"],
                              capture_output=True, text=True, timeout=60, env={**os.environ, **env, **extra})  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return [line.split('"gpus":', 1)[1] for line in proc.stdout.splitlines() if '"type":"sample"' in line]

    missing = gpu_part(slurm_env(tmp_path / "no-such-folder"))
    assert missing == gpu_part({}) == gpu_part(slurm_env(tmp_path))  # the default path, a missing folder, an empty parent
    assert "hpc_" not in "".join(missing)


def test_main_adds_the_jobs_to_what_nvml_gives_and_changes_nothing_else(monkeypatch, capsys):
    def main_gpus(env: dict) -> list[list[dict]]:
        records: list[dict] = []
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(sampler, "open_gpu_source", lambda interval, want: (sampler.NvmlSource(FakeNvml(NON_MIG)), None))
        monkeypatch.setattr(sampler, "emit", lambda record, out=None: records.append(json.loads(json.dumps(record))))
        assert sampler.main(["--interval", "0.01", "--count", "3"]) == 0
        return [r["gpus"] for r in records if r["type"] == "sample"]

    before = [r["gpus"] for r in agent_records(FakeNvml(NON_MIG), "gpu-nvml") if r["type"] == "sample"]
    assert main_gpus(slurm_env(Path("/nonexistent"))) == before
    labelled = main_gpus(slurm_env(SLURM))
    assert [[{k: v for k, v in g.items() if not k.startswith("hpc_")} for g in gpus] for gpus in labelled] == before
    assert [jobs_of(gpus) for gpus in labelled] == [[(0, None, ["42"], ["alice"]), (1, None, ["43", "44"], ["bob", None])]] * 3


def test_a_mig_device_is_found_by_its_gpu_instance_as_dcgm_exporter_names_it():
    source = sampler.NvmlSource(FakeNvml(MIG))
    gpus = with_jobs(source.sample(), SLURM_MIG)
    source.close()
    # 0.3 is GPU 0's GPU instance 3: both its compute instances (MIG devices 0:1 and 0:2) are that job's.
    held = {(i, mig): (jobs, users) for i, mig, jobs, users in jobs_of(gpus) if jobs}
    assert held == {(0, 1): (["46"], ["erin"]), (0, 2): (["46"], ["erin"]), (0, 3): (["45_3"], ["dave"])}


def test_a_host_without_the_folder_pays_one_stat_and_a_node_one_read_per_gpu_and_job(monkeypatch, tmp_path):
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(sampler.os, "open", lambda path, *a, **kw: (opened.append(os.path.basename(path)), real_open(path, *a, **kw))[1])
    gpus = [{"index": i, "util_gpu": 1} for i in range(4)]
    with_jobs(gpus, tmp_path / "absent")
    assert opened == []
    with_jobs(gpus, SLURM)
    assert sorted(opened) == ["0", "1", "2", "3", "42", "43", "44"]  # each GPU's file and each job's, once
    with_jobs([], SLURM)  # no GPU (no driver): not even the folder is looked at
    assert len(opened) == 7


@pytest.mark.parametrize(
    "content, jobs",
    [
        (b"", None),
        (b"\n \n\t\n", None),
        (b"42", ["42"]),  # dcgm-exporter reads a last line without its newline too
        (b"42\r\n43\r\n", ["42", "43"]),
        (b"  42  \n42\n", ["42"]),  # once, though written twice
        (b"1234_5\n1234.0\n1234_5.1\n", ["1234_5", "1234.0", "1234_5.1"]),  # an array task, a step
        (b'../../etc/passwd\n-1\n42abc\n4 2\n\xd9\xa4\xd9\xa2\n\x00\x01\nhpc_job="x"\n1_\n.5\n7\n', ["7"]),
        (b"1" * 21 + b"\n", None),  # more digits than any job id
        (b"\xff\xfe\x00garbage", None),
        ("".join(f"{n}\n" for n in range(100, 120)).encode(), [str(n) for n in range(100, 116)]),  # at most 16 per GPU
        (b"42\n" + b"9" * 10_000_000, ["42"]),  # huge: only its first 4 KiB are read, and their cut last line is dropped
        (b"4" * 10_000_000, None),
    ],
)
def test_a_gpu_file_gives_only_what_are_job_ids(tmp_path, content, jobs):
    (tmp_path / "slurm-gpus").mkdir()
    (tmp_path / "slurm-gpus" / "0").write_bytes(content)
    (gpu,) = with_jobs([{"index": 0}], tmp_path)
    assert gpu.get("hpc_jobs") == jobs
    assert gpu.get("hpc_users") == (None if jobs is None else [None] * len(jobs))  # no slurm-jobs folder: users unknown


@pytest.mark.parametrize(
    "content, user",
    [
        (b"user=alice\nuid=1001\n", "alice"),
        (b"uid=1001\n", "1001"),  # no name: the uid, as a process whose uid has no name is shown
        (b"  user = alice  \r\n", "alice"),
        (b"user=al ice\nuid=1001\n", "1001"),
        (b"user=-rf\n", None),
        (b"user=" + b"a" * 65 + b"\n", None),
        (b"user=\xc3\xa9mile\n", None),
        (b"user=1234\n", None),  # all digits is a uid, not a name
        (b"user=root\nuser=mallory\n", "root"),  # the first counts
        (b"USER=alice\nname=alice\nalice\n", None),
        (b"uid=4294967296\n", None),
        (b"uid=-1\n", None),
        (b"user=alice" * 1000, None),  # one line longer than what is read
        (b"\x00\xff" * 100, None),
    ],
)
def test_a_job_file_gives_only_a_user_name_or_uid(tmp_path, content, user):
    (tmp_path / "slurm-gpus").mkdir()
    (tmp_path / "slurm-jobs").mkdir()
    (tmp_path / "slurm-gpus" / "0").write_text("42\n")
    (tmp_path / "slurm-jobs" / "42").write_bytes(content)
    (gpu,) = with_jobs([{"index": 0}], tmp_path)
    assert gpu["hpc_jobs"] == ["42"] and gpu["hpc_users"] == [user]


def test_what_is_not_a_regular_file_is_not_read_and_nothing_blocks(tmp_path):
    gpus_dir, jobs_dir = tmp_path / "slurm-gpus", tmp_path / "slurm-jobs"
    gpus_dir.mkdir()
    jobs_dir.mkdir()
    (tmp_path / "elsewhere").write_text("42\n")
    os.mkfifo(gpus_dir / "0")  # no writer: an open without O_NONBLOCK would wait for ever
    (gpus_dir / "1").symlink_to(tmp_path / "elsewhere")  # links are not followed
    (gpus_dir / "2").symlink_to("/dev/zero")
    (gpus_dir / "3").mkdir()
    (gpus_dir / "4").write_text("42\n")
    os.mkfifo(jobs_dir / "42")
    started = time.monotonic()
    gpus = with_jobs([{"index": i} for i in range(5)], tmp_path)
    assert time.monotonic() - started < 5
    assert jobs_of(gpus) == [(0, None, None, None), (1, None, None, None), (2, None, None, None), (3, None, None, None), (4, None, ["42"], [None])]


def test_a_mapping_folder_that_is_a_file_or_missing_is_no_mapping(tmp_path):
    (tmp_path / "slurm-gpus").write_text("42\n")
    assert with_jobs([{"index": 0}], tmp_path) == [{"index": 0}]
    assert with_jobs([{"index": 0}], tmp_path / "missing") == [{"index": 0}]


def test_the_mapping_is_read_again_at_each_sample_as_jobs_start_and_end(tmp_path):
    gpus_dir = tmp_path / "slurm-gpus"
    gpus_dir.mkdir()
    assert jobs_of(with_jobs([{"index": 0}], tmp_path)) == [(0, None, None, None)]
    (gpus_dir / ".0.tmp").write_text("42\n")  # the Prolog: tmp + rename
    (gpus_dir / ".0.tmp").rename(gpus_dir / "0")
    assert jobs_of(with_jobs([{"index": 0}], tmp_path)) == [(0, None, ["42"], [None])]
    (gpus_dir / "0").unlink()  # the Epilog
    assert jobs_of(with_jobs([{"index": 0}], tmp_path)) == [(0, None, None, None)]
