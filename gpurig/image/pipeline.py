"""The build pipeline: a base for each FROM, then each rendered context built, pushed and recorded; progress goes to an observer.

``client`` (the docker CLI) runs ``docker build`` alone; ``engine`` (this
machine's, ``gpurig.connect.engineopen.local_engine``) does the rest."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gpurig.connect.engine import Engine
from gpurig.image import aliases, lock
from gpurig.image.baseimage import BaseImage, ensure_base
from gpurig.image.build import (
    BuildResult,
    ProgressParser,
    StepLog,
    inspect,
    make_report,
    push,
    record_push,
    report_path,
    run_build,
    write_json_atomic,
)
from gpurig.image.dockercli import DockerClient
from gpurig.image.imageprobe import resolved_versions
from gpurig.image.render import PROJECT_ID_LABEL, BuildContext
from gpurig.image.spec import ImageSpec


class BuildObserver:
    """What a build tells whoever presents it. Every method is a no-op here: override the ones you show."""

    def base(self, line: str) -> None:
        """One line about the base image: found, pulled, or bootstrapped (and why)."""

    def started(self, context: BuildContext) -> None:
        """``docker build`` of this context begins."""

    def step(self, context: BuildContext, kind: str, step: StepLog, parser: ProgressParser) -> None:
        """A build step started ('start'), ended ('done': cached, done or error) or printed a line ('output')."""

    def note(self, context: BuildContext, line: str) -> None:
        """A line about the build's tags: an alias this build leaves on another entry, or one it moved."""

    def still_running(self, context: BuildContext, step: StepLog, seconds: float) -> None:
        """A step has been running for ``seconds`` (said every HEARTBEAT_S while it runs, output or not)."""

    def pushing(self, context: BuildContext, refs: list[str]) -> None:
        """The image's tags are being pushed."""

    def built(self, result: BuildResult) -> None:
        """The image is built (and pushed when asked), its report written."""


HEARTBEAT_S = 30.0


class Heartbeat:
    """Which running steps are owed a "still running" line: one every ``every_s`` seconds of each step's run.

    Fed the parser's start/done events by the thread that reads the build; asked
    ``due()`` by a timer thread, so a step that prints nothing for minutes (pip
    waiting on an index) is still heard of.
    """

    def __init__(self, every_s: float = HEARTBEAT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self._running: dict[int, tuple[StepLog, float, float]] = {}  # id(step) -> (step, started, last said)
        self._lock = threading.Lock()

    def feed(self, kind: str, step: StepLog) -> None:
        with self._lock:
            if kind == "start" and not step.text.startswith("FROM ") and id(step) not in self._running:
                now = self.clock()
                self._running[id(step)] = (step, now, now)
            elif kind == "done":
                self._running.pop(id(step), None)

    def due(self) -> list[tuple[StepLog, float]]:
        """(step, seconds it has run) for each step last mentioned ``every_s`` ago or more."""
        now, owed = self.clock(), []
        with self._lock:
            for key, (step, started, said) in list(self._running.items()):
                if now - said >= self.every_s:
                    self._running[key] = (step, started, now)
                    owed.append((step, now - started))
        return owed


@contextmanager
def _ticking(heartbeat: Heartbeat, say: Callable[[StepLog, float], None]) -> Iterator[None]:
    """A timer thread asking ``heartbeat`` what is due while the block runs; it ends with the block."""
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(min(heartbeat.every_s, 5.0)):
            for step, seconds in heartbeat.due():
                say(step, seconds)

    thread = threading.Thread(target=tick, name="build-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def base_labels(base: BaseImage) -> dict[str, str]:
    """What every image records about its base. Only what the base *is*, never how this run got it, so that
    an unchanged rebuild keeps its image id (the base found locally today was bootstrapped yesterday)."""
    labels = {"io.gpurig.image.baseimage.source": base.origin, "io.gpurig.image.baseimage.id": base.image_id}
    if base.bootstrap:
        labels["io.gpurig.image.baseimage.bootstrap"] = base.bootstrap
    return labels


def build_context(
    client: DockerClient,
    engine: Engine,
    context: BuildContext,
    base: BaseImage,
    reports_dir: Path,
    ca_bundle: Path | None,
    labels: dict[str, str] | None = None,
    observer: BuildObserver | None = None,
    heartbeat_s: float = HEARTBEAT_S,
    relock: Path | None = None,
) -> BuildResult:
    """Build one rendered context, read the versions inside the image, write its JSON report.

    With ``relock`` (a lock file), what the build resolved is locked there before the report is written.
    """
    observer = observer or BuildObserver()
    heartbeat = Heartbeat(heartbeat_s)
    user_labels = dict(labels or {})
    all_labels = {**user_labels, **base_labels(base)}
    path = report_path(reports_dir, context)
    observer.started(context)
    context = others_aliases_kept(engine, context)
    for line in context.aliases_left:
        observer.note(context, line)
    before = aliases.named_builds(engine, context.aliases)

    def on_line(kind: str, step: StepLog | None, parser: ProgressParser) -> None:
        if step is not None:
            heartbeat.feed(kind, step)
            observer.step(context, kind, step, parser)

    with _ticking(heartbeat, lambda step, s: observer.still_running(context, step, s)):
        image_id, parser, seconds = run_build(client, context, path.with_suffix(".log"), ca_bundle, all_labels, on_line)
    image = inspect(engine, image_id)
    freeze, dpkg = resolved_versions(engine, image_id, user_labels)
    report = make_report(context, client, image, base.as_dict(), parser, seconds, freeze, dpkg, ca_bundle)
    moved = aliases.moves(before, aliases.build_name(context.labels))
    for line in moved:
        observer.note(context, line)
    report["alias_notes"] = [*context.aliases_left, *moved]
    if relock is not None:
        files = lock.read_resolution(engine, image_id, user_labels)
        pip, apt = lock.resolution(files, dpkg)
        locked = lock.LockedImage(context.entry.torch, context.entry.cuda, context.variant.name, context.lock_inputs,
                                  lock.base_of(base), pip, apt)
        lock.save(relock, context.spec, {lock.image_key(context.entry.tag, context.variant.name): locked})
        report.update(lock_file=str(relock), lock_written=True)
    write_json_atomic(path, report)
    return BuildResult(context, report, path)


def others_aliases_kept(engine: Engine, context: BuildContext) -> BuildContext:
    """The context less each alias that names another project's image (its io.gpurig.project-id is not this one's).

    Two projects may choose the same image name on one engine; a build here must not take ``pytorch:slim`` from
    the other. The alias stays where it is, and a line in ``aliases_left`` says why.
    """
    mine = context.labels.get(PROJECT_ID_LABEL, "")
    kept, left = [], []
    for ref in context.aliases:
        found = engine.image(ref)
        theirs = found.labels.get(PROJECT_ID_LABEL, mine) if found else mine
        if theirs == mine:
            kept.append(ref)
        else:
            left.append(f"{ref} stays on another project's image (project id {theirs}; this one's is {mine or 'unset'}): "
                        f"both name their images {context.spec.name} on this engine; give one spec another name")
    if not left:
        return context
    return dataclasses.replace(context, aliases=tuple(kept), aliases_left=(*context.aliases_left, *left))


def build_all(
    client: DockerClient,
    engine: Engine,
    spec: ImageSpec,
    contexts: list[BuildContext],
    reports_dir: Path,
    ca_bundle: Path | None,
    labels: dict[str, str] | None = None,
    push_images: bool = False,
    observer: BuildObserver | None = None,
    relock: bool = False,
) -> list[BuildResult]:
    """Each context in order: its base made available once per reference, built, pushed when asked, recorded.

    A locked context's base must be the one it locks; with ``relock``, each build is locked into the spec's lock file.
    """
    observer = observer or BuildObserver()
    bases: dict[str, BaseImage] = {}
    results = []
    for context in contexts:
        ref = context.variant.base
        if ref not in bases:
            bootstrap = spec.bootstrap if ref == spec.base else None
            bases[ref] = ensure_base(engine, ref, bootstrap, labels, say=observer.base)
        if context.lock is not None and context.lock_file is not None:
            lock.check_base(engine, context.lock, context.lock_file)
        lock_file = lock.lock_path(spec.path) if relock else None
        result = build_context(client, engine, context, bases[ref], reports_dir, ca_bundle, labels, observer, relock=lock_file)
        if push_images:
            refs = [context.image_ref, *context.aliases]
            observer.pushing(context, refs)
            pushed = record_push(result.report_path, result.report, refs, push(engine, refs))
            result = dataclasses.replace(result, report=pushed)
        observer.built(result)
        results.append(result)
    return results
