"""BuildKit builds of rendered contexts: the build command, its progress, the versions inside, push, build reports.

``docker build`` runs through the docker CLI (``DockerClient``); everything
around it (inspect, the probes inside the image, push, listing) goes through
this machine's ``Engine``."""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpurig.connect.engine import Engine, EngineError
from gpurig.connect.engineinfo import ImageInfo
from gpurig.errors import DockerError
from gpurig.files import atomic_write, to_json
from gpurig.image.dockercli import DockerClient
from gpurig.image.render import PROJECT_ID_LABEL, PROJECT_LABEL, BuildContext
from gpurig.strict.reader import load_json

REPORT_SCHEMA = 1
REPORT_LIMIT = 16 * 2**20  # a report with its freeze list and promotions is some KiB; a bigger file is not one of ours
# How long one request to this machine's engine about its store (inspect, tag, list) may wait: longer, the daemon is unwell.
STORE_TIMEOUT_S = 120
PUSH_TIMEOUT_S = 3600
_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s:]+(?::[^/@\s]*)?@", re.I)


def redact(text: str) -> str:
    """URLs lose their user:password part (a private index URL must not reach a log or report)."""
    return _CREDENTIALS.sub(r"\g<scheme>***@", text)


def refuse_credentials(settings) -> None:
    """A user:password in an index, find-links or mirror URL would be written into the image's history: refuse it."""
    urls = [settings.pip_index, *settings.pip_extra_index, *settings.find_links, settings.torch_index, settings.apt_mirror]
    for url in urls:
        if url and _CREDENTIALS.search(url):
            raise DockerError(
                f"the build settings name a URL with a user and password ({redact(url)}); "
                "RUN lines are kept in the image's history",
                "drop the credentials from the spec and let the index trust the build host's network, or use a local mirror",
            )


# --- the CA bundle ----------------------------------------------------------------


def pip_config_cert() -> str:
    """The `cert` setting of the host's pip configuration, if any."""
    for python in ("python3", "pip3"):
        exe = shutil.which(python)
        if not exe:
            continue
        argv = [exe, "-m", "pip", "config", "list"] if python == "python3" else [exe, "config", "list"]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        for line in out.splitlines():
            key, _, value = line.partition("=")
            if key.endswith(".cert") and value:
                return value.strip().strip("'\"")
        return ""
    return ""


def resolve_ca_bundle(setting: str, env: Mapping[str, str] | None = None, pip_cert: Callable[[], str] = pip_config_cert) -> Path | None:
    """'none' -> None; a path -> that file; 'auto' -> the bundle the host's pip uses (PIP_CERT, SSL_CERT_FILE, pip config)."""
    environ = os.environ if env is None else env
    if setting == "none":
        return None
    if setting != "auto":
        path = Path(os.path.expanduser(setting))
        if not path.is_file():
            raise DockerError(f"build.ca_bundle names {setting}, which is not a file", "fix the path, or write auto or none")
        return path
    for candidate in (environ.get("PIP_CERT"), environ.get("REQUESTS_CA_BUNDLE"), environ.get("SSL_CERT_FILE"), pip_cert()):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


# --- building ---------------------------------------------------------------------


def build_argv(
    context: BuildContext,
    iidfile: Path,
    ca_bundle: Path | None = None,
    labels: dict[str, str] | None = None,
    no_cache: bool = False,
) -> list[str]:
    """The arguments of `docker build` for one context (an argv list: nothing passes through a shell)."""
    argv = ["build", "--progress=plain", "--file", str(context.dockerfile), "--iidfile", str(iidfile)]
    for ref in (context.image_ref, *context.aliases):
        argv += ["--tag", ref]
    if ca_bundle is not None:
        # A BuildKit secret: mounted in the RUN steps that download, never written to a layer.
        argv += ["--secret", f"id=ca,src={ca_bundle}"]
    for key, value in (labels or {}).items():
        argv += ["--label", f"{key}={value}"]
    if no_cache:
        argv.append("--no-cache")
    argv.append(str(context.path))
    return argv


_STEP = re.compile(r"^#(\d+) \[(?:([^\]\s]+)\s+)?\s*(\d+)/(\d+)\] (.*)$")
_STATE = re.compile(r"^#(\d+) (CACHED|DONE [\d.]+s|ERROR.*|CANCELED)$")
_FAILED = re.compile(r"(executor failed running|failed to solve|ERROR: ).*")


@dataclass
class StepLog:
    """What the plain progress output says about one build step."""

    number: int
    total: int
    text: str
    state: str = "running"
    seconds: float = 0.0
    lines: list[str] = field(default_factory=list)


@dataclass
class ProgressParser:
    """Folds BuildKit's --progress=plain lines into steps: which ran, which were cached, which failed."""

    steps: dict[str, StepLog] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def feed(self, line: str) -> tuple[str, StepLog | None]:
        """('start'|'done'|'output'|'other', step) for one line."""
        line = line.rstrip("\n")
        step = _STEP.match(line)
        if step:
            vertex, _, number, total, text = step.groups()
            log = self.steps.setdefault(vertex, StepLog(int(number), int(total), text))
            return "start", log
        state = _STATE.match(line)
        if state and state.group(1) in self.steps:
            log = self.steps[state.group(1)]
            word = state.group(2)
            if word == "CACHED":
                log.state = "cached"
            elif word.startswith("DONE"):
                log.state, log.seconds = "done", float(word.split()[1].rstrip("s"))
            elif word.startswith("ERROR"):
                log.state = "error"
                self.errors.append(word)
            else:
                log.state = "canceled"
            return "done", log
        vertex = re.match(r"^#(\d+) ", line)
        if vertex and vertex.group(1) in self.steps:
            log = self.steps[vertex.group(1)]
            log.lines.append(line.split(" ", 2)[-1])
            del log.lines[:-40]
            return "output", log
        failed = _FAILED.search(line)
        if failed:
            self.errors.append(failed.group(0))
        return "other", None

    def _executing(self) -> list[StepLog]:
        # FROM only resolves the base: BuildKit shows it DONE or CACHED, but it runs nothing
        return [s for s in self.steps.values() if not s.text.startswith("FROM ")]

    @property
    def total(self) -> int:
        """The Dockerfile's steps that run or come from the cache (its [n/N] count, less the FROM)."""
        froms = {s.number for s in self.steps.values() if s.text.startswith("FROM ")}
        return max((s.total for s in self.steps.values()), default=0) - len(froms)

    @property
    def cached(self) -> int:
        return sum(1 for s in self._executing() if s.state == "cached")

    @property
    def ran(self) -> int:
        return sum(1 for s in self._executing() if s.state == "done")

    def failed_step(self) -> StepLog | None:
        return next((s for s in self.steps.values() if s.state == "error"), None)


@dataclass(frozen=True)
class BuildResult:
    """One built image and its report file."""

    context: BuildContext
    report: dict
    report_path: Path


def run_build(
    client: DockerClient,
    context: BuildContext,
    log_path: Path,
    ca_bundle: Path | None,
    labels: dict[str, str],
    on_line: Callable[[str, StepLog | None, ProgressParser], None] | None = None,
) -> tuple[str, ProgressParser, float]:
    """Run the build, streaming plain progress to ``on_line`` and to the log; (image id, parsed steps, seconds).

    Interrupted (Ctrl-C, SIGTERM turned into an exception by the CLI), the
    ``docker build`` child is stopped, which cancels the build, and the
    scratch folder goes: nothing is left running or behind.
    """
    parser = ProgressParser()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpurig-build-") as scratch:
        iidfile = Path(scratch) / "iid"
        argv = build_argv(context, iidfile, ca_bundle, labels)
        started = time.monotonic()
        # line-buffered: `tail -f` on the log follows the build as it goes
        with open(log_path, "w", buffering=1) as log, client.stream(argv) as proc:
            log.write("$ " + " ".join(redact(a) for a in [client.path, *argv]) + "\n")
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = redact(raw.rstrip("\n"))
                log.write(line + "\n")
                kind, step = parser.feed(line)
                if on_line:
                    on_line(kind, step, parser)
            code = proc.wait()
        seconds = time.monotonic() - started
        if code != 0:
            raise _build_failure(context, parser, code, log_path)
        image_id = iidfile.read_text().strip()
    return image_id, parser, seconds


NO_SPACE = "no space left on device"
NO_SPACE_FIX = ("free space where Docker keeps its data (`docker system df` shows what holds it; `docker builder prune` drops "
                "BuildKit's cache, `docker image prune` unused images), then build again")


def _build_failure(context: BuildContext, parser: ProgressParser, code: int, log_path: Path) -> DockerError:
    step = parser.failed_step()
    said = [*(step.lines if step is not None else ()), *parser.errors]
    if any(NO_SPACE in line.lower() for line in said):  # dpkg, pip or BuildKit's own words; the last line may be a progress bar
        where = f" at step {step.number}/{step.total} `{shorten(step.text, 70)}`" if step is not None else ""
        return DockerError(f"build of {context.image_ref} failed{where}: the disk ran out of space (No space left on device)",
                           NO_SPACE_FIX)
    detail = parser.errors[-1] if parser.errors else f"docker build exited {code}"
    detail = re.sub(r"\s+", " ", detail.removeprefix("ERROR: ").strip())
    if step is not None:
        where = f"step {step.number}/{step.total} `{shorten(step.text, 70)}`"
        exit_code = re.search(r"exit code: (\d+)", detail)
        why = f"exit code {exit_code.group(1)}" if exit_code else shorten(detail, 160)
        last = next((line for line in reversed(step.lines) if line.strip() and not line.startswith("ERROR")), "")
        problem = f"build of {context.image_ref} failed at {where}: {why}" + (f" ({shorten(last, 120)})" if last else "")
    else:
        problem = f"build of {context.image_ref} failed: {shorten(detail, 200)}"
    return DockerError(problem, f"read the build log {log_path}, fix the template or spec, and build again")


def shorten(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters (whitespace folded; an ellipsis where it was cut)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def inspect(engine: Engine, ref: str) -> ImageInfo:
    found = engine.image(ref)
    if found is None:
        raise DockerError(f"image {ref} is not in the local store", "build it first")
    return found


def make_report(
    context: BuildContext,
    client: DockerClient,
    image: ImageInfo,
    base: dict,
    parser: ProgressParser,
    seconds: float,
    freeze: list[str],
    dpkg: dict[str, str],
    ca_bundle: Path | None,
) -> dict:
    """The JSON build report: what was built from what, and every version resolved, to rebuild it later."""
    settings = context.spec.build
    torch = next((line for line in freeze if line.lower().startswith("torch")), "")
    return {
        "schema": REPORT_SCHEMA,
        "image": context.image_ref,
        "aliases": list(context.aliases),
        "image_id": image.id,
        "digest": None,
        "pushed": [],
        "size_bytes": image.size,
        "layers": len(image.layers),
        "duration_s": round(seconds, 1),
        "steps": {"total": parser.total, "cached": parser.cached, "ran": parser.ran},
        "variant": context.variant.name,
        "torch": context.entry.torch,
        "cuda": context.entry.cuda,
        "python": context.spec.python,
        "torch_resolved": torch,
        "base": base,
        "pip_freeze": freeze,
        "dpkg": dpkg,
        "settings": {
            "pip_index": redact(settings.pip_index),
            "pip_extra_index": [redact(u) for u in settings.pip_extra_index],
            "find_links": [redact(u) for u in settings.find_links],
            "offline": settings.offline,
            "torch_index": redact(settings.torch_index),
            "apt_mirror": redact(settings.apt_mirror),
            "ca_bundle": "passed as build secret" if ca_bundle else "none",
        },
        "locked": context.lock is not None,
        "lock_file": str(context.lock_file) if context.lock_file else None,
        "dockerfile_sha256": hashlib.sha256(context.dockerfile.read_bytes()).hexdigest(),
        "labels": context.labels,
        "client": {"path": client.path, "version": client.version, "buildx": client.buildx},
        "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def report_path(reports_dir: Path, context: BuildContext) -> Path:
    return reports_dir / "builds" / context.spec.name / f"{context.entry.tag}-{context.variant.name}.json"


def write_json_atomic(path: Path, data: dict) -> None:
    """Write a report beside its siblings; a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, to_json(data))


# --- pushing ----------------------------------------------------------------------


def push(engine: Engine, refs: Iterable[str]) -> str:
    """Push each ref; the digest the registry gave the (identical) manifest."""
    digest = ""
    for ref in refs:
        pushed = push_one(engine, ref)
        digest = digest or pushed
    return digest


def push_one(engine: Engine, ref: str) -> str:
    """Push one ref with the user's registry logins; the digest the registry gave its manifest ('' when the engine did not say).

    Ctrl-C, or PUSH_TIMEOUT_S passing, stops the push: the engine, its client gone, stops it too.
    """
    try:
        return engine.push(ref, timeout=PUSH_TIMEOUT_S)
    except EngineError as err:
        raise DockerError(f"push of {ref} failed ({err.reason})",
                          "check the registry address in the spec, that it answers, and `docker login` to it") from None


def record_push(path: Path, report: dict, refs: list[str], digest: str) -> dict:
    updated = {**report, "digest": digest or None, "pushed": refs}
    write_json_atomic(path, updated)
    return updated


# --- listing ----------------------------------------------------------------------


def project_images(engine: Engine, projects: Iterable[str], project_id: str = "") -> list[ImageInfo]:
    """The tagged local images of these projects (spec names, in their io.gpurig.project label), newest first.

    Not the dangling ones an earlier build left, not other projects' images on the same engine: one whose
    io.gpurig.project-id names another project is left out even where it chose the same spec name. One
    without that label (built before gpurig wrote it) is kept: `unowned` says which, for a note.
    """
    images = {image.id: image for project in projects for image in engine.labelled_images(f"{PROJECT_LABEL}={project}")}
    mine = [i for i in images.values() if i.labels.get(PROJECT_ID_LABEL, project_id) == project_id]
    return sorted(mine, key=lambda i: i.created, reverse=True)


def unowned(images: Iterable[ImageInfo]) -> list[ImageInfo]:
    """The images among these with no project id: built before gpurig wrote one, they may be another project's."""
    return [i for i in images if PROJECT_ID_LABEL not in i.labels]


def build_reports(reports_dir: Path) -> Iterator[tuple[Path, dict]]:
    """(path, report) of each readable build report under ``reports_dir``, in path order."""
    for path in sorted((reports_dir / "builds").glob("*/*.json")):
        try:
            report = read_report(path)
        except DockerError:  # unreadable, a FIFO, huge, not UTF-8, not JSON: not a report to list
            continue
        if isinstance(report, dict):
            yield path, report


def read_report(path: Path) -> Any:
    """One build report, read as every file gpurig did not just write is (gpurig/strict/reader.py)."""
    return load_json(path, error=DockerError, what="build report", fix="remove it, or build the image again to write a new one",
                     limit=REPORT_LIMIT)


def load_reports(reports_dir: Path) -> dict[str, dict]:
    """Build reports by image id."""
    return {report.get("image_id", ""): report for _, report in build_reports(reports_dir)}
