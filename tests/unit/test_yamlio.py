"""gpurig.strict.yamlio: users' YAML files read with bounded work and strict meaning, every failure one line."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from gpurig.errors import SpecError
from gpurig.strict import yamlio
from gpurig.strict.yamlio import load_yaml, parse_yaml


def refused(text: str) -> str:
    with pytest.raises(SpecError) as err:
        parse_yaml(text, "f.yaml", error=SpecError)
    message = str(err.value)
    assert "\n" not in message and message.startswith("f.yaml:")
    assert err.value.fix
    return message


def load(path, **kw):
    return load_yaml(path, error=SpecError, what="spec", fix_missing="create it", **kw)


def test_plain_documents_load_as_safe_yaml_does():
    assert parse_yaml("a: 1\nb: [x, y]\nc: {d: yes}\n", "f", error=SpecError) == {"a": 1, "b": ["x", "y"], "c": {"d": True}}
    assert parse_yaml("", "f", error=SpecError) is None
    assert parse_yaml("# only a comment\n", "f", error=SpecError) is None


def test_duplicate_keys_name_both_lines():
    message = refused("variants:\n  slim: {}\nother: 1\nvariants:\n  full: {}\n")
    assert "line 4" in message and "'variants' given twice (first at line 1)" in message


def test_duplicate_keys_in_a_nested_mapping_and_a_flow_mapping():
    assert "'x' given twice (first at line 2)" in refused("top:\n  x: 1\n  y: 2\n  x: 3\n")
    assert "'k' given twice" in refused("m: {k: 1, k: 2}\n")


def test_merge_keys_are_not_duplicates():
    doc = parse_yaml("base: &b {x: 1, y: 2}\nmine:\n  <<: *b\n  y: 3\n", "f", error=SpecError)
    assert doc["mine"] == {"x": 1, "y": 3}


def test_a_long_duplicate_key_is_quoted_short():
    key = "k" * 500
    message = refused(f"{key}: 1\n{key}: 2\n")
    assert key not in message and len(message) < 200


def test_alias_bomb_is_refused_quickly():
    # nine levels of ten aliases each: a billion values if expanded
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    started = time.process_time()
    message = refused("\n".join(lines) + "\n")
    assert "aliases expand to more than" in message
    assert time.process_time() - started < 2


def test_modest_alias_reuse_is_fine():
    doc = parse_yaml("common: &c {user: ubuntu}\nhosts:\n  a: *c\n  b: *c\n", "f", error=SpecError)
    assert doc["hosts"]["b"] == {"user": "ubuntu"}


@pytest.mark.parametrize("depth", [yamlio.MAX_DEPTH + 5, 3000])
def test_deep_nesting_is_one_line_not_a_recursion_error(depth):
    message = refused("[" * depth + "]" * depth + "\n")
    assert "nested" in message or "malformed YAML" in message


def test_nesting_within_the_limit_loads():
    depth = yamlio.MAX_DEPTH - 2
    doc = parse_yaml("[" * depth + "1" + "]" * depth, "f", error=SpecError)
    for _ in range(depth):
        doc = doc[0]
    assert doc == 1


@pytest.mark.parametrize("literal", ["1" * 19, "-" + "9" * 5000, "0x" + "f" * 40, "0" + "7" * 30, "0b" + "1" * 30, "1_000_000_000_000_000_000_000"])
def test_huge_integers_are_refused(literal):
    assert "is too large" in refused(f"n: {literal}\n")


def test_integers_up_to_the_limit_load():
    assert parse_yaml("n: 999999999999999999\nh: 0xff\n", "f", error=SpecError) == {"n": 10**18 - 1, "h": 255}


def test_python_tags_are_refused_not_run():
    message = refused("a: !!python/object/apply:os.system ['touch /tmp/gpurig-yamlio-pwned']\n")
    assert "malformed YAML" in message and not os.path.exists("/tmp/gpurig-yamlio-pwned")


def test_a_long_tag_is_not_echoed_whole():
    message = refused("a: !" + "t" * 2000 + " x\n")
    assert len(message) < 300


def test_several_documents_are_refused():
    assert "malformed YAML" in refused("a: 1\n---\nb: 2\n")


def test_syntax_errors_give_line_and_column():
    assert "line 3, column 1" in refused("a:\n  - [x\n")


def test_missing_file_says_the_fix(tmp_path):
    with pytest.raises(SpecError) as err:
        load(tmp_path / "nope.yaml")
    assert "spec" in str(err.value) and "not found" in str(err.value) and err.value.fix == "create it"


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    outcome: list = []
    # a reader that opened the FIFO would block for ever: run it in a thread so the test fails instead of hanging
    worker = threading.Thread(target=lambda: outcome.append(_error_of(lambda: load(fifo))), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the thread's open() so it can end
        with open(fifo, "w"):
            pass
        pytest.fail("load_yaml blocked on a FIFO")
    assert "is not a regular file" in outcome[0]


def _error_of(fn) -> str:
    try:
        fn()
    except SpecError as err:
        return str(err)
    return "no error"


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "/"])
def test_devices_and_directories_are_refused(path):
    assert "is not a regular file" in _error_of(lambda: load(path))


def test_a_symlink_to_a_device_is_refused(tmp_path):
    link = tmp_path / "spec.yaml"
    link.symlink_to("/dev/zero")
    assert "is not a regular file" in _error_of(lambda: load(link))


def test_a_file_over_the_size_cap_says_its_size(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(yamlio.MAX_BYTES + 1024 * 1024)  # sparse: nothing is written
    message = _error_of(lambda: load(big))
    assert "6.0 MiB, over the 5 MiB limit" in message


def test_non_utf8_names_the_byte(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    assert "byte 9 is not UTF-8" in _error_of(lambda: load(path))


@pytest.mark.parametrize("text", ["a: " + "[" * 30000 + "]" * 30000, "- " * 30000 + "x\n"])
def test_nesting_past_what_libyaml_can_compose_is_refused_not_a_crash(text):
    # libyaml's composer recurses in C: 30,000 levels in 60 KB used to end gpurig with SIGSEGV.
    code = "import sys; from gpurig.strict.yamlio import parse_yaml; from gpurig.errors import SpecError\n" \
           "try:\n    parse_yaml(sys.stdin.read(), 'deep.yaml', error=SpecError)\nexcept SpecError as e:\n    print(e)\n"
    proc = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "nested deeper than 64 levels" in proc.stdout
