"""Odd values, one class at a time, through the real entry points: one stderr line, a non-zero exit, no traceback.

Each class is refused where the value enters, by one grammar (gpurig/strict/validate.py):
Unicode digits in numbers, numbers that overflow, markup and escape sequences
in text that came from outside, control characters in free text, non-ASCII
image tags, volume targets that resolve to /, unbounded or special --replay
files, ssh_keys errors, ssh arguments gpurig cannot honour, and verify's
--image/--container. The CLI runs in-process through gpurig's Invoke Program.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import yaml

from gpurig.cli import main
from gpurig.connect.target import TargetError, resolve_target
from gpurig.inventory import Host

ESC = "\x1b"
# A title change, a screen clear and a hyperlink: what a hostile name or note would make a terminal do.
ESCAPES = f"{ESC}]0;pwned\x07{ESC}[2J{ESC}]8;;http://evil.example/\x07click{ESC}]8;;\x07"
NOT_A_CONNECTION = "192.0.2.1"  # TEST-NET-1: a host gpurig must not reach for any of these refusals


class Ran:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


@pytest.fixture
def gpurig(tmp_path, monkeypatch, capsys):
    """``gpurig ARGS`` in-process, in tmp_path with HOME there and no GPURIG_* from the caller's shell."""
    for name in [n for n in os.environ if n.startswith("GPURIG_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> Ran:
        capsys.readouterr()
        try:
            main(["gpurig", *args])
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run


def one_line(ran: Ran, *fragments: str) -> str:
    """The run failed with exactly one stderr line holding every fragment, and no traceback."""
    assert ran.code != 0, ran.out
    assert "Traceback" not in ran.err, ran.err[-3000:]
    lines = ran.err.strip().splitlines()
    assert len(lines) == 1, ran.err[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def inventory(path: Path, hosts: dict) -> Path:
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}, allow_unicode=True))
    return path


@pytest.fixture
def unreachable(tmp_path) -> Path:
    return inventory(tmp_path / "inv.yaml", {"far": {"ansible_host": NOT_A_CONNECTION}})


# --- Unicode digits -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["logs", "box", "--tail", "²"], ["--tail '²' is not a whole number"]),  # Invoke's int() raised on it
        (["logs", "box", "--tail", "1e999"], ["--tail '1e999' is not a whole number"]),
        (["-T", "١٢", "--list"], ["--command-timeout '١٢' is not a whole number"]),
        (["facts", "-f", "١٢"], ["--forks '١٢' is not a whole number"]),  # int() read it as 12
        (["facts", "--connect-timeout", "٣"], ["--connect-timeout '٣' is not a number"]),
        (["monitor", "--interval", "١"], ["--interval '١' is not a number of seconds"]),
        (["monitor", "--prometheus", "²"], ["--prometheus '²' is not [ADDR:]PORT"]),
    ],
)
def test_unicode_digits_in_flags_are_one_line(gpurig, unreachable, args, fragments):
    one_line(gpurig(*args, *(["-i", str(unreachable)] if args[0] != "-T" else [])), *fragments)


def test_unicode_digits_in_a_port_of_a_jump_host_are_refused_by_name():
    host = Host(name="h", groups=(), vars={"ansible_ssh_common_args": "-J bastion:²"}, address="10.0.0.1")
    with pytest.raises(TargetError, match="port of jump host 'bastion:²'.* must be a whole number"):
        resolve_target(host, None)  # isdigit() passed it and int() raised ValueError


def test_unicode_digits_in_a_restart_policy_and_a_spec_version_are_one_line(gpurig, project, tmp_path):
    inv = inventory(tmp_path / "inv.yaml", {"far": {"ansible_host": NOT_A_CONNECTION,
                                                    "gpurig_containers": [{"variant": "slim", "restart": "on-failure:²"}]}})
    one_line(gpurig("deploy", "--check", "-i", str(inv)), "restart", "'on-failure:²' is not a restart policy")
    spec = (project / "images" / "pytorch.yaml").read_text()
    (tmp_path / "arabic.yaml").write_text(spec.replace('torch: "2.', 'torch: "٢.', 1))
    one_line(gpurig("render", "--spec", str(tmp_path / "arabic.yaml")), "is not a version X.Y.Z")


# --- numbers that overflow --------------------------------------------------------------------------


def test_a_size_past_any_float_is_one_line(gpurig, project, tmp_path):
    inv = inventory(tmp_path / "inv.yaml", {"far": {"ansible_host": NOT_A_CONNECTION,
                                                    "gpurig_containers": [{"variant": "slim", "shm_size": "9" * 400 + "g"}]}})
    one_line(gpurig("deploy", "--check", "-i", str(inv)), "shm_size", "is more than any host has")


def test_a_duration_past_any_timeout_is_one_line(gpurig, unreachable):
    one_line(gpurig("monitor", "-i", str(unreachable), "--duration", "1e300"), "--duration '1e300' is not a number of seconds")


def sample(host: str, **changes) -> dict:
    record = {"type": "sample", "host": host, "t": 1_700_000_000.0, "cpu": {"percent": 50.0, "per_core": [50.0]},
              "mem": {"total": 2**34, "available": 2**33}, "gpus": [{"index": 0, "util_gpu": 90, "mem_used_mib": 1000, "mem_total_mib": 80000}]}
    record.update(changes)
    return record


def recorded(directory: Path, *lines: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "samples.jsonl").write_text("".join(line + "\n" for line in lines))
    return directory


@pytest.mark.parametrize(
    "changes",
    [
        {"t": 1e308},  # time.localtime(1e308) overflows in the CSV's dates
        {"mem": {"total": 1e308, "available": 0}},
        {"gpus": [{"index": 0, "util_gpu": "ninety"}]},  # a string where the table formats a number
    ],
)
def test_recorded_numbers_that_overflow_are_skipped_and_the_rest_replays(gpurig, tmp_path, changes):
    run = recorded(tmp_path / "run", json.dumps(sample("good")), json.dumps(sample("bad", **changes)))
    ran = gpurig("monitor", "--replay", str(run), "--csv", str(tmp_path / "out.csv"))
    assert ran.code == 0 and "Traceback" not in ran.err, ran.err[-3000:]
    rows = (tmp_path / "out.csv").read_text().splitlines()
    assert len(rows) == 2 and "good" in rows[1]  # the header and the one good sample


def test_json_infinity_in_a_recorded_run_is_no_sample(gpurig, tmp_path):
    run = recorded(tmp_path / "run", '{"type": "sample", "host": "h", "t": Infinity, "cpu": {"percent": NaN}}')
    one_line(gpurig("monitor", "--replay", str(run)), "holds no samples")


# --- markup and escape sequences from outside --------------------------------------------------------


def test_escape_sequences_and_markup_in_a_recorded_run_are_shown_not_obeyed(gpurig, tmp_path):
    host = f"[bold red]evil{ESCAPES}"
    note = {"type": "note", "host": host, "message": f"[link=http://evil.example]x[/link]{ESCAPES}"}
    run = recorded(tmp_path / "run", json.dumps(note), json.dumps(sample(host)))
    ran = gpurig("monitor", "--replay", str(run))
    assert ran.code == 0, ran.err
    for text in (ran.out, ran.err):
        assert ESC not in text and "\x07" not in text
    assert "[bold red]evil" in ran.out and "[link=http://evil.example]" in ran.err  # shown as written: data, not markup
    assert "\\x1b]0;pwned" in ran.err


def test_escape_sequences_in_inventory_host_names_and_patterns_are_shown_not_obeyed(gpurig, tmp_path):
    for name in (f"h{ESC}[2J", "[red]x"):
        inv = inventory(tmp_path / "inv.yaml", {name: {"ansible_connection": "local"}})
        line = one_line(gpurig("hosts", "-i", str(inv)), "host name")
        assert ESC not in line and ("h\\x1b[2J" in line or "'[red]x'" in line)
    inv = inventory(tmp_path / "inv.yaml", {"h": {"ansible_connection": "local"}})
    line = one_line(gpurig("hosts", "-i", str(inv), "-l", f"nothing{ESC}c\x07"), "matches")
    assert ESC not in line and "\x07" not in line
    # the inventory path is put into its error as typed: printable() on the error line is all that stands before the terminal
    line = one_line(gpurig("hosts", "-i", f"inv{ESC}c\x07.yaml"), "not found")
    assert ESC not in line and "\x07" not in line and "inv\\x1bc\\x07.yaml" in line


# --- control characters in free text ----------------------------------------------------------------


def test_control_characters_in_a_free_text_var_are_one_line_before_any_host(gpurig, tmp_path):
    inv = inventory(tmp_path / "inv.yaml", {"far": {"ansible_host": NOT_A_CONNECTION, "gpurig_gpu_model": f"NVIDIA H100{ESC}[2J"}})
    line = one_line(gpurig("verify", "-i", str(inv), "--connect-timeout", "1"), "gpurig_gpu_model", "contains a control character")
    assert ESC not in line


def test_control_characters_in_a_containers_text_field_are_one_line(gpurig, project, tmp_path):
    inv = inventory(tmp_path / "inv.yaml", {"far": {"ansible_host": NOT_A_CONNECTION,
                                                    "gpurig_containers": [{"variant": "slim", "torch": "2.9.1\u202e"}]}})
    one_line(gpurig("deploy", "--check", "-i", str(inv)), "torch", "contains a control character")


# --- image tags, container names, volume targets ----------------------------------------------------


@pytest.mark.parametrize(
    "flag,value,fragment",
    [
        ("--image", "pytorch:2.9.1-cü128", "is not an image reference"),  # \w took 'ü'; Docker refuses it on every host
        ("--image", "pytorch:١٢", "is not an image reference"),
        ("--image", "Registry/UPPER:1", "is not an image reference"),
        ("--container", "-rm", "is not a container name"),
        ("--container", "a b", "is not a container name"),
        ("--container", f"x{ESC}[2J", "is not a container name"),
    ],
)
def test_verify_checks_image_and_container_before_any_host_is_contacted(gpurig, unreachable, flag, value, fragment):
    line = one_line(gpurig("verify", "-i", str(unreachable), "--connect-timeout", "1", flag, value), flag, fragment)
    assert ESC not in line


@pytest.mark.parametrize("target", ["/.", "/data/..", "//./", "/x/../.."])
def test_a_volume_target_that_resolves_to_root_is_one_line(gpurig, project, tmp_path, target):
    inv = inventory(tmp_path / "inv.yaml", {"far": {"ansible_host": NOT_A_CONNECTION,
                                                    "gpurig_containers": [{"variant": "slim", "volumes": [{"source": "/data", "target": target}]}]}})
    one_line(gpurig("deploy", "--check", "-i", str(inv)), "target", "'.' or '..' part")


def test_volume_targets_that_differ_only_in_slashes_are_one_mount_point(gpurig, project, tmp_path):
    volumes = [{"source": "/a", "target": "/data//x/"}, {"source": "/b", "target": "/data/x"}]
    inv = inventory(tmp_path / "inv.yaml", {"far": {"ansible_host": NOT_A_CONNECTION, "gpurig_containers": [{"variant": "slim", "volumes": volumes}]}})
    one_line(gpurig("deploy", "--check", "-i", str(inv)), "both mount at")


# --- --replay bounds -----------------------------------------------------------------------------------


def test_replay_of_a_fifo_is_one_line_not_a_hang(gpurig, tmp_path):
    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / "samples.jsonl")
    result: list[Ran] = []
    reader = threading.Thread(target=lambda: result.append(gpurig("monitor", "--replay", str(tmp_path / "run"))), daemon=True)
    reader.start()
    reader.join(timeout=60)
    if reader.is_alive():  # unblock the hung open/read so the test ends, then fail
        with open(tmp_path / "run" / "samples.jsonl", "w"):
            pass
        pytest.fail("--replay blocked on a FIFO")
    one_line(result[0], "is not a regular file")


def test_replay_refuses_an_overlong_line_and_an_oversized_file(gpurig, tmp_path, monkeypatch):
    from gpurig.monitor import record

    monkeypatch.setattr(record, "MAX_LINE", 1024)
    run = recorded(tmp_path / "run", json.dumps(sample("h")), json.dumps(sample("h", pad="x" * 2048)))
    one_line(gpurig("monitor", "--replay", str(run)), "line 2 is over 1 KiB")
    monkeypatch.setattr(record, "MAX_RUN_BYTES", 2**20)
    recorded(tmp_path / "big", *[json.dumps(sample("h"))] * 5000)
    one_line(gpurig("monitor", "--replay", str(tmp_path / "big")), "over the 1 MiB limit")


# --- ssh_keys and ssh arguments ---------------------------------------------------------------------


def test_a_missing_ssh_keys_file_names_the_inventory_the_host_and_the_key(gpurig, project, tmp_path):
    inv = inventory(tmp_path / "inv.yaml", {"far": {"ansible_host": NOT_A_CONNECTION,
                                                    "gpurig_containers": [{"variant": "ssh", "ssh_keys": ["keys/alice.pub"]}]}})
    one_line(gpurig("deploy", "--check", "-i", str(inv)), str(inv), "host far", "ssh_keys[0]", "'keys/alice.pub'", str(tmp_path / "keys" / "alice.pub"))


@pytest.mark.parametrize("task", [["hosts"], ["inventory", "--list"]])
@pytest.mark.parametrize(
    "args,fragment",
    [
        ("-o ProxyCommand='nc %h %p'", "option 'ProxyCommand' is not supported"),
        ("-L 8080:localhost:80", "'-L' is not supported"),
        ("-o 'ProxyJump=b", "cannot be split into words"),
    ],
)
def test_ssh_args_gpurig_cannot_honour_are_refused_when_the_inventory_loads(gpurig, tmp_path, task, args, fragment):
    inv = inventory(tmp_path / "inv.yaml", {"far": {"ansible_host": NOT_A_CONNECTION, "ansible_ssh_common_args": args}})
    one_line(gpurig(*task, "-i", str(inv)), str(inv), "ansible_ssh_common_args", fragment)
