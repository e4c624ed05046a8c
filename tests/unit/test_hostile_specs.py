"""Hostile values in every field of an image spec: refused at load with one line, or rendered as inert data.

The corpus is generated from the loader itself: a sample spec that sets every
field is loaded once while recording each mapping the loader reads and the
keys it allows there, so a field added to the loader is attacked without
editing this file (a key the sample lacks is attacked with a bare value).
For each field and each payload (line break, quotes, command substitution,
backtick, '#', backslash) the spec must either be refused at load, with one
line naming the file, the key path and a fix, or render every variant to a
Dockerfile whose instructions, and every RUN's shell words, are exactly those
of the benign spec with the value in place of the benign one.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from unittest import mock

import pytest

from gpurig.errors import SpecError
from gpurig.image.render import render_matrix
from gpurig.image.spec import load_spec
from gpurig.strict.yamlnode import Node

ROOT = Path(__file__).resolve().parents[2]
PAYLOADS = ["\n", '"', "'", "$(touch /tmp/pwned)", "`touch /tmp/pwned`", "#", "\\"]
RENDERED_FILES = ("Dockerfile", "entrypoint.sh", "profile.sh", "sshd_config")


def sample(wheels: Path) -> dict:
    """A spec that sets every field the loader knows, with benign values."""
    return {
        "name": "pytorch",
        "registry": "registry.example.com:5000/ml",
        "python": "3.11",
        "matrix": [
            {"torch": "2.14.1", "cuda": "13.0", "default": True},
            {"torch": "2.9.1", "cuda": "12.8"},
            {"torch": "2.13.0", "cuda": "cpu"},
        ],
        "base": {"image": "debian:bookworm-slim", "bootstrap": {"suite": "bookworm", "mirror": "http://deb.debian.org/debian"}},
        "user": {"name": "gpurig", "uid": 1000},
        "variants": {
            "slim": {"base": "debian:bookworm-slim", "apt": ["htop"], "pip": ["rich"], "ports": [8080]},
            "ssh": {"apt": ["tmux"]},
            "jupyter": {"pip": ["ipywidgets>=8"]},
            "full": {"pip": ["gpustat"], "ports": [22, 8888]},
        },
        "build": {
            "pip_index": "https://pypi.example.com/simple",
            "pip_extra_index": ["https://extra.example.com/simple"],
            "find_links": [str(wheels), "https://wheels.example.com/links"],
            "torch_index": "https://download.pytorch.org/whl/{cuda_tag}",
            "apt_mirror": "http://mirror.example.com/debian",
            "ca_bundle": "auto",
            "aliases": ["{variant}", "{torch}-{cuda_tag}"],
            "syntax": "docker/dockerfile:1",
        },
    }


def node_path(keys: tuple) -> str:
    """A key path written the way the loader's messages write it: a.b[0].c."""
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


def leaves(value, keys: tuple = ()):
    if isinstance(value, dict):
        for key, child in value.items():
            yield from leaves(child, keys + (key,))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from leaves(child, keys + (i,))
    else:
        yield keys, value


def allowed_keys(path: Path) -> dict[str, tuple[str, ...]]:
    """Every mapping the loader reads in the spec at path, with the keys it allows there."""
    seen: dict[str, tuple[str, ...]] = {}
    original = Node.mapping

    def recording(self, allowed, required=()):
        seen[self.path] = tuple(allowed)
        return original(self, allowed, required)

    with mock.patch.object(Node, "mapping", recording):
        load_spec(path)
    return seen


def set_value(tree, keys: tuple, value) -> None:
    for key in keys[:-1]:
        tree = tree[key]
    tree[keys[-1]] = value


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(key path, hostile value, spec file) for every field x payload x position, plus the benign spec."""
    root = tmp_path_factory.mktemp("hostile")
    wheels = root / "wheels"
    wheels.mkdir()
    benign = sample(wheels)
    benign_file = root / "benign.yaml"
    benign_file.write_text(json.dumps(benign))
    fields = {keys: value for keys, value in leaves(benign)}
    by_path = {node_path(keys): keys for keys in fields}
    for path, allowed in allowed_keys(benign_file).items():
        parent = by_path.get(path) if path else ()
        parent = parent if parent is not None else tuple(
            int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", path)
        )
        for key in allowed:
            keys = parent + (key,)
            if not any(known[: len(keys)] == keys for known in fields):
                fields[keys] = "x"  # a key the sample does not set: attacked with a bare value
    cases = []
    for keys, good in fields.items():
        good = str(good)
        for n, payload in enumerate(PAYLOADS):
            split = len(good) - 3 if len(good) > 3 else len(good) // 2  # inside the last path component
            for where, bad in (("end", good + payload), ("inside", good[:split] + payload + good[split:])):
                if keys[:2] == ("build", "find_links") and bad.startswith(str(root)) and "\n" not in bad:
                    Path(bad).mkdir(parents=True, exist_ok=True)  # a real directory: the path must work, not just be refused
                tree = sample(wheels)
                set_value(tree, keys, bad)
                spec_file = root / f"{node_path(keys).replace('/', '_')}-{n}-{where}.yaml"
                spec_file.write_text(json.dumps(tree))
                cases.append((node_path(keys), good, bad, spec_file))
    return benign_file, cases


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """templates/ and checks/ outside any git checkout: labels then depend on the spec alone."""
    root = tmp_path_factory.mktemp("project")
    for name in ("templates", "checks"):
        shutil.copytree(ROOT / name, root / name)
    return root


def dockerfile_instructions(text: str) -> list[tuple[str, list[str]]]:
    """(INSTRUCTION, words) per instruction, as BuildKit's parser splits them: continuation lines
    joined, comment lines dropped (also inside a continuation), RUN flags apart from the shell words."""
    instructions, pending = [], ""
    for line in text.splitlines():
        if not pending and not line.strip():
            continue
        if line.lstrip().startswith("#"):
            continue
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1]
            continue
        logical, pending = pending + line, ""
        keyword, _, rest = logical.strip().partition(" ")
        instructions.append((keyword.upper(), shlex.split(rest)))
    assert not pending, "a continuation runs off the end of the file"
    return instructions


def rendered(spec_file: Path, project: Path, out: Path) -> dict[tuple[str, str], dict[str, object]]:
    spec = load_spec(spec_file)
    contexts, _ = render_matrix(spec, list(spec.matrix), list(spec.variants), project, out)
    result = {}
    for context in contexts:
        files: dict[str, object] = {}
        for name in RENDERED_FILES:
            path = context.path / name
            if path.is_file():
                text = path.read_text()
                files[name] = dockerfile_instructions(text) if name == "Dockerfile" else text
        result[(context.entry.tag, context.variant.name)] = files
    return result


def swap(value, bad: str, good: str):
    if isinstance(value, str):
        return value.replace(bad, good)
    if isinstance(value, (list, tuple)):
        return type(value)(swap(v, bad, good) for v in value)
    return value


def test_the_corpus_attacks_every_field_the_loader_reads(corpus):
    _, cases = corpus
    paths = {path for path, *_ in cases}
    for expected in ("name", "registry", "matrix[0].torch", "matrix[0].cuda", "base.image", "base.bootstrap.mirror",
                     "user.name", "user.uid", "variants.slim.apt[0]", "variants.slim.pip[0]", "variants.slim.ports[0]",
                     "variants.ssh.base", "build.torch_index", "build.apt_mirror", "build.aliases[0]", "build.syntax"):
        assert expected in paths
    assert len(cases) > 500


def test_every_hostile_value_is_refused_in_one_line_or_rendered_as_data(corpus, project, tmp_path):
    benign_file, cases = corpus
    expected = rendered(benign_file, project, tmp_path / "benign")
    accepted = []
    for i, (path, good, bad, spec_file) in enumerate(cases):
        try:
            load_spec(spec_file)
        except SpecError as err:
            line = str(err)
            assert "\n" not in line and "Traceback" not in line, (path, bad, line)
            assert line.startswith(f"{spec_file}: ") and "; fix: " in line, (path, bad, line)
            assert f": {path}:" in line or f": {path.rsplit('.', 1)[0]}:" in line, (path, bad, line)
            continue
        accepted.append(path)
        got = rendered(spec_file, project, tmp_path / f"case{i}")
        assert got.keys() == expected.keys(), (path, bad)
        for key, files in got.items():
            for name, content in files.items():
                assert swap(content, bad, good) == expected[key][name], (path, repr(bad), key, name)
    # paths on the build host take any printable name; everything else is refused
    assert set(accepted) <= {"build.find_links[0]", "build.ca_bundle"}, sorted(set(accepted))
