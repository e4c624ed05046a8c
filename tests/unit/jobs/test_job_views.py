"""A job as `gpurig jobs` says it, the exit status CI gets, finding a job by a prefix, and its GPU use from the sampler's records.

The GPU use replays the monitor's run fixtures (tests/fixtures/monitor/runs,
hand-made in the sampler's exact record format: no GPU was available), as
the host's agent hands them back for a job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpurig.errors import ConfigError
from gpurig.jobs.summary import gpu_use
from gpurig.jobs.views import check_job_id, job_view, pick

RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "monitor" / "runs"


def doc(**over) -> dict:
    return {"id": "3fa2c1d9", "name": "train", "state": "running", "argv": ["python", "train.py"], "gpus": {"count": 1},
            "devices": ["0"], "started_at": 1760000000.0, **over}


def test_states_read_as_a_person_says_them():
    assert job_view("h", doc(state="pending", reason="waiting for GPU 0 (held by job ab12)", queue_position=2, devices=[])).state_text == \
        "pending (2nd in the queue: waiting for GPU 0 (held by job ab12))"
    assert job_view("h", doc(state="failed", reason="host rebooted")).state_text == "failed (host rebooted)"
    assert job_view("h", doc(state="succeeded", reason="")).state_text == "succeeded"
    assert job_view("h", doc(state="cancelled", reason="cancelled")).state_text == "cancelled"
    assert job_view("h", doc(devices=[])).gpu_text == "1" and job_view("h", doc()).gpu_text == "0"


@pytest.mark.parametrize("state, code, status", [("succeeded", 0, 0), ("failed", 3, 3), ("failed", 137, 137), ("failed", None, 1),
                                                 ("cancelled", 143, 143), ("failed", 0, 1)])
def test_the_exit_status_is_the_scripts_128_plus_a_signal_or_1(state, code, status):
    assert job_view("h", doc(state=state, exit_code=code)).exit_status == status


def test_a_job_is_found_by_a_unique_prefix_and_nothing_else():
    views = [job_view("a", doc(id="3fa2c1d9")), job_view("b", doc(id="3fb00000")), job_view("b", doc(id="77777777"))]
    assert pick(views, "3fa", 2).host == "a" and pick(views, "77777777", 2).id == "77777777"
    with pytest.raises(ConfigError, match="several jobs: 3fa2c1d9 .a., 3fb00000 .b."):
        pick(views, "3f", 2)
    with pytest.raises(ConfigError, match="no job 123 on the 2 hosts searched"):
        pick(views, "123", 2)
    for bad in ("ab", "-rf", "$(id)", "a b", "X" * 70, "1\n2"):
        with pytest.raises(ConfigError):
            check_job_id(bad)
    for empty in ("", "  "):
        with pytest.raises(ConfigError, match="the job id is empty"):
            check_job_id(empty)


def test_jobs_with_an_empty_job_id_is_refused_not_every_job_listed(tmp_path):
    """``jobs --job ""`` (a script's unset variable) listed every job on every host as if no --job were given."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    h1: {ansible_host: 192.0.2.1}\n")
    proc = subprocess.run([sys.executable, "-c", "import sys; from gpurig.cli import main; main(sys.argv)", "jobs", "-i", str(inventory),
                           "--job", ""], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0 and "the job id is empty" in proc.stderr and "192.0.2.1" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def records(case: str) -> list[dict]:
    return [json.loads(line) for line in (RUNS / case / "samples.jsonl").read_text().splitlines()]


def test_a_jobs_gpu_use_is_its_own_gpus_over_its_own_run_with_the_monitors_diagnosis():
    run = records("input_bound")
    samples = [r for r in run if r["type"] == "sample"]
    job = job_view("gpu-input-bound", doc(started_at=samples[0]["t"], ended_at=samples[-1]["t"],
                                          attempts=[{"started_at": samples[0]["t"], "ended_at": samples[-1]["t"]}]))
    use = gpu_use(job, run)
    assert use.samples == len(samples) and use.util_mean is not None and use.util_mean < 30
    assert [f.rule for f in use.findings] == ["input_bound"] and "GPU utilisation" in use.line()
    outside = job_view("gpu-input-bound", doc(attempts=[{"started_at": 1, "ended_at": 2}]))
    assert "no GPU samples" in gpu_use(outside, run).line()  # samples from before the job are not its own
    other_gpu = job_view("gpu-input-bound", doc(devices=["7"], attempts=[{"started_at": samples[0]["t"], "ended_at": samples[-1]["t"]}]))
    assert gpu_use(other_gpu, run).util_mean is None
    assert gpu_use(job_view("h", doc(devices=[])), run).note == "no GPU was given to the job, so none was sampled"


def test_fetch_puts_artifacts_where_run_wait_does_when_run_from_inside_the_jobs_workdir(tmp_path):
    from gpurig.jobs.artifacts import default_into

    work = tmp_path / "proj"
    (work / "src").mkdir(parents=True)
    assert default_into("d23e", str(work), "laptop", cwd=work / "src", here="laptop") == work / "gpurig-runs" / "d23e"
    assert default_into("d23e", str(work), "laptop", cwd=work, here="laptop") == work / "gpurig-runs" / "d23e"
    # elsewhere, another machine's job, or a record naming no folder: the current directory, as before
    elsewhere = tmp_path / "other"
    assert default_into("d23e", str(work), "laptop", cwd=elsewhere, here="laptop") == elsewhere / "gpurig-runs" / "d23e"
    assert default_into("d23e", str(work), "ci-runner", cwd=work, here="laptop") == work / "gpurig-runs" / "d23e"
    assert default_into("d23e", "", "laptop", cwd=elsewhere, here="laptop") == elsewhere / "gpurig-runs" / "d23e"
    # the record is the host's word: a folder that is neither the current one nor above it is never written on it
    assert default_into("d23e", "/etc", "laptop", cwd=work, here="laptop") == work / "gpurig-runs" / "d23e"


def test_a_job_says_who_submitted_it_from_the_agent_meta_or_slurm():
    from gpurig.jobs.views import job_view

    assert job_view("h", {"id": "abc", "state": "running", "user": "alice"}).user == "alice"
    assert job_view("c", {"id": "42", "state": "running", "mode": "slurm", "slurm": {"user": "bob"}}).user == "bob"
    assert job_view("h", {"id": "abc", "state": "running", "user": 7}).user == ""  # not text: no one
