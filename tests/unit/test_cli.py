"""The CLI as users meet it: `gpurig` and `invoke` in a project directory, exit codes and one-line errors."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def gpurig(project: Path, *args: str) -> subprocess.CompletedProcess:
    # the console script is `gpurig = gpurig.cli:main`; run that entry point as a user would
    code = "import sys; from gpurig.cli import main; main(sys.argv)"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=project, capture_output=True, text=True, timeout=120
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpurig: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_list_shows_the_tasks_with_their_help(project):
    proc = gpurig(project, "--list")
    assert proc.returncode == 0
    for name in ("render", "lint", "matrix"):
        assert name in proc.stdout
    help_text = gpurig(project, "render", "--help").stdout
    assert "--variant" in help_text and "slim | full | ssh | jupyter" in help_text


def test_invoke_reads_the_same_tasks_from_tasks_py():
    proc = subprocess.run([sys.executable, "-m", "invoke", "--list"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "render" in proc.stdout and "matrix" in proc.stdout


def test_render_all_then_lint_succeeds(project):
    rendered = gpurig(project, "render", "--all")
    assert rendered.returncode == 0, rendered.stderr
    assert "skipped 2.13.0-cpu-full" in rendered.stdout
    assert (project / "build-contexts/pytorch/2.14.1-cu130-slim/Dockerfile").is_file()
    linted = gpurig(project, "lint")
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert linted.stdout.count("ok ") == 11


def test_render_defaults_to_slim_of_the_default_entry(project):
    proc = gpurig(project, "render")
    assert proc.returncode == 0
    assert [p.name for p in (project / "build-contexts/pytorch").iterdir()] == ["2.14.1-cu130-slim"]


def test_matrix_shows_minimum_drivers(project):
    proc = gpurig(project, "matrix")
    assert proc.returncode == 0
    for fragment in ("2.14.1", "580.65.06", "2.9.1", "570.26", "cpu"):
        assert fragment in proc.stdout


def test_lint_fails_on_a_hadolint_error(project):
    gpurig(project, "render")
    dockerfile = project / "build-contexts/pytorch/2.14.1-cu130-slim/Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN cd /tmp && sudo apt-get install -y vim\n")
    proc = gpurig(project, "lint")
    assert proc.returncode != 0
    assert "DL3004" in proc.stdout  # sudo
    assert_one_line_error(proc, "hadolint found", "fix the templates")


def test_lint_before_render_says_what_to_do(project):
    assert_one_line_error(gpurig(project, "lint"), "no rendered Dockerfiles", "invoke render --all")


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["render", "--variant", "slimm"], ["unknown variant 'slimm'", "did you mean 'slim'"]),
        (["render", "--torch", "2.9.1", "--cuda", "11.8"], ["torch 2.9.1 has no wheel for CUDA 11.8", "12.6, 12.8, 13.0"]),
        (["render", "--all", "--variant", "ssh"], ["--all cannot be combined"]),
        (["render", "--variant", "full", "--cuda", "cpu"], ["variant full needs a CUDA build"]),
        (["render", "--spec", "missing.yaml"], ["missing.yaml not found"]),
    ],
)
def test_bad_flags_give_one_line_and_non_zero_exit(project, args, fragments):
    assert_one_line_error(gpurig(project, *args), *fragments)


@pytest.mark.parametrize(
    "content,fragments",
    [
        ("", ["is empty"]),
        ("name: [broken\n", ["malformed YAML"]),
        ('name: p\npython: "3.11"\nmatrx: []\n', ["unknown key 'matrx'", "did you mean 'matrix'"]),
        ('name: p\npython: "3.11"\nmatrix: [{torch: "2.9.1", cuda: "11.8"}]\n', ["CUDA 11.8", "12.6, 12.8, 13.0"]),
    ],
)
def test_bad_specs_give_one_line_and_nothing_rendered(project, content, fragments):
    (project / "images" / "pytorch.yaml").write_text(content)
    assert_one_line_error(gpurig(project, "render", "--all"), *fragments)
    assert not (project / "build-contexts").exists()


@pytest.mark.parametrize("task", ["matrix", "render", "build", "images"])
def test_outside_a_project_image_tasks_say_to_init_one_first(tmp_path, task):
    # The README once said tasks work outside a project; matrix said only "no images directory".
    assert_one_line_error(gpurig(tmp_path, task), f"not in a gpurig project: {tmp_path} ", "gpurig init DIR", "--spec FILE")
    assert list(tmp_path.iterdir()) == []  # nothing rendered into whatever directory that was


def test_outside_a_project_a_spec_given_by_name_is_read(tmp_path):
    proc = gpurig(tmp_path, "matrix", "--spec", str(ROOT / "images" / "pytorch.yaml"), "--format", "tsv")
    assert proc.returncode == 0 and "2.14.1" in proc.stdout, proc.stderr


def test_missing_images_directory_in_a_project(tmp_path):
    (tmp_path / "gpurig.yaml").write_text("")
    assert_one_line_error(gpurig(tmp_path, "matrix"), "no images directory", "project root")


def test_task_decorator_passes_positional_pre_tasks_like_invokes_own():
    from invoke import Collection, Executor, Task

    from gpurig.cli.base import task

    ran = []

    @task
    def first(c):
        ran.append("first")

    @task(first, help={"x": "an option"})
    def second(c, x=None):
        ran.append("second")

    assert isinstance(first, Task) and isinstance(second, Task)
    assert list(second.pre) == [first] and second.help == {"x": "an option"}
    ns = Collection(first, second)
    Executor(ns).execute("second")
    assert ran == ["first", "second"]


def test_a_word_that_is_no_task_hears_where_it_lives_or_the_task_it_resembles(capsys):
    from gpurig.cli import main

    for word, said in (("sync", "syncing is part of `gpurig run"), ("imagez", "did you mean 'images'?")):
        with pytest.raises(SystemExit):
            main(["gpurig", word])
        assert said in capsys.readouterr().err
