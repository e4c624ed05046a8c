"""gpurig.image.build's pure parts: the build command line, progress parsing, reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpurig.connect.engineinfo import image_info
from gpurig.errors import DockerError
from gpurig.image import build as b
from gpurig.image.dockercli import DockerClient
from gpurig.image.imageprobe import parse_freeze
from gpurig.image.render import render
from gpurig.image.spec import load_spec

REPO = Path(__file__).resolve().parents[2]

# Recorded from Debian's docker 20.10 client (BuildKit built in), --progress=plain.
PLAIN = """\
#1 [internal] load build definition from Dockerfile
#1 DONE 0.0s
#4 [stage-0 1/9] FROM docker.io/library/debian:bookworm-slim
#4 DONE 0.0s
#5 [stage-0 2/9] RUN --mount=type=cache,target=/var/cache/apt,sharing=locked     apt-get update
#5 CACHED
#9 [stage-0 5/9] RUN --mount=type=cache,target=/root/.cache/pip     pip install torch==2.13.0+cpu
#9 1.234 Collecting torch==2.13.0+cpu
#9 DONE 21.6s
#12 [stage-0 8/9] COPY checks /opt/gpurig/checks
#12 CACHED
"""

FAILED = """\
#5 [stage-0 2/9] RUN apt-get install -y gpurig-no-such-package
#5 2.101 E: Unable to locate package gpurig-no-such-package
#5 ERROR: executor failed running [/bin/bash -o pipefail -c apt-get install -y gpurig-no-such-package]: exit code: 100
------
 > [stage-0 2/9] RUN apt-get install -y gpurig-no-such-package:
------
executor failed running [/bin/bash -o pipefail -c apt-get install -y gpurig-no-such-package]: exit code: 100
"""


@pytest.fixture
def context(tmp_path):
    spec = load_spec(REPO / "images" / "pytorch.yaml")
    return render(spec, spec.default, "slim", REPO, tmp_path / "contexts")


def test_build_command_is_an_argv_with_tags_secret_and_labels(context, tmp_path):
    client = DockerClient("/usr/bin/docker", "20.10.24", False)
    ca = tmp_path / "ca bundle.pem"
    argv = b.build_argv(context, tmp_path / "iid", ca, {"io.gpurig.test": "x y"})
    assert argv[:2] == ["build", "--progress=plain"]
    tags = [argv[i + 1] for i, word in enumerate(argv) if word == "--tag"]
    assert tags == [context.image_ref, *context.aliases]
    assert ["--secret", f"id=ca,src={ca}"] == argv[argv.index("--secret"): argv.index("--secret") + 2]
    assert "io.gpurig.test=x y" in argv and argv[-1] == str(context.path)
    assert "--secret" not in b.build_argv(context, tmp_path / "iid", None)
    assert client.env()["DOCKER_BUILDKIT"] == "1"


def test_progress_counts_cached_and_run_steps():
    parser = b.ProgressParser()
    for line in PLAIN.splitlines():
        parser.feed(line)
    # FROM runs nothing: not in the total, not cached, not run (a real build's total = cached + ran)
    assert parser.total == 8 and parser.cached == 2 and parser.ran == 1
    assert parser.steps["9"].seconds == 21.6 and parser.steps["9"].lines == ["Collecting torch==2.13.0+cpu"]
    assert parser.failed_step() is None


def test_step_numbers_padded_for_ten_steps_or_more_are_read():
    parser = b.ProgressParser()
    for line in ("#4 [stage-0  1/13] FROM docker.io/library/debian:bookworm-slim", "#4 CACHED",
                 "#9 [stage-0  5/13] RUN pip install torch", "#9 DONE 83.6s"):
        parser.feed(line)
    assert parser.total == 12 and parser.cached == 0 and parser.ran == 1


def test_a_failing_step_becomes_one_line_with_step_exit_code_and_cause(context, tmp_path):
    parser = b.ProgressParser()
    for line in FAILED.splitlines():
        parser.feed(line)
    err = b._build_failure(context, parser, 1, tmp_path / "build.log")
    assert "failed at step 2/9" in err.problem and "exit code 100" in err.problem
    assert "Unable to locate package gpurig-no-such-package" in err.problem
    assert "\n" not in str(err) and str(tmp_path / "build.log") in err.fix


def test_a_build_that_ran_out_of_disk_says_so_and_how_to_free_space(context, tmp_path):
    """pip's last line is its progress bar and dpkg's is an exit code: the disk is named wherever its words appear."""
    parser = b.ProgressParser()
    for line in ("#7 [stage-0 5/9] RUN pip install torch",
                 "#7 31.2 ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device",
                 "#7 31.3    ━━━━━━━━━━━━━━━━━━━━━━━━━━╸ 298.6/423.1 MB 76.7 MB/s eta 0:00:02",
                 "#7 ERROR: process \"/bin/sh -c pip install torch\" did not complete successfully: exit code: 1"):
        parser.feed(line)
    err = b._build_failure(context, parser, 1, tmp_path / "build.log")
    assert err.problem == f"build of {context.image_ref} failed at step 5/9 `RUN pip install torch`: the disk ran out of space (No space left on device)"
    assert "docker builder prune" in err.fix and "docker system df" in err.fix


def test_credentials_in_urls_are_redacted():
    assert b.redact("pip --index-url https://bob:s3cret@pypi.example.com/simple x") == (
        "pip --index-url https://***@pypi.example.com/simple x"
    )
    assert b.redact("http://deb.debian.org/debian") == "http://deb.debian.org/debian"


def test_credentials_in_build_urls_are_refused_before_they_reach_a_layer():
    from gpurig.image.spec import BuildSettings

    b.refuse_credentials(BuildSettings(pip_index="https://pypi.example.com/simple"))
    with pytest.raises(DockerError) as err:
        b.refuse_credentials(BuildSettings(pip_extra_index=("https://bob:s3cret@pypi.example.com/simple",)))
    assert "s3cret" not in str(err.value) and "***@pypi.example.com" in str(err.value)


def test_ca_bundle_auto_follows_the_hosts_pip(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("x")
    assert b.resolve_ca_bundle("auto", {"PIP_CERT": str(bundle)}, lambda: "") == bundle
    assert b.resolve_ca_bundle("auto", {}, lambda: str(bundle)) == bundle
    assert b.resolve_ca_bundle("auto", {"PIP_CERT": str(tmp_path / "gone")}, lambda: "") is None
    assert b.resolve_ca_bundle("none", {"PIP_CERT": str(bundle)}, lambda: "") is None
    assert b.resolve_ca_bundle(str(bundle), {}, lambda: "") == bundle
    with pytest.raises(DockerError, match="not a file"):
        b.resolve_ca_bundle(str(tmp_path / "gone"), {}, lambda: "")


def test_freeze_output_splits_into_pip_and_dpkg():
    freeze, dpkg = parse_freeze("torch==2.13.0+cpu\nsympy==1.14.0\n--- dpkg\npython3=3.11.2-1+b1\ntini=0.19.0-1\n")
    assert freeze == ["torch==2.13.0+cpu", "sympy==1.14.0"]
    assert dpkg == {"python3": "3.11.2-1+b1", "tini": "0.19.0-1"}


def test_report_shape_and_atomic_write(context, tmp_path):
    client = DockerClient("/usr/bin/docker", "20.10.24", False)
    parser = b.ProgressParser()
    for line in PLAIN.splitlines():
        parser.feed(line)
    image = image_info({"Id": "sha256:" + "a" * 64, "Size": 123, "RootFS": {"Layers": ["l1", "l2"]}})  # the engine's inspect
    base = {"ref": "debian:bookworm-slim", "source": "bootstrapped", "id": "sha256:b", "digests": [], "bootstrap": "x"}
    report = b.make_report(context, client, image, base, parser, 12.34, ["torch==2.14.1"], {"tini": "1"}, Path("/ca"))
    assert report["image"] == context.image_ref and report["image_id"] == image.id
    assert report["size_bytes"] == 123 and report["layers"] == 2 and report["duration_s"] == 12.3
    assert report["steps"] == {"total": 8, "cached": 2, "ran": 1}
    assert report["torch_resolved"] == "torch==2.14.1" and report["digest"] is None
    assert report["settings"]["ca_bundle"] == "passed as build secret" and "/ca" not in json.dumps(report["settings"])
    path = tmp_path / "reports" / "r.json"
    b.write_json_atomic(path, report)
    assert json.loads(path.read_text()) == report
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]
    pushed = b.record_push(path, report, ["r/x:1"], "sha256:" + "c" * 64)
    assert json.loads(path.read_text())["digest"] == pushed["digest"] == "sha256:" + "c" * 64


def test_a_silent_step_is_owed_a_still_running_line_every_interval_until_it_ends():
    # a pip step waited 702 s on an index without a word: the heartbeat says so however quiet the step is
    from gpurig.image.pipeline import Heartbeat

    now = [100.0]
    beat = Heartbeat(30.0, clock=lambda: now[0])
    parser = b.ProgressParser()
    _, base = parser.feed("#2 [1/3] FROM docker.io/library/debian:bookworm-slim")
    _, pip = parser.feed("#5 [2/3] RUN pip install torch==2.13.0+cpu")
    beat.feed("start", base)
    beat.feed("start", pip)
    now[0] += 29
    assert beat.due() == []
    now[0] += 1
    assert [(s.text, secs) for s, secs in beat.due()] == [("RUN pip install torch==2.13.0+cpu", 30.0)]
    assert beat.due() == []  # said once per interval, not at every tick
    now[0] += 31
    assert [secs for _, secs in beat.due()] == [61.0]
    beat.feed("done", parser.feed("#5 DONE 61.0s")[1])
    now[0] += 60
    assert beat.due() == []  # a finished step, and FROM (which runs nothing), are never owed a line
