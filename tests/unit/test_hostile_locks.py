"""Hostile values in every field of a lock file: refused with one line before anything renders, never used.

A lock decides what a build installs (requirements lines, apt words, the FROM), so it is a security boundary like
the spec (tests/unit/test_hostile_specs.py). The corpus is generated from a benign lock written by gpurig itself:
every value and every data key (an image's key, a step, a package, an input) with each payload (line break,
quotes, command substitution, backtick, '#', backslash) at its end and inside it, and an unknown key added to every
mapping. Each must make the locked render raise a LockError of one line ending in the re-lock fix, with nothing
written into the build contexts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from test_hostile_specs import leaves
from test_lock import REPO, cpu, resolved

from gpurig.image import lock
from gpurig.image.render import render
from gpurig.image.spec import load_spec

PAYLOADS = ["\n", '"', "'", "$(touch /tmp/pwned)", "`touch /tmp/pwned`", "#", "\\"]
DATA_KEYS = ("images", "pip", "apt", "inputs", "system")  # mappings whose keys are data, not the lock's own words




def mappings(value, keys: tuple = ()):
    if isinstance(value, dict):
        yield keys
        for key, child in value.items():
            yield from mappings(child, keys + (key,))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from mappings(child, keys + (i,))


def at(tree, keys: tuple):
    for key in keys:
        tree = tree[key]
    return tree


def hostile(good: str, payload: str) -> list[str]:
    split = len(good) - 3 if len(good) > 3 else len(good) // 2
    return [good + payload, good[:split] + payload + good[split:]]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A spec in a folder of its own and the benign lock gpurig writes for its CPU slim image."""
    path = tmp_path_factory.mktemp("locks") / "images" / "pytorch.yaml"
    path.parent.mkdir()
    shutil.copy(REPO / "images" / "pytorch.yaml", path)
    spec = load_spec(path)
    lock.save(lock.lock_path(path), spec, {lock.image_key(cpu(spec).tag, "slim"): resolved(spec, "debian@sha256:" + "d" * 64)})
    benign = yaml.safe_load(lock.lock_path(path).read_text())
    return spec, benign


def cases(benign) -> list[tuple[str, dict]]:
    out = []
    for keys, good in leaves(benign):
        for payload in PAYLOADS:
            for bad in hostile(str(good), payload):
                tree = json.loads(json.dumps(benign))
                at(tree, keys[:-1])[keys[-1]] = bad
                out.append((f"{keys}={bad!r}", tree))
    for keys in mappings(benign):
        tree = json.loads(json.dumps(benign))
        at(tree, keys)["url"] = "http://evil.example.com/simple"
        out.append((f"{keys}+url", tree))
        if keys and keys[-1] in DATA_KEYS:
            for key in list(at(benign, keys)):
                for payload in PAYLOADS:
                    tree = json.loads(json.dumps(benign))
                    mapping = at(tree, keys)
                    mapping[str(key) + payload] = mapping.pop(key)
                    out.append((f"{keys}[{key!r}+{payload!r}]", tree))
    return out


def test_every_hostile_field_of_a_lock_is_refused_in_one_line_and_nothing_renders(project, tmp_path):
    spec, benign = project
    path = lock.lock_path(spec.path)
    out = tmp_path / "contexts"
    assert render(spec, cpu(spec), "slim", REPO, out, lock.Locks.of(spec)).lock is not None  # the benign lock is used
    shutil.rmtree(out)
    corpus = cases(benign)
    assert len(corpus) > 300
    used = []
    try:
        for name, tree in corpus:
            path.write_text(yaml.safe_dump(tree, sort_keys=False))
            try:
                render(spec, cpu(spec), "slim", REPO, out, lock.Locks.of(spec))
            except lock.LockError as err:
                message = str(err)
                assert "\n" not in message and message.endswith("re-lock") and len(message) < 400, (name, message)
            else:
                used.append(name)
            assert not out.exists() or not any(out.rglob("Dockerfile")), name
    finally:
        lock.save(path, spec, {})
    assert used == []


def test_an_unknown_key_is_refused_with_the_key_it_may_have_meant(project):
    spec, benign = project
    tree = json.loads(json.dumps(benign))
    image = next(iter(tree["images"].values()))
    image["pip"]["torch"][0]["sha265"] = image["pip"]["torch"][0].pop("sha256")
    text = yaml.safe_dump(tree)
    lock.lock_path(spec.path).write_text(text)
    with pytest.raises(lock.LockError, match=r"images\.[^ ]+\.pip\.torch\[0\]: unknown key 'sha265' \(did you mean 'sha256'\?\)"):
        lock.Locks.of(spec)


@pytest.mark.parametrize("digest, said", [
    ("evil.example.com/debian@sha256:" + "c" * 64, "is not of the base 'debian:bookworm-slim'"),
    ("ubuntu@sha256:" + "c" * 64, "is not of the base"),
    ("debian@sha256:" + "c" * 63, "is not a registry digest"),
    ("debian:bookworm-slim", "is not a registry digest"),
])
def test_a_base_digest_must_be_the_spec_bases_own(project, digest, said):
    spec, benign = project
    tree = json.loads(json.dumps(benign))
    next(iter(tree["images"].values()))["base"]["digest"] = digest
    lock.lock_path(spec.path).write_text(yaml.safe_dump(tree))
    with pytest.raises(lock.LockError, match=said):
        lock.Locks.of(spec)


@pytest.mark.parametrize("digest", ["debian@sha256:" + "c" * 64, "docker.io/library/debian@sha256:" + "c" * 64])
def test_the_bases_own_digest_is_taken_however_docker_hub_is_spelt(project, digest):
    spec, benign = project
    tree = json.loads(json.dumps(benign))
    next(iter(tree["images"].values()))["base"]["digest"] = digest
    lock.lock_path(spec.path).write_text(yaml.safe_dump(tree))
    assert next(iter(lock.Locks.of(spec).images.values())).from_ref == digest


def test_a_base_other_than_the_one_the_inputs_name_is_refused(project):
    spec, benign = project
    tree = json.loads(json.dumps(benign))
    image = next(iter(tree["images"].values()))
    image["base"] = {"ref": "evil.example.com/debian:bookworm-slim", "id": "sha256:" + "b" * 64, "digest": ""}
    lock.lock_path(spec.path).write_text(yaml.safe_dump(tree))
    with pytest.raises(lock.LockError, match=r"base\.ref 'evil\.example\.com/debian:bookworm-slim' is not the base the lock's inputs name"):
        lock.Locks.of(spec)


def test_a_lock_filed_under_another_images_key_is_refused_not_used(project, tmp_path):
    spec, benign = project
    tree = json.loads(json.dumps(benign))
    key = next(iter(tree["images"]))
    tree["images"][key]["variant"] = "full"  # the slim key now holds a lock that says it is of another variant
    lock.lock_path(spec.path).write_text(yaml.safe_dump(tree))
    with pytest.raises(lock.LockError, match="is filed under"):
        render(spec, cpu(spec), "slim", REPO, tmp_path / "contexts", lock.Locks.of(spec))
    assert not (tmp_path / "contexts").exists()


def test_a_lock_that_is_a_directory_is_refused_not_ignored(project, tmp_path):
    spec, _ = project
    path = lock.lock_path(spec.path)
    path.unlink()
    path.mkdir()
    try:
        with pytest.raises(lock.LockError, match="is not a regular file"):
            lock.Locks.of(spec)
    finally:
        path.rmdir()
        path.write_text("schema: 1\nimages: {}\n")


def test_the_grammar_reads_what_gpurig_writes(project):
    spec, benign = project
    lock.lock_path(spec.path).write_text(yaml.safe_dump(benign))
    images = lock.Locks.of(spec).images
    assert [image.as_dict() for image in images.values()] == list(benign["images"].values())
    assert Path(lock.lock_path(spec.path)).read_text()
