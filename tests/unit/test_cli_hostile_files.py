"""`gpurig render --spec FILE` with files built to exhaust or mislead: one line, quickly, in bounded memory.

Each run is a real CLI process limited to 1 GiB of address space and a
timeout; it must exit non-zero with exactly one stderr line that names the
file and the rule, no traceback, and never quote another file it was pointed at.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from cputime import ChildCPU

MINIMAL = 'name: p\npython: "3.11"\nmatrix: [{torch: "2.9.1", cuda: "12.8"}]\n'
LIMIT_BYTES = 1 << 30
SECONDS = 30  # of CPU: a blow-up fails it, load on the machine cannot; a hang (FIFO) ends at the 60 s timeout


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


def render_spec(project: Path, spec: Path | str) -> tuple[subprocess.CompletedProcess, float]:
    code = "import sys; from gpurig.cli import main; main(sys.argv)"
    with ChildCPU() as cpu:
        proc = subprocess.run(
            [sys.executable, "-c", code, "render", "--spec", str(spec)],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=limited,
        )
    return proc, cpu.seconds


def assert_refused(proc: subprocess.CompletedProcess, seconds: float, *fragments: str) -> str:
    assert proc.returncode not in (0, None), proc.stdout
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "; fix: " in lines[0]
    assert seconds < SECONDS, f"took {seconds:.1f}s"
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join('*' + chr(97 + i) for _ in range(10))}]\n" for i in range(9)
)

CASES = {
    "nesting": ("name: " + "[" * 3000 + "]" * 3000 + "\n", ["line 1", "nested deeper than"]),
    "huge-integer": (MINIMAL + "user: {uid: " + "9" * 5000 + "}\n", ["line 4", "5000 digits"]),
    "alias-bomb": (BOMB, ["aliases expand to more than"]),
    "format-width-alias": (MINIMAL + "build: {aliases: ['{variant:>1500000000}']}\n", ["build.aliases[0]", "width"]),
    "torch-index-width": (
        MINIMAL + "build: {torch_index: 'https://x.example/{cuda_tag:>1500000000}'}\n",
        ["build.torch_index", "width"],
    ),
    "duplicate-variants": (MINIMAL + "variants: {slim: {}}\nvariants: {full: {}}\n", ["line 5", "'variants' given twice", "line 4"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_spec_is_one_line_fast_and_bounded(project, tmp_path, name):
    text, fragments = CASES[name]
    spec = write(tmp_path / f"{name}.yaml", text)
    proc, seconds = render_spec(project, spec)
    assert_refused(proc, seconds, str(spec), *fragments)
    assert not (project / "build-contexts").exists()


def test_a_50_mb_spec_is_refused_by_its_size(project, tmp_path):
    spec = tmp_path / "big.yaml"
    with open(spec, "w") as f:
        f.write(MINIMAL + "# padding\n" * 100)
        f.truncate(50 * 2**20)
    proc, seconds = render_spec(project, spec)
    line = assert_refused(proc, seconds, str(spec), "50.0 MiB", "limit")
    assert "group_vars" not in line  # an inventory's fix is none for a spec
    assert seconds < 5


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "directory"])
def test_a_spec_that_is_not_a_regular_file_is_refused_without_reading_it(project, tmp_path, special):
    if special == "fifo":
        path = tmp_path / "spec.yaml"
        os.mkfifo(path)  # nobody writes: a reader would block forever
    elif special == "directory":
        path = tmp_path / "a-directory.yaml"
        path.mkdir()
    else:
        path = Path(special)
    proc, seconds = render_spec(project, path)
    assert_refused(proc, seconds, str(path), "not a regular file")


@pytest.mark.parametrize(
    "target_text",
    [
        None,  # /etc/passwd itself
        "db_admin_password_is hunter2: yes\n",
        "'root:x:0:0:root:/root:/bin/bash': 1\n",
        "name: p\npython: '3.11'\nmatrix: [{torch: '2.9.1', cuda: '12.8'}]\nsecret token hunter2 line: 1\n",
    ],
    ids=["passwd", "key-with-spaces", "quoted-passwd-line", "valid-spec-then-secret"],
)
def test_a_spec_linked_to_another_file_never_prints_that_file(project, tmp_path, target_text):
    if target_text is None:
        target = Path("/etc/passwd")
        if not target.is_file():
            pytest.skip("no /etc/passwd")
        secrets = [line for line in target.read_text().splitlines()[:1]] + ["root:x", "/bin/"]
    else:
        target = write(tmp_path / "other.conf", target_text)
        secrets = ["hunter2", "root:x", "/bin/"]
    link = tmp_path / "spec.yaml"
    link.symlink_to(target)
    proc, seconds = render_spec(project, link)
    line = assert_refused(proc, seconds, str(link))
    for secret in secrets:
        assert secret not in line, line
