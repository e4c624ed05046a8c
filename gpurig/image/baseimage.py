"""The base image a build starts FROM: found locally, pulled from a registry, or bootstrapped with debootstrap.

Sites without registry access still get a base: the spec's ``base.bootstrap``
suite is debootstrapped (``--variant=minbase``) from a Debian/Ubuntu mirror and
``docker import``-ed. The result is tagged under the name the Dockerfile's FROM
uses (so the rendered Dockerfile is the same online and offline) and also as
``gpurig-base:<suite>-minbase``; it carries the label ``io.gpurig.bootstrap``
so that every later build says it is a local stand-in, not the registry's image.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpurig.connect.engine import Engine, EngineError
from gpurig.errors import DockerError, last_line
from gpurig.image.quoting import dq
from gpurig.image.spec import Bootstrap
from gpurig.process import stop

BOOTSTRAP_LABEL = "io.gpurig.bootstrap"
PULL_TIMEOUT_S = 180
DEBOOTSTRAP_TIMEOUT_S = 1800

# Like Debian's -slim images: no man pages, docs or translations from later apt installs.
DPKG_EXCLUDES = """\
# gpurig bootstrap: keep the image slim, as Debian's -slim images do
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
"""


@dataclass(frozen=True)
class BaseImage:
    """The base a build uses, and how it was obtained (local | pulled | bootstrapped)."""

    ref: str
    source: str
    image_id: str
    digests: tuple[str, ...]
    bootstrap: str = ""

    @property
    def stand_in(self) -> bool:
        """True when the image under ``ref`` was made by debootstrap here, not pulled from a registry."""
        return bool(self.bootstrap)

    @property
    def origin(self) -> str:
        """Where the image itself comes from, the same on every build (bootstrapped | pulled | local).

        ``source`` says what this run did (found it, pulled it, made it); the
        images built on it are labelled with ``origin``, so that a rebuild on
        an unchanged base keeps its image id.
        """
        if self.stand_in:
            return "bootstrapped"
        return "pulled" if self.digests else "local"

    def describe(self) -> str:
        if self.stand_in and self.source == "bootstrapped":
            return (
                f"base {self.ref}: no registry answered; bootstrapped it here ({self.bootstrap}) "
                f"and tagged it {self.ref} as a local stand-in, not the registry's image"
            )
        if self.stand_in:
            return (
                f"base {self.ref}: local stand-in bootstrapped earlier ({self.bootstrap}); "
                f"`docker rmi {self.ref}` to use the registry's image instead"
            )
        if self.source == "pulled":
            return f"base {self.ref}: pulled from its registry ({self.digests[0] if self.digests else self.image_id})"
        return f"base {self.ref}: found in the local image store ({self.digests[0] if self.digests else self.image_id})"

    def as_dict(self) -> dict:
        return {
            "ref": self.ref,
            "source": self.source,
            "origin": self.origin,
            "id": self.image_id,
            "digests": list(self.digests),
            "bootstrap": self.bootstrap or None,
        }


def bootstrap_tag(bootstrap: Bootstrap) -> str:
    """The gpurig-owned name a bootstrapped base also gets."""
    return f"gpurig-base:{bootstrap.suite}-minbase"


def bootstrap_description(bootstrap: Bootstrap) -> str:
    return f"debootstrap --variant=minbase {bootstrap.suite} {bootstrap.mirror}"


def inspect_image(engine: Engine, ref: str) -> BaseImage | None:
    """What the local store holds under ``ref``, or None."""
    info = engine.image(ref)
    if info is None:
        return None
    return BaseImage(ref=ref, source="local", image_id=info.id, digests=info.digests, bootstrap=info.labels.get(BOOTSTRAP_LABEL, ""))


class _PullRefused(Exception):
    """The registry's error, streamed back in the middle of a pull."""


def pull(engine: Engine, ref: str, timeout: float = PULL_TIMEOUT_S) -> str:
    """Pull ``ref`` with the user's registry logins; '' on success, else the registry's reason in one line.

    Stopped (the engine stops the pull with it) after ``timeout`` seconds, or on Ctrl-C.
    """
    def on_event(event: dict) -> None:
        if "error" in event:
            raise _PullRefused(last_line(str(event.get("error") or (event.get("errorDetail") or {}).get("message")), default="refused"))

    try:
        engine.pull(ref, on_event, timeout=timeout)
    except _PullRefused as refused:
        return str(refused)
    except EngineError as err:
        return err.reason
    return ""


def ensure_base(
    engine: Engine,
    ref: str,
    bootstrap: Bootstrap | None,
    labels: dict[str, str] | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> BaseImage:
    """The base image ``ref``: from the local store, else pulled, else bootstrapped (when the spec allows).

    ``say`` hears one line per decision (what was found, why it bootstraps).
    """
    found = inspect_image(engine, ref)
    if found:
        say(found.describe())
        return found
    reason = pull(engine, ref)
    if not reason:
        pulled = inspect_image(engine, ref)
        if pulled:
            result = BaseImage(ref, "pulled", pulled.image_id, pulled.digests, pulled.bootstrap)
            say(result.describe())
            return result
        reason = "pulled, yet not in the local store afterwards"
    if bootstrap is None:
        raise DockerError(
            f"base image {ref} is not in the local image store and could not be pulled ({reason})",
            "pull it where a registry answers and `docker load` it here, or set base.bootstrap in the spec",
        )
    say(f"base {ref}: not in the local store and the pull failed ({reason}); bootstrapping {bootstrap.suite}")
    made = bootstrap_base(engine, ref, bootstrap, labels or {})
    say(made.describe())
    return made


def bootstrap_base(engine: Engine, ref: str, bootstrap: Bootstrap, labels: dict[str, str]) -> BaseImage:
    """debootstrap a minbase rootfs of the suite and ``docker import`` it as ``ref`` and gpurig-base:<suite>-minbase."""
    debootstrap = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")
    if not debootstrap:
        raise DockerError(
            f"base image {ref} is unavailable and debootstrap is not installed to make it",
            "apt-get install debootstrap (or load the base image with `docker load`)",
        )
    if os.geteuid() != 0:
        raise DockerError(f"bootstrapping base {ref} needs root (debootstrap)", "run the build as root once, or `docker load` the base")
    described = bootstrap_description(bootstrap)
    work = Path(tempfile.mkdtemp(prefix="gpurig-rootfs-", dir="/var/tmp"))
    rootfs = work / "rootfs"
    try:
        code, output = _run_group([debootstrap, "--variant=minbase", bootstrap.suite, str(rootfs), bootstrap.mirror])
        if code != 0:
            raise DockerError(
                f"{described} failed: {last_line(output, default='no output')}",
                "check that the mirror answers (plain HTTP works without a CA) or set base.bootstrap.mirror",
            )
        _slim_down(rootfs, bootstrap)
        changes = [f"LABEL {BOOTSTRAP_LABEL}={dq(described)}"]
        changes += [f"LABEL {key}={dq(value)}" for key, value in labels.items()]
        changes += ['CMD ["bash"]', "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        image_id = _import(engine, rootfs, ref, changes)
        try:
            engine.tag(image_id, bootstrap_tag(bootstrap))
        except EngineError as err:
            raise DockerError(f"cannot tag the bootstrapped {ref} as {bootstrap_tag(bootstrap)}: {err.reason}", "check the daemon log") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BaseImage(ref, "bootstrapped", image_id, (), described)


def _run_group(argv: list[str]) -> tuple[int, str]:
    """(exit code, output) of a command run in a process group of its own, which goes whole when gpurig is
    interrupted or the command overruns: debootstrap's own children (dpkg, wget) must not outlive it."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=DEBOOTSTRAP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        output, code = f"no end within {DEBOOTSTRAP_TIMEOUT_S} s", -1
    else:
        return proc.returncode, output
    finally:
        stop(proc)  # its whole group when it overran or gpurig was interrupted; else it is only closed
    return code, output


def _slim_down(rootfs: Path, bootstrap: Bootstrap) -> None:
    """Trim what an image does not need and give apt the suite's updates, as the registry's image has."""
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/man", "usr/share/info", "usr/share/locale"):
        target = rootfs / sub
        if target.is_dir():
            for item in target.iterdir():
                if item.is_dir() and item.name != "partial":
                    shutil.rmtree(item, ignore_errors=True)
                elif item.is_file() and item.name not in ("lock", "locale.alias"):
                    item.unlink()
    for log in (rootfs / "var/log").glob("*.log"):
        log.unlink()
    shutil.rmtree(rootfs / "debootstrap", ignore_errors=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d/gpurig-slim").write_text(DPKG_EXCLUDES)
    sources = rootfs / "etc/apt/sources.list"
    if "debian" in bootstrap.mirror and sources.is_file():
        lines = sources.read_text().rstrip("\n").splitlines()
        lines.append(f"deb {bootstrap.mirror} {bootstrap.suite}-updates main")
        if bootstrap.mirror.rstrip("/").endswith("deb.debian.org/debian"):
            lines.append(f"deb http://deb.debian.org/debian-security {bootstrap.suite}-security main")
        sources.write_text("\n".join(lines) + "\n")
    # each container gets its own machine id, as in the registry's images
    machine_id = rootfs / "etc/machine-id"
    if machine_id.exists():
        machine_id.write_text("")


def _import(engine: Engine, rootfs: Path, ref: str, changes: list[str]) -> str:
    """``docker import`` of the rootfs as ``ref``, its tar streamed from ``tar`` to the engine; the image id.

    A tar that fails stops the upload before its end, so that the engine makes no image of half a rootfs;
    on every way out (Ctrl-C too) the tar is stopped.
    """
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "--exclude=./dev/*", "--exclude=./proc/*",
         "--exclude=./sys/*", "-c", "."],
        stdout=subprocess.PIPE,  # its complaints go where gpurig's do, as they did under `docker import`
    )

    def chunks() -> Iterator[bytes]:
        assert tar.stdout is not None
        while chunk := tar.stdout.read(1 << 20):
            yield chunk
        if tar.wait() != 0:
            raise DockerError(f"docker import of the bootstrapped {ref} failed: its tar exited {tar.returncode}",
                              "read tar's message above; check the rootfs under /var/tmp")

    try:
        return engine.import_image(chunks(), ref, changes, timeout=DEBOOTSTRAP_TIMEOUT_S)
    except EngineError as err:
        raise DockerError(f"docker import of the bootstrapped {ref} failed: {err.reason[:300]}", "check the daemon log") from None
    finally:
        if tar.stdout:
            tar.stdout.close()
        stop(tar)
