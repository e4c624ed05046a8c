"""What people and scripts read: tables that fit 80 columns without ellipses, TSV, JSON reports, the recap."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from gpurig.cli.hosts import facts_rows
from gpurig.cli.images import IMAGE_COLUMNS, image_row
from gpurig.connect.engineinfo import image_info
from gpurig.errors import counted
from gpurig.facts import parse_facts
from gpurig.files import write_report
from gpurig.flows.imagebuild import BUILT_COLUMNS, built_row
from gpurig.image.spec import MatrixEntry
from gpurig.report.fleetrun import host_counts, print_recap
from gpurig.report.tables import Column, fit_columns, rich_table, rows_document, show, unwrapped_table
from gpurig.results import FleetReport, HostResult
from gpurig.status import Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
LONG_REASON = (
    "cannot connect to ubuntu@a100-07.dc2.example.invalid:22: cannot resolve the host name "
    "(Name or service not known) (after 3 attempts); fix: check the host is up"
)


def fleet_of_fixtures() -> FleetReport:
    results = [HostResult(f"host-{p.stem}"[:24], Status.OK, "", parse_facts(p.read_text())) for p in sorted(FIXTURES.glob("*.txt"))]
    results.append(HostResult("a100-07", Status.UNREACHABLE, LONG_REASON))
    return FleetReport(tuple(results), "2026-01-01T00:00:00+00:00", 1.0, summary={})


def render(columns, rows, fmt="table", width=80) -> str:
    # soft_wrap as gpurig's own consoles have it (tables must still fit)
    console = Console(width=width, record=True, file=io.StringIO(), soft_wrap=True)
    show(console, columns, rows, fmt, title="a title")
    return console.export_text() if fmt == "table" else console.file.getvalue()


def assert_fits(text: str, width: int = 80) -> None:
    lines = text.splitlines()
    assert lines, "nothing printed"
    too_long = [line for line in lines if len(line.rstrip()) > width]
    assert not too_long, too_long
    assert "…" not in text and "..." not in text


def test_facts_table_fits_80_columns_with_host_status_and_verdict_whole():
    columns, rows = facts_rows(fleet_of_fixtures(), MatrixEntry("2.14.1", "13.0"))
    text = render(columns, rows)
    assert_fits(text)
    header = next(line for line in text.splitlines() if line.startswith("host"))
    assert "status" in header and "verdict" in header
    for row in rows:
        assert row[0] in text  # every host name, unbroken
    assert "nouveau" in text and "Docker" in text and "stopped" in text
    # the columns left out are named, not silently lost
    assert "not shown at 80 columns:" in text and "cgroup" in text.split("not shown at 80 columns:")[1]


def test_a_wide_terminal_shows_every_facts_column():
    columns, rows = facts_rows(fleet_of_fixtures(), MatrixEntry("2.14.1", "13.0"))
    text = render(columns, rows, width=250)
    assert_fits(text, 250)
    assert "not shown" not in text
    assert all(c.name in text.splitlines()[1] for c in columns)


def test_long_unbreakable_values_fold_instead_of_ending_in_an_ellipsis():
    path = "/srv/gpurig/reports/builds/pytorch/2.14.1-cu130-jupyter-with-a-very-long-suffix.json"
    columns = [Column("image"), Column("report"), Column("size", drop=1)]
    text = render(columns, [["pytorch:2.14.1-cu130-jupyter", path, "6.1 GB"]], width=40)
    assert_fits(text, 40)
    assert "".join(text.split()).count("2.14.1-cu130-jupyter-with-a-very-long-suffix") == 1


def test_drop_order_is_by_priority_then_rightmost():
    columns = [Column("a"), Column("b", drop=1), Column("c", drop=2), Column("d", drop=1)]
    rows = [["x" * 20] * 4]
    assert fit_columns(columns, rows, 200) == [0, 1, 2, 3]
    assert fit_columns(columns, rows, 70) == [0, 1, 3]  # c first (highest)
    assert fit_columns(columns, rows, 50) == [0, 1]  # then d (rightmost of the equals)
    assert fit_columns(columns, rows, 10) == [0]  # a is never dropped


def test_tsv_has_every_column_and_one_line_per_row():
    columns = [Column("host"), Column("stdout")]
    text = render(columns, [["h1", "line one\nline\ttwo"], ["h2", ""]], fmt="tsv")
    assert text.splitlines() == ["host\tstdout", "h1\tline one line two", "h2\t"]


def test_json_rows_carry_schema_and_version():
    columns = [Column("host"), Column("min driver")]
    data = json.loads(render(columns, [["h1", "580"]], fmt="json").replace("a title", ""))
    assert data["rows"] == [{"host": "h1", "min_driver": "580"}]
    doc = rows_document("gpurig.test/1", columns, [["h1", "580"]], inventory="inv.yaml")
    assert doc["schema"] == "gpurig.test/1" and doc["gpurig_version"] and doc["inventory"] == "inv.yaml"


_STYLED = [Column("host"), Column("status", styles={"ok": "green", "failed": "red", "two\nlines": "bold"}), Column("gpus", drop=1), Column("reason")]


@pytest.mark.parametrize("terminal", [False, True])
@pytest.mark.parametrize("title", [None, "Facts"])
@pytest.mark.parametrize("rows", [
    [["gpu000", "ok", "8x H100", "fine"], ["gpu001-long-name", "failed", "", "docker stopped"]],
    [],
    [["gpu000", "ok", "2", "Linux 6.1\n2\nMemTotal: 1 kB\n"], ["gpu001", "failed", "", "\noops\n\nbad"]],  # exec's output
    [["gpu000", "two\nlines", "", "a"]],  # a styled cell of two lines
])
def test_a_table_whose_cells_need_no_wrapping_prints_what_rich_prints_without_its_layout(terminal, title, rows):
    """The fast drawing of a fleet's table (a thousand hosts' rows) is byte for byte rich's, colours included."""
    def printed(renderable) -> str:
        buf = io.StringIO()
        Console(file=buf, width=80, force_terminal=terminal, color_system="truecolor" if terminal else None).print(renderable, soft_wrap=False)
        return buf.getvalue()

    fast = unwrapped_table(_STYLED, rows, 80, title)
    assert fast is not None and printed(fast) == printed(rich_table(_STYLED, rows, 80, title))


@pytest.mark.parametrize(("rows", "width"), [
    ([["gpu000", "ok", "8x H100", "a reason far too long to sit on one line of a table only forty columns wide"]], 40),  # wraps
    ([["gpu000", "ok", "8x H100 80GB HBM3", "fine"]], 30),  # a column dropped
    ([["gpu000", "ok", "", "a\ttab"]], 80),  # rich expands tabs
    ([["gpu000", "ok", "", "réseau"]], 80),  # rich measures what is not ASCII
])
def test_a_table_that_needs_wrapping_or_dropping_is_left_to_rich(rows, width):
    assert unwrapped_table(_STYLED, rows, width) is None


@dataclass(frozen=True)
class _Step:
    status: Status


def test_recap_counts_steps_when_a_host_returns_step_results():
    r = HostResult("h", Status.CHANGED, data=[_Step(Status.OK), _Step(Status.CHANGED), _Step(Status.SKIPPED), _Step(Status.CHANGED)])
    assert host_counts(r) == {"ok": 1, "changed": 2, "unreachable": 0, "failed": 0, "skipped": 1}
    assert host_counts(HostResult("u", Status.UNREACHABLE, "gone")) == {"ok": 0, "changed": 0, "unreachable": 1, "failed": 0, "skipped": 0}


def test_recap_lines_fit_and_say_why_a_host_failed():
    report = FleetReport(
        (HostResult("a100-07", Status.UNREACHABLE, LONG_REASON), HostResult("h1", Status.OK)),
        "2026-01-01T00:00:00+00:00",
        2.0,
        summary={"ok": 1, "unreachable": 1},
    )
    console = Console(width=80, record=True, file=io.StringIO())
    print_recap(report, console)
    text = console.export_text()
    assert "unreachable a100-07: cannot connect" in text
    assert "a100-07 : ok=0 changed=0 unreachable=1 failed=0 skipped=0" in text
    assert "h1      : ok=1 changed=0 unreachable=0 failed=0 skipped=0" in text


def test_the_recap_totals_add_up_its_host_lines_and_say_host_in_the_singular():
    """Seen: the per-host lines counted steps, the last line counted hosts (ok=1 under a host with ok=3)."""
    steps = [_Step(Status.OK), _Step(Status.OK), _Step(Status.CHANGED), _Step(Status.SKIPPED)]
    one = FleetReport((HostResult("h1", Status.CHANGED, data=steps),), "2026-01-01T00:00:00+00:00", 2.0,
                      summary={"changed": 1})
    console = Console(width=80, record=True, file=io.StringIO())
    print_recap(one, console)
    lines = console.export_text().splitlines()
    assert lines == ["h1 : ok=2 changed=1 unreachable=0 failed=0 skipped=1",
                     "1 host in 2.0s: ok=2 changed=1 unreachable=0 failed=0 skipped=1"]
    two = FleetReport((HostResult("h1", Status.CHANGED, data=steps), HostResult("u", Status.UNREACHABLE, "gone")),
                      "2026-01-01T00:00:00+00:00", 2.0, summary={"changed": 1, "unreachable": 1})
    console = Console(width=80, record=True, file=io.StringIO())
    print_recap(two, console)
    assert console.export_text().splitlines()[-1] == "2 hosts in 2.0s: ok=2 changed=1 unreachable=1 failed=0 skipped=1"


def test_counts_have_one_grammar():
    assert [counted(n, "host") for n in (0, 1, 2, 1500)] == ["0 hosts", "1 host", "2 hosts", "1,500 hosts"]
    assert counted(1, "sample record") == "1 sample record" and counted(3, "entry", "entries") == "3 entries"


def test_no_message_counts_with_a_parenthesised_plural():
    """'problem(s)', 'record(s)': every count goes through gpurig.errors.counted instead."""
    package = Path(__file__).resolve().parents[2] / "gpurig"
    found = [f"{p.relative_to(package)}:{node.lineno}" for p in package.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(r"[a-z]\(s\)", node.value.replace("http(s)", ""))]
    js_strings = re.compile(r"`[^`]*`|\"[^\"\n]*\"|'[^'\n]*'")  # the page's text is in its script's string literals
    found += [f"{p.relative_to(package)}: {text}" for p in (package / "dashboard" / "static").glob("*.js")
              for text in js_strings.findall(p.read_text()) if re.search(r"[a-z]\(s\)", text)]
    assert not found, found


# --- write_report: where a --json report may go ------------------------------------------------


def test_report_dash_goes_to_stdout(capsys):
    write_report("-", {"schema": "x/1"})
    assert json.loads(capsys.readouterr().out) == {"schema": "x/1"}


def test_report_file_is_0644_even_under_a_tight_umask(tmp_path):
    old = os.umask(0o077)
    try:
        write_report(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644


def test_a_symlinked_report_path_stays_a_symlink(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_report(link, {"a": 1})
    assert link.is_symlink() and json.loads(target.read_text()) == {"a": 1}


def test_a_fifo_is_written_to_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_report(fifo, {"a": 1})
    reader.join(timeout=10)
    assert json.loads(got[0]) == {"a": 1}
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_directory_is_refused_in_one_line(tmp_path):
    from gpurig.errors import GpurigError

    with pytest.raises(GpurigError, match="is a directory"):
        write_report(tmp_path, {"a": 1})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a link owned by another user")
def test_a_symlink_planted_by_another_user_is_never_followed(tmp_path):
    from gpurig.errors import GpurigError

    victim = tmp_path / "sudoers"
    victim.write_text("root ALL=(ALL) ALL\n")
    link = tmp_path / "r.json"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)  # as if nobody planted it in a shared /tmp
    with pytest.raises(GpurigError, match="symlink owned by another user"):
        write_report(link, {"a": 1})
    assert victim.read_text() == "root ALL=(ALL) ALL\n"


def test_json_to_dev_stdout_reaches_a_pipe_through_its_links():
    # /dev/stdout -> /proc/self/fd/1 -> pipe:[N]: resolving the links to a path named nothing that exists
    code = "from gpurig.files import write_report; write_report('/dev/stdout', {'a': 1})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"a": 1}


# --- images and build: tables like every other task's -------------------------------------------------

BUILD_REPORT = {"image": "registry.example.com/ml/pytorch:2.14.1-cu130-jupyter", "aliases": ["registry.example.com/ml/pytorch:jupyter"],
                "torch": "2.14.1", "cuda": "13.0", "size_bytes": 9_876_543_210, "layers": 23, "steps": {"ran": 4, "total": 19},
                "duration_s": 702.4, "digest": "sha256:" + "ab" * 32}
INSPECTED = image_info({
    "Id": "sha256:" + "e" * 64,
    "RepoTags": ["registry.example.com/ml/pytorch:2.14.1-cu130-jupyter", "registry.example.com/ml/pytorch:jupyter"],
    "Size": 9_876_543_210, "Created": "2026-11-30T12:00:00.123Z",
    "Config": {"Labels": {"io.gpurig.variant": "jupyter", "io.gpurig.torch": "2.14.1", "io.gpurig.cuda": "13.0",
                          "io.gpurig.image.baseimage.source": "pulled",
                          "org.opencontainers.image.base.name": "nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04"}}})


@pytest.mark.parametrize("columns, row", [(BUILT_COLUMNS, built_row(BUILD_REPORT)), (IMAGE_COLUMNS, image_row(INSPECTED))],
                         ids=["build", "images"])
def test_images_and_the_build_summary_are_80_column_tables_with_every_column_in_tsv(columns, row):
    """Seen: both printed TSV whenever stdout was not a terminal, and a table as wide as their longest tag otherwise."""
    text = render(columns, [row])
    assert_fits(text)
    assert "\t" not in text and text.splitlines()[1].split()[:4] == ["image", *[c.name for c in columns][1:4]][:4]
    assert "size" in text.splitlines()[1] and "see --format tsv" in text  # what does not fit is named, never cut
    header, line = render(columns, [row], fmt="tsv").splitlines()
    assert header.split("\t") == [c.name for c in columns] and line.split("\t") == list(row)


def test_a_reference_that_ends_in_an_emoji_name_prints_as_written():
    from gpurig.report import console, err_console, outside

    for out in (console, err_console):
        with out.capture() as captured:
            out.print(f"fan-out of {outside('lab/train:new')}: 1.11 MB out of the build machine")  # ':new:' is rich's 🆕
        assert captured.get() == "fan-out of lab/train:new: 1.11 MB out of the build machine\n"
