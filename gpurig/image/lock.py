"""Locked builds: what a build resolved (wheels with their sha256, apt versions, the base's id) kept beside the spec,
so that a later build installs exactly that, or refuses where the spec no longer asks for what was locked.

Every image records its resolution as it is built, in /opt/gpurig/lock (non-secret): each pip step writes pip's
installation report, each apt step the dpkg list it started from. ``build --lock`` reads them back and writes
``<spec>.lock`` (not ``*.yaml``: images/ holds only specs); a build of a locked (entry, variant) renders each pip
step as ``--require-hashes --no-deps -r`` of its own list and each apt step as ``pkg=version``, step by step, so
that the variants of an entry still share their torch layer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpurig.connect.engine import Engine
from gpurig.errors import DockerError, SpecError
from gpurig.files import atomic_write
from gpurig.image import lockgrammar as grammar
from gpurig.image.baseimage import pull
from gpurig.image.imageprobe import parse_freeze, run_probe
from gpurig.strict.validate import printable
from gpurig.strict.yamlio import load_yaml

LOCK_SCHEMA = 1
IN_IMAGE = "/opt/gpurig/lock"  # where each build step leaves what it resolved
IN_CONTEXT = "lock"  # the locked lists in a build context, bind-mounted into the steps that read them
IN_MOUNT = "/run/gpurig-lock"  # where the pip steps of a locked build find them (templates/_pip.j2)
APT_STEPS = ("system", "variant")  # in the Dockerfile's order
RELOCK = "`invoke build --lock` to re-lock"
# The render values a lock depends on (gpurig.image.render): a change to any of them makes it stale.
INPUTS = ("python", "base", "apt_packages", "torch_requirement", "cuda_toolkit_requirement", "variant_apt", "extra_pip")
# Run inside a built image (no value from outside reaches it): every file the build steps left in IN_IMAGE.
READ_SCRIPT = f'cd {IN_IMAGE} && for f in *; do printf "%s\\n" "--- $f"; cat "$f"; done'


class LockError(SpecError):
    """A lock file that cannot be read, or that no longer matches the spec it locks."""


@dataclass(frozen=True)
class LockedImage:
    """One (matrix entry, variant) as a build resolved it."""

    torch: str
    cuda: str
    variant: str
    inputs: Mapping[str, object]  # what the spec asked for: a change to any of it makes the lock stale
    base: Mapping[str, str]  # ref, id, digest ('' when the base came from no registry)
    pip: Mapping[str, tuple[dict, ...]] = field(default_factory=dict)  # step -> [{name, version, sha256}]
    apt: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # step -> {package: version}

    def as_dict(self) -> dict:
        return {"torch": self.torch, "cuda": self.cuda, "variant": self.variant, "inputs": dict(self.inputs),
                "base": dict(self.base), "pip": {k: list(v) for k, v in self.pip.items()},
                "apt": {k: dict(v) for k, v in self.apt.items()}}

    def requirements(self, step: str) -> str:
        """The step's requirements file for `pip install --require-hashes --no-deps -r`."""
        return "".join(f"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}\n" for w in self.pip.get(step, ()))

    def apt_words(self, step: str) -> list[str]:
        return [f"{name}={version}" for name, version in sorted(self.apt.get(step, {}).items())]

    @property
    def from_ref(self) -> str:
        """What the Dockerfile starts FROM: the registry digest where there is one, else the base's name (its id is
        checked before the build, see check_base)."""
        return self.base.get("digest") or self.base["ref"]


def lock_path(spec_path: Path) -> Path:
    """pytorch.yaml -> pytorch.yaml.lock, beside it."""
    return spec_path.with_name(spec_path.name + ".lock")


def image_key(tag: str, variant: str) -> str:
    return f"{tag}-{variant}"


# --- reading and writing the file ---------------------------------------------------


def load(path: Path) -> dict[str, LockedImage]:
    """The lock file's images by key; {} when there is none. Anything unreadable is refused (not silently unlocked)."""
    if not os.path.lexists(path):
        return {}
    try:
        # gpurig's bounded reader and strict loader: an alias bomb in `inputs` was expanded whole by safe_load and hung render
        data = load_yaml(path, error=LockError, what="lock file")
        if not isinstance(data, dict) or data.get("schema") != LOCK_SCHEMA or not isinstance(data.get("images"), dict):
            raise ValueError(f"not a gpurig lock of schema {LOCK_SCHEMA}")
        grammar.known(data, "the file", grammar.TOP_KEYS)
        if "spec" in data:
            grammar.word(data["spec"], grammar.KEY, "spec", "a spec's name")
        return {grammar.image_key(key): _image(value, f"images.{key}") for key, value in data["images"].items()}
    except LockError as err:  # the reader's line, said as every other problem with the file is
        problem = err.problem.removeprefix(f"{path}:").removeprefix(f"lock file {path} ").strip()
        raise LockError(f"cannot read the lock file {path}: {problem}", f"delete it and run {RELOCK}") from None
    except ValueError as err:  # the grammar says every problem as a ValueError; anything else is a bug, not the file
        problem = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise LockError(f"cannot read the lock file {path}: {problem}", f"delete it and run {RELOCK}") from None


def _image(value: object, where: str) -> LockedImage:
    """One locked image, every field of its grammar (gpurig.image.lockgrammar): a lock decides what a build installs."""
    return LockedImage(*grammar.image_fields(value, where, INPUTS))


def save(path: Path, spec, images: Mapping[str, LockedImage]) -> None:
    """Merge ``images`` into the lock file, dropping what the spec no longer has; atomically (a reader sees all or none)."""
    current = {key: image for key, image in load_if_readable(path).items() if _in_spec(spec, image)}
    current.update(images)
    header = f"# Written by `gpurig build --lock` for {spec.path.name}: what each image resolved. Do not edit; re-lock.\n"
    body = {"schema": LOCK_SCHEMA, "spec": spec.name, "images": {k: current[k].as_dict() for k in sorted(current)}}
    atomic_write(path, header + yaml.safe_dump(body, sort_keys=False, default_flow_style=False, width=200))


def load_if_readable(path: Path) -> dict[str, LockedImage]:
    """An unreadable lock is replaced by a re-lock, not merged."""
    try:
        return load(path)
    except LockError:
        return {}


def _in_spec(spec, image: LockedImage) -> bool:
    return image.variant in spec.variants and any((e.torch, e.cuda) == (image.torch, image.cuda) for e in spec.matrix)


# --- matching the spec --------------------------------------------------------------


@dataclass(frozen=True)
class Locks:
    """A spec's lock file, read: its images by key."""

    path: Path
    images: Mapping[str, LockedImage]

    @classmethod
    def of(cls, spec) -> Locks:
        path = lock_path(spec.path)
        return cls(path, load(path))

    def select(self, spec, entry, variant: str, inputs: Mapping[str, object]) -> LockedImage | None:
        """The lock of (entry, variant), checked against what the spec asks now (``inputs_of``); None where nothing locks it."""
        return select(self.images, self.path, spec, entry, variant, inputs)


def select(locks: Mapping[str, LockedImage], path: Path, spec, entry, variant: str, inputs: Mapping[str, object]) -> LockedImage | None:
    """The lock of (entry, variant) if it matches ``inputs``; a LockError where it does not.

    A lock for the same CUDA and variant whose torch the matrix no longer has is stale, not absent: the build
    would silently stop being locked.
    """
    found = locks.get(image_key(entry.tag, variant))
    if found is None:
        for stale in locks.values():
            if (stale.cuda, stale.variant) == (entry.cuda, variant) and not _in_spec(spec, stale):
                raise LockError(f"{path} locks torch {stale.torch} ({stale.cuda}, {variant}), "
                                f"but {spec.path.name}'s matrix now has torch {entry.torch}", RELOCK)
        return None
    if (found.torch, found.cuda, found.variant) != (entry.torch, entry.cuda, variant):
        raise LockError(f"{path}: the lock of torch {found.torch} ({found.cuda}, {found.variant}) is filed under "
                        f"{image_key(entry.tag, variant)}", f"delete it and run {RELOCK}")
    for key in sorted(set(found.inputs) | set(inputs)):
        was, now = found.inputs.get(key), inputs.get(key)
        if _plain(was) != _plain(now):
            raise LockError(f"{path}: {image_key(entry.tag, variant)} was locked for {key} {_show(was)}, "
                            f"{spec.path.name} now asks for {_show(now)}", RELOCK)
    return found


def inputs_of(values: Mapping[str, object]) -> dict[str, object]:
    """What a render asks for that decides what gets installed (not where from: an index or wheelhouse may move)."""
    from gpurig.image.build import redact

    def plain(value: object) -> object:
        return [redact(str(v)) for v in value] if isinstance(value, (list, tuple)) else redact(str(value)) if value else None

    return {key: plain(values[key]) for key in INPUTS}


def _plain(value: object) -> object:
    return json.loads(json.dumps(value))  # tuples and lists alike


def _show(value: object) -> str:
    if not value:
        return "(none)"
    text = printable(" ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value))
    return text if len(text) <= 80 else text[:77] + "..."  # the lock's side is the file's text: one short line


def template_values(locked: LockedImage | None, base: str) -> dict[str, object]:
    """What the templates read about the lock: the FROM, and per step the pinned apt words (pip reads its file)."""
    return {"lock": bool(locked), "base_ref": locked.from_ref if locked else base,
            "apt_lock": {step: locked.apt_words(step) for step in APT_STEPS} if locked else {}}


def write_context_files(folder: Path, locked: LockedImage) -> None:
    """Each pip step's requirements file, into the build context (bind-mounted, never copied into a layer)."""
    folder.mkdir()
    for step in locked.pip:
        try:
            grammar.step(step)  # load() refused any other already; a LockedImage made elsewhere must not write outside ``folder`` either
        except ValueError as err:
            raise LockError(f"cannot write the locked lists: {err}", f"run {RELOCK}") from None
        (folder / f"pip-{step}.txt").write_text(locked.requirements(step))


def check_base(engine: Engine, locked: LockedImage, lock_file: Path) -> None:
    """The locked base must be the one the build will use: by digest (pulled where missing), or by id under its name."""
    ref, image_id, digest = locked.base["ref"], locked.base["id"], locked.base.get("digest", "")
    if digest:
        reason = "" if engine.image(digest) else pull(engine, digest)
        if reason or engine.image(digest) is None:
            raise DockerError(f"the locked base {digest} of {lock_file} is not available ({reason or 'not in the local store'})",
                              f"pull or `docker load` it, or run {RELOCK} on today's base")
        return
    found = engine.image(ref)
    if found is None or found.id != image_id:
        now = f"the local store holds {found.id[:19]} under that name" if found else "it is not in the local store"
        raise DockerError(f"the locked base {ref} ({image_id[:19]}) of {lock_file} is not available: {now}",
                          f"`docker load` the locked base, or run {RELOCK} on this one")


# --- reading what a build resolved --------------------------------------------------


def read_resolution(engine: Engine, image_id: str, labels: dict[str, str]) -> dict[str, str]:
    """The files the build steps left in IN_IMAGE, by name; the probe container has no network."""
    ended = run_probe(engine, image_id, READ_SCRIPT, labels)
    if ended.code != 0:
        raise DockerError(f"cannot read what {image_id[:19]} resolved from {IN_IMAGE}: {ended.stderr.strip()[:200]}",
                          "build it again with this gpurig's templates (older images do not record it)")
    return split_files(ended.stdout)


def split_files(text: str) -> dict[str, str]:
    files: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("--- "):
            current = files.setdefault(line[4:], [])
        else:
            current.append(line)
    return {name: "\n".join(lines) + "\n" for name, lines in files.items()}


def wheels_of(report_text: str) -> tuple[dict, ...]:
    """{name, version, sha256} of each distribution a pip step installed, from its --report (pip >= 22.2)."""
    wheels = []
    for item in json.loads(report_text).get("install", []):
        archive = (item.get("download_info") or {}).get("archive_info")
        sha256 = ((archive or {}).get("hashes") or {}).get("sha256") or (archive or {}).get("hash", "").partition("sha256=")[2]
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if not sha256:
            raise DockerError(f"pip installed {name} {version} from a directory or VCS, which has no hash to lock",
                              "install it from a wheel (build.find_links or an index) to lock the image")
        wheels.append({"name": name, "version": version, "sha256": sha256})
    return tuple(sorted(wheels, key=lambda w: w["name"].lower()))


def apt_steps(files: Mapping[str, str], final: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """{step: {package: version}} each apt step installed or changed: the dpkg list before it against the one after
    (the next step's before, or the finished image's)."""
    befores = [(step, parse_freeze("--- dpkg\n" + files[f"dpkg-before-{step}.txt"])[1])
               for step in APT_STEPS if f"dpkg-before-{step}.txt" in files]
    steps = {}
    for i, (step, before) in enumerate(befores):
        after = befores[i + 1][1] if i + 1 < len(befores) else final
        steps[step] = {name: version for name, version in sorted(after.items()) if before.get(name) != version}
    return steps


def resolution(files: Mapping[str, str], final_dpkg: Mapping[str, str]) -> tuple[dict, dict]:
    """(pip by step, apt by step) from the files of IN_IMAGE; a DockerError where pip wrote no report (older than 22.2)."""
    if "pip-torch.json" not in files:
        raise DockerError("the image's pip wrote no installation report (pip --report needs pip 22.2 or newer)",
                          "lock images on a base whose python3-venv brings pip 22.2 or newer (Debian 12, Ubuntu 24.04)")
    pip = {name[4:-5]: wheels_of(text) for name, text in sorted(files.items()) if name.startswith("pip-") and name.endswith(".json")}
    return pip, apt_steps(files, final_dpkg)


def base_of(base) -> dict[str, str]:
    """A BaseImage as the lock keeps it: its name, id and registry digest."""
    return {"ref": base.ref, "id": base.image_id, "digest": base.digests[0] if base.digests else ""}
