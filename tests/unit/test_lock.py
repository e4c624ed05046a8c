"""Locked builds without an engine: what a build resolved becomes a lock file, a locked render installs exactly it,
and a lock the spec no longer matches is refused with one line saying to re-lock."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpurig.connect.engine import EngineError
from gpurig.connect.engineinfo import image_info
from gpurig.errors import DockerError, RenderError
from gpurig.image import lock
from gpurig.image.build import make_report
from gpurig.image.dockercli import DockerClient
from gpurig.image.imageprobe import parse_freeze
from gpurig.image.lint import failing
from gpurig.image.lint import lint as hadolint
from gpurig.image.render import render
from gpurig.image.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
SHA = {name: hashlib.sha256(name.encode()).hexdigest() for name in ("torch", "numpy", "sympy")}  # real hex: the lock refuses other text

# What pip 23.0.1 (Debian 12's venv) writes with --report: `hash` only for a local wheelhouse file, `hashes` too for
# an index's; metadata trimmed to the fields read.
PIP_REPORT = {
    "version": "1",
    "pip_version": "23.0.1",
    "install": [
        {"metadata": {"name": "torch", "version": "2.13.0+cpu"},
         "download_info": {"url": "file:///wheelhouse/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                           "archive_info": {"hash": f"sha256={SHA['torch']}"}}},
        {"metadata": {"name": "numpy", "version": "2.4.6"},
         "download_info": {"url": "https://user:secret@pypi.example.com/numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl",
                           "archive_info": {"hash": f"sha256={SHA['numpy']}", "hashes": {"sha256": SHA["numpy"]}}}},
        {"metadata": {"name": "sympy", "version": "1.14.0"},
         "download_info": {"url": "https://pypi.example.com/sympy-1.14.0-py3-none-any.whl",
                           "archive_info": {"hashes": {"sha256": SHA["sympy"]}}}},
    ],
}
BASE_DPKG = "apt=2.6.1\nlibc6=2.36-9+deb12u7\n"
AFTER_SYSTEM = BASE_DPKG.replace("u7", "u9") + "python3=3.11.2-1+b1\ntini=0.19.0-1\n"


@pytest.fixture
def spec(tmp_path):
    """A copy of the shipped spec in a folder of its own, so its lock file lands there."""
    path = tmp_path / "images" / "pytorch.yaml"
    path.parent.mkdir()
    shutil.copy(REPO / "images" / "pytorch.yaml", path)
    return load_spec(path)


def cpu(spec):
    return next(e for e in spec.matrix if e.is_cpu)


def resolved(spec, digest: str = "") -> lock.LockedImage:
    """The CPU slim image as the files its build leaves in /opt/gpurig/lock read."""
    files = lock.split_files(f"--- dpkg-before-system.txt\n{BASE_DPKG}--- pip-torch.json\n{json.dumps(PIP_REPORT)}\n")
    pip, apt = lock.resolution(files, parse_freeze("--- dpkg\n" + AFTER_SYSTEM)[1])
    context = render(spec, cpu(spec), "slim", REPO, spec.path.parent.parent / "unlocked")
    base = {"ref": "debian:bookworm-slim", "id": "sha256:" + "b" * 64, "digest": digest}
    return lock.LockedImage(cpu(spec).torch, "cpu", "slim", context.lock_inputs, base, pip, apt)


def locked_render(spec, out: Path, digest: str = ""):
    path = lock.lock_path(spec.path)
    lock.save(path, spec, {lock.image_key(cpu(spec).tag, "slim"): resolved(spec, digest)})
    return render(spec, cpu(spec), "slim", REPO, out, lock.Locks.of(spec))


def test_what_each_step_installed_becomes_a_lock_of_hashes_and_versions(spec):
    image = resolved(spec)
    assert image.requirements("torch").splitlines() == [
        f"numpy==2.4.6 --hash=sha256:{SHA['numpy']}",
        f"sympy==1.14.0 --hash=sha256:{SHA['sympy']}",
        f"torch==2.13.0+cpu --hash=sha256:{SHA['torch']}",
    ]
    # only what the step changed: a new package, or one it upgraded; the base's own stay out
    assert image.apt == {"system": {"libc6": "2.36-9+deb12u9", "python3": "3.11.2-1+b1", "tini": "0.19.0-1"}}


def test_the_lock_file_round_trips_without_any_url_and_beside_the_spec(spec):
    path = lock.lock_path(spec.path)
    image = resolved(spec)
    lock.save(path, spec, {"2.13.0-cpu-slim": image})
    assert path == spec.path.parent / "pytorch.yaml.lock" and [p.name for p in path.parent.iterdir()] == ["pytorch.yaml", path.name]
    assert lock.load(path) == {"2.13.0-cpu-slim": image}
    text = path.read_text()
    assert text.startswith("# Written by `gpurig build --lock`") and "://" not in text and "secret" not in text


def test_the_report_an_image_keeps_is_cut_to_what_a_lock_reads(spec, tmp_path):
    """The image keeps each wheel's name, version and hashes: not pip's whole metadata, nor a URL naming an index's user."""
    dockerfile = render(spec, cpu(spec), "slim", REPO, tmp_path / "contexts").dockerfile.read_text()
    words = [shlex.split(line) for line in dockerfile.splitlines() if "python3 -c" in line and "json.dump" in line]
    trims = [w[w.index("-c") + 1] for w in words]
    assert len(trims) == 1  # slim has one pip step
    full = {**PIP_REPORT, "environment": {"platform_release": "6.1"},
            "install": [{**item, "is_direct": False, "requested": True,
                         "metadata": {**item["metadata"], "description": "x" * 100_000, "requires_dist": ["sympy"]}}
                        for item in PIP_REPORT["install"]]}
    report = tmp_path / "pip-torch.json"
    report.write_text(json.dumps(full))
    subprocess.run([sys.executable, "-c", trims[0], str(report)], check=True)
    kept = report.read_text()
    assert lock.wheels_of(kept) == lock.wheels_of(json.dumps(PIP_REPORT))
    assert len(kept) < 1000 and "://" not in kept and "secret" not in kept and "description" not in kept


def test_a_locked_render_installs_exactly_the_lock_and_stays_hadolint_clean(spec, tmp_path):
    context = locked_render(spec, tmp_path / "contexts")
    text = re.sub(r"\\\n", " ", context.dockerfile.read_text())
    pip = next(line for line in text.splitlines() if "pip install" in line)
    assert "--require-hashes --no-deps -r /run/gpurig-lock/pip-torch.txt" in pip and "torch==" not in pip
    assert "--mount=type=bind,source=lock,target=/run/gpurig-lock" in pip
    assert (context.path / "lock" / "pip-torch.txt").read_text() == resolved(spec).requirements("torch")
    apt = next(line for line in text.splitlines() if "apt-get install" in line)
    assert apt.endswith("install -y --no-install-recommends libc6=2.36-9+deb12u9 python3=3.11.2-1+b1 tini=0.19.0-1")
    assert "FROM debian:bookworm-slim\n" in text  # a local base: its id is checked before the build
    assert context.lock_file == lock.lock_path(spec.path)
    assert json.loads((context.path / "gpurig-context.json").read_text())["locked"] is True
    assert failing(hadolint(context.dockerfile, REPO / ".hadolint.yaml")) == []


def test_a_base_from_a_registry_is_pinned_by_its_digest(spec, tmp_path):
    digest = "debian@sha256:" + "d" * 64
    context = locked_render(spec, tmp_path / "contexts", digest)
    assert context.dockerfile.read_text().count(f"FROM {digest}\n") == 1


def test_the_build_report_says_whether_the_image_was_locked_and_from_which_file(spec, tmp_path):
    client = DockerClient("/usr/bin/docker", "20.10.24", False)
    image = image_info({"Id": "sha256:" + "a" * 64, "Size": 1, "RootFS": {"Layers": []}})
    from gpurig.image.build import ProgressParser

    def report(context) -> dict:
        return make_report(context, client, image, {}, ProgressParser(), 1.0, [], {}, None)

    locked = report(locked_render(spec, tmp_path / "a"))
    assert locked["locked"] is True and locked["lock_file"] == str(lock.lock_path(spec.path))
    plain = report(render(spec, spec.default, "slim", REPO, tmp_path / "b", lock.Locks.of(spec)))
    assert plain["locked"] is False and plain["lock_file"] is None


def test_a_lock_the_spec_no_longer_matches_is_refused_naming_what_changed(spec, tmp_path):
    lock.save(lock.lock_path(spec.path), spec, {"2.13.0-cpu-slim": resolved(spec)})
    changed = spec.path.read_text().replace("pip: [gpustat]", "pip: [gpustat]\n  slim: {apt: [curl]}").replace("  slim: {}", "")
    spec.path.write_text(changed)
    out = tmp_path / "contexts"
    with pytest.raises(lock.LockError) as err:
        render(load_spec(spec.path), cpu(spec), "slim", REPO, out, lock.Locks.of(spec))
    assert str(err.value) == (f"{lock.lock_path(spec.path)}: 2.13.0-cpu-slim was locked for variant_apt (none), pytorch.yaml now asks "
                              "for curl; fix: `invoke build --lock` to re-lock")
    assert not out.exists() or not any(out.rglob("Dockerfile"))  # nothing half-written


def test_a_lock_of_a_torch_the_matrix_no_longer_has_is_refused_not_ignored(spec, tmp_path):
    lock.save(lock.lock_path(spec.path), spec, {"2.13.0-cpu-slim": resolved(spec)})
    spec.path.write_text(spec.path.read_text().replace('torch: "2.13.0"', 'torch: "2.13.1"'))
    moved = load_spec(spec.path)
    with pytest.raises(lock.LockError, match=r"locks torch 2\.13\.0 \(cpu, slim\), but pytorch\.yaml's matrix now has torch 2\.13\.1; "
                                             r"fix: `invoke build --lock` to re-lock$"):
        render(moved, cpu(moved), "slim", REPO, tmp_path / "contexts", lock.Locks.of(moved))
    # re-locking drops what the spec no longer has
    lock.save(lock.lock_path(spec.path), moved, {})
    assert lock.load(lock.lock_path(spec.path)) == {}


def test_an_unlocked_entry_builds_as_before(spec, tmp_path):
    lock.save(lock.lock_path(spec.path), spec, {"2.13.0-cpu-slim": resolved(spec)})
    context = render(spec, spec.default, "slim", REPO, tmp_path / "contexts", lock.Locks.of(spec))
    assert context.lock is None and "--require-hashes" not in context.dockerfile.read_text()
    assert not (context.path / "lock").exists()


@pytest.mark.parametrize("text", ["images: [", "schema: 1\nimages: {x: {torch: 1}}\n", "just text\n"])
def test_an_unreadable_lock_is_one_line_saying_to_re_lock(spec, text):
    path = lock.lock_path(spec.path)
    path.write_text(text)
    with pytest.raises(lock.LockError) as err:
        lock.Locks.of(spec)
    message = str(err.value)
    assert message.startswith(f"cannot read the lock file {path}: ") and message.endswith("re-lock") and "\n" not in message


def test_a_wheel_pip_cannot_hash_is_refused_rather_than_locked_loosely():
    report = {"install": [{"metadata": {"name": "mine", "version": "0.1"}, "download_info": {"url": "file:///src", "dir_info": {}}}]}
    with pytest.raises(DockerError, match=r"^pip installed mine 0\.1 from a directory or VCS, which has no hash to lock; fix: "):
        lock.wheels_of(json.dumps(report))


class Store:
    """The engine's image store as check_base asks it: inspect and pull (the registry refuses every pull)."""

    def __init__(self, images: dict[str, str]) -> None:
        self.images, self.pulled = images, []

    def image(self, ref: str):
        return image_info({"Id": self.images[ref]}) if ref in self.images else None

    def pull(self, ref: str, on_event, timeout: float | None = None) -> None:
        self.pulled.append(ref)
        raise EngineError(f"the Docker engine refused to pull {ref}: manifest unknown", reason="manifest unknown")


def test_a_build_refuses_a_base_other_than_the_locked_one(spec, tmp_path):
    image = resolved(spec)
    lock.check_base(Store({"debian:bookworm-slim": image.base["id"]}), image, Path("x.lock"))  # type: ignore[arg-type]
    with pytest.raises(DockerError) as err:
        lock.check_base(Store({"debian:bookworm-slim": "sha256:" + "e" * 64}), image, Path("x.lock"))  # type: ignore[arg-type]
    assert str(err.value) == (f"the locked base debian:bookworm-slim ({image.base['id'][:19]}) of x.lock is not available: the local "
                              "store holds sha256:eeeeeeeeeeee under that name; fix: `docker load` the locked base, or run "
                              "`invoke build --lock` to re-lock on this one")
    pinned = resolved(spec, "debian@sha256:" + "d" * 64)
    store = Store({})
    with pytest.raises(DockerError, match=r"^the locked base debian@sha256:d{64} of x.lock is not available \(manifest unknown\)"):
        lock.check_base(store, pinned, Path("x.lock"))  # type: ignore[arg-type]
    assert store.pulled == [pinned.base["digest"]]


def test_a_project_whose_templates_predate_locks_is_refused_rather_than_reported_locked(spec, tmp_path):
    project = tmp_path / "old"
    shutil.copytree(REPO / "templates", project / "templates")
    shutil.copytree(REPO / "checks", project / "checks")
    pip = project / "templates" / "_pip.j2"  # the macro as it was before locked builds: no lock mount, no --require-hashes
    pip.write_text(re.sub(r"\{%- if lock %\}.*?\{%- endif %\}", "", pip.read_text(), flags=re.S).replace(
        " --require-hashes --no-deps -r {{ (\"/run/gpurig-lock/pip-\" ~ step ~ \".txt\") | sh }}", ""))
    assert "gpurig-lock" not in pip.read_text()
    lock.save(lock.lock_path(spec.path), spec, {lock.image_key(cpu(spec).tag, "slim"): resolved(spec)})
    with pytest.raises(RenderError, match="does not install from a lock") as err:
        render(spec, cpu(spec), "slim", project, tmp_path / "contexts", lock.Locks.of(spec))
    assert "gpurig init" in err.value.fix
    assert not (tmp_path / "contexts" / spec.name / f"{cpu(spec).tag}-slim").exists()  # nothing half-written


def test_an_image_whose_pip_wrote_no_report_cannot_be_locked():
    files = lock.split_files(f"--- dpkg-before-system.txt\n{BASE_DPKG}")  # what a venv pip older than 22.2 leaves
    with pytest.raises(DockerError, match="pip 22.2 or newer"):
        lock.resolution(files, parse_freeze("--- dpkg\n" + AFTER_SYSTEM)[1])


BASE = "{ref: 'debian:bookworm-slim', id: 'sha256:" + "b" * 64 + "'}"  # the grammar's: the spec's base, by its id


def _bomb() -> str:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{k}: &a{k} [*a{k - 1}, *a{k - 1}, *a{k - 1}, *a{k - 1}, *a{k - 1}, *a{k - 1}, *a{k - 1}, *a{k - 1}, *a{k - 1}]"
               for k in range(1, 9)]
    return "\n".join(f"        {line}" for line in levels)


@pytest.mark.parametrize("text, said", [
    # 10 x 9^8 values once expanded: safe_load built them all and render hung
    ("schema: 1\nimages:\n  k:\n    torch: '1'\n    cuda: cpu\n    variant: slim\n    base: " + BASE + "\n    inputs:\n" + _bomb() + "\n",
     "aliases expand to more than"),
    ("schema: 1\nimages:\n  k: {torch: '1', cuda: cpu, variant: slim, base: " + BASE + ", inputs: {}, pip: {'../../x': []}}\n",
     "a step named '../../x' is not a plain name"),
    ("schema: 1\nimages:\n  k: {torch: '1', cuda: cpu, variant: slim, base: " + BASE + ", inputs: {},"
     " pip: {torch: [{name: \"a\\n--index-url http://evil\", version: '1', sha256: x}]}}\n",
     "pip.torch[0].name: 'a\\n--index-url http://evil' is not a wheel name"),
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
])
def test_a_hostile_lock_is_refused_in_one_line(spec, text, said):
    path = lock.lock_path(spec.path)
    path.write_text(text)
    with pytest.raises(lock.LockError) as err:
        lock.Locks.of(spec)
    assert said in str(err.value) and "\n" not in str(err.value) and str(err.value).endswith("re-lock")


@pytest.mark.parametrize("kind", ["fifo", "zero", "sparse"])
def test_a_lock_that_is_no_regular_file_or_huge_is_refused_at_once(spec, kind):
    path = lock.lock_path(spec.path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:
            f.truncate(2**30)  # sparse
    with pytest.raises(lock.LockError, match="is not a regular file|over the 5 MiB limit"):
        lock.Locks.of(spec)


def test_a_step_named_as_a_path_never_reaches_the_context(tmp_path):
    locked = lock.LockedImage("1", "cpu", "slim", {}, {"ref": "r", "id": "i"}, pip={"../escape": ()})
    with pytest.raises(lock.LockError, match="not a plain name"):
        lock.write_context_files(tmp_path / "lock", locked)
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "pip-").exists()
