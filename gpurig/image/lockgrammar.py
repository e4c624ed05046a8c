"""A lock file's grammar: every field a lock holds checked against its own rule, and every key it does not know refused.

A lock decides what a build installs (requirements lines, ``apt-get install pkg=version``, the Dockerfile's FROM), so
it is read as hostile as a spec: a wheel name with a line break added ``--index-url``/``-r`` lines to pip's input, a
``url`` key was silently ignored, and a base digest in another registry was rendered as the FROM. Here a wheel is
name, version and sha256 (64 hex digits); an apt package is a Debian name and version; the base is the one its
inputs name (the spec's: gpurig.image.lock.select compares them), its id a sha256 and its digest that same repository's.
Each function raises ValueError with the key path and the rule; gpurig.image.lock.load says it as one line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpurig.errors import did_you_mean
from gpurig.strict.validate import excerpt, image_ref_problem

STEP = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
_WHEEL_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")  # PEP 508's name
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
_DEB_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]{1,127}(?::[a-z0-9-]{1,32})?")  # Debian policy 5.6.1, with dpkg's :arch
_DEB_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+:~-]{0,127}")  # Debian policy 5.6.12: [epoch:]upstream[-revision]
_DIGEST = re.compile(r"(?P<repo>[^@]+)@sha256:[0-9a-f]{64}")

TOP_KEYS = ("schema", "spec", "images")
IMAGE_KEYS = ("torch", "cuda", "variant", "inputs", "base", "pip", "apt")
_REQUIRED = ("torch", "cuda", "variant", "inputs", "base")
BASE_KEYS = ("ref", "id", "digest")
WHEEL_KEYS = ("name", "version", "sha256")


def known(value: object, where: str, keys: tuple[str, ...], required: tuple[str, ...] = ()) -> Mapping:
    """``value`` as a mapping of only ``keys`` (a misspelt or added one is refused, not ignored), ``required`` among them."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping, not {excerpt(value)}")
    for key in value:
        if key not in keys:
            raise ValueError(f"{where}: unknown key {excerpt(key)}{did_you_mean(str(key), keys)}")
    for key in required:
        if key not in value:
            raise ValueError(f"{where}: {key} is missing")
    return value


def word(value: object, grammar: re.Pattern[str], where: str, what: str) -> str:
    """One word of its own grammar, matched whole (a trailing line break is not let through)."""
    if not isinstance(value, str) or not grammar.fullmatch(value):
        raise ValueError(f"{where}: {excerpt(value)} is not {what}")
    return value


def step(name: object, where: str = "a step") -> str:
    """A step's name, which names a file in the build context (pip-STEP.txt): a plain word, never a path."""
    if not isinstance(name, str) or not STEP.fullmatch(name):
        raise ValueError(f"{where} named {excerpt(name)} is not a plain name (letters, digits, - and _)")
    return name


def image_key(key: object) -> str:
    return word(key, KEY, "images", "an image's key (its tag and variant)")


def image_fields(value: object, where: str, input_keys: tuple[str, ...]) -> tuple:
    """(torch, cuda, variant, inputs, base, pip, apt) of one locked image, each field checked."""
    value = known(value, where, IMAGE_KEYS, _REQUIRED)
    torch = word(value["torch"], _VERSION, f"{where}.torch", "a torch version")
    cuda = word(value["cuda"], _VERSION, f"{where}.cuda", "a CUDA version or cpu")
    variant = word(value["variant"], STEP, f"{where}.variant", "a variant's name")
    inputs = _inputs(value["inputs"], f"{where}.inputs", input_keys)
    base = _base(value["base"], f"{where}.base", inputs.get("base"))
    pip = {step(name, f"{where}.pip: a step"): _wheels(items, f"{where}.pip.{name}")
           for name, items in _mapping(value.get("pip") or {}, f"{where}.pip").items()}
    apt = {step(name, f"{where}.apt: a step"): _packages(items, f"{where}.apt.{name}")
           for name, items in _mapping(value.get("apt") or {}, f"{where}.apt").items()}
    return torch, cuda, variant, inputs, base, pip, apt


def _inputs(value: object, where: str, keys: tuple[str, ...]) -> dict[str, object]:
    """What the spec asked for when locked: compared with what it asks now (text, a list of text, or nothing)."""
    inputs = dict(known(value, where, keys))
    for key, item in inputs.items():
        items = item if isinstance(item, list) else [item]
        if not all(isinstance(i, str) for i in items) and item is not None:
            raise ValueError(f"{where}.{key}: {excerpt(item)} is not text or a list of text")
    return inputs


def _base(value: object, where: str, asked: object) -> dict[str, str]:
    """The base the lock was built on: the spec's own (as its inputs name it), by id and, from a registry, by digest."""
    base = known(value, where, BASE_KEYS, ("ref", "id"))
    ref = base["ref"]
    if not isinstance(ref, str) or image_ref_problem(ref):
        raise ValueError(f"{where}.ref: {excerpt(ref)} is not an image reference")
    if asked is not None and ref != asked:
        raise ValueError(f"{where}.ref {excerpt(ref)} is not the base the lock's inputs name ({excerpt(asked)})")
    image_id = word(base["id"], _IMAGE_ID, f"{where}.id", "an image id (sha256: and 64 hex digits)")
    digest = base.get("digest") or ""
    if digest:
        found = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
        if found is None or image_ref_problem(digest):
            raise ValueError(f"{where}.digest: {excerpt(digest)} is not a registry digest (NAME@sha256: and 64 hex digits)")
        if repository(found["repo"]) != repository(ref):
            raise ValueError(f"{where}.digest {excerpt(digest)} is not of the base {excerpt(ref)} (another repository or registry)")
    return {"ref": ref, "id": image_id, "digest": digest}


def repository(ref: str) -> str:
    """An image reference's repository, as Docker names it: no tag or digest, Docker Hub's docker.io/library/ left out."""
    name = ref.partition("@")[0]
    head, _, last = name.rpartition("/")
    name = f"{head}/{last.partition(':')[0]}" if head else last.partition(":")[0]
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        name = name.removeprefix(prefix)
    return name.removeprefix("library/")


def _wheels(items: object, where: str) -> tuple[dict, ...]:
    if not isinstance(items, list):
        raise ValueError(f"{where} must be a list of wheels, not {excerpt(items)}")
    wheels = []
    for i, item in enumerate(items):
        wheel = known(item, f"{where}[{i}]", WHEEL_KEYS, WHEEL_KEYS)
        wheels.append({"name": word(wheel["name"], _WHEEL_NAME, f"{where}[{i}].name", "a wheel name"),
                       "version": word(wheel["version"], _VERSION, f"{where}[{i}].version", "a wheel version"),
                       "sha256": word(wheel["sha256"], _SHA256, f"{where}[{i}].sha256", "a sha256 (64 hex digits)")})
    return tuple(wheels)


def _mapping(value: object, where: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping, not {excerpt(value)}")
    return value


def _packages(items: object, where: str) -> dict[str, str]:
    return {word(name, _DEB_NAME, where, "a Debian package name"):
            word(version, _DEB_VERSION, f"{where}.{name}", "a Debian package version") for name, version in _mapping(items, where).items()}
