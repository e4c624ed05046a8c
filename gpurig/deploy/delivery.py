"""Getting an image onto a host, fastest path first: present, pull, forward, save-load.

``deliver(local, remote, conn, ref)`` tries in order:

1. **present**: the host already has the image id: nothing moves (the name is
   tagged there if only the id was).
2. **pull**: the spec's registry answers from the host and holds the very
   image this machine built (same id): the host pulls it.
3. **forward**: this machine pushes the image into its own registry
   (gpurig.deploy.registry; local, only new layers are written), and the
   host's dockerd pulls it through a reverse port forward on the host's
   loopback, so only the layers the host lacks cross the SSH connection.
   The host pulls a temporary ``127.0.0.1:<port>/...`` name; only when the
   pull completed and the id matches is the real name tagged, so a
   half-moved image never carries it. dockerd drops every layer of a pull
   that did not finish, so the host first pulls *stages* (gpurig.deploy.stages:
   images of the image's first k layers); after an interruption the next
   delivery moves only the layers no completed stage holds.
4. **save-load**: `docker save` streamed over SSH into the host's
   `docker load`: everything moves; the last resort (no registry binary, or
   the host's sshd refuses port forwarding).

``bytes_moved`` counts bytes that crossed the SSH connection (forward,
save-load) or that the host downloaded from the registry (pull).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpurig.connect.connection import ChannelError, Connection
from gpurig.connect.engine import Engine, EngineError, EngineLost
from gpurig.connect.forward import Meter
from gpurig.deploy.progress import Progress, PullFailed, PullProgress, PushProgress
from gpurig.deploy.registry import Reference, RegistryError, find_registry_binary, parse_reference, shared_registry, staging_reference
from gpurig.deploy.stages import Staged, StageError, stage_image
from gpurig.errors import HostError, last_line

METHODS = ("present", "pull", "forward", "save-load")
DISK_FULL_FIX = "free space on the host (`docker image prune`, or remove images it no longer runs) and deploy again"


class DeliveryError(EngineError):
    """An image that could not be moved onto a host."""


class DeliveryInterrupted(HostError):
    """The run was interrupted (Ctrl-C, SIGTERM) mid-delivery: no other path is tried, nothing is asked again."""


class _FallBack(Exception):
    """A path that cannot be used here; its message says why (kept in the Delivery's note)."""


@dataclass(frozen=True)
class Delivery:
    method: str  # present | pull | forward | save-load
    bytes_moved: int
    image_id: str
    seconds: float = 0.0
    note: str = ""  # why faster paths were not taken
    source: str = ""  # fan-out (gpurig.deploy.fanout): "build machine", or the host whose layer cache it pulled from


def deliver(local: Engine, remote: Engine, conn: Connection, ref: str, *, registry: str | None = None,
            progress: Progress | None = None, say: Callable[[str], None] | None = None,
            methods: Iterable[str] = METHODS, cache_dir: Path | None = None) -> Delivery:
    """Make ``ref`` (name:tag, as built on this machine) exist on ``remote``'s host with the same image id."""
    started = time.monotonic()
    progress = progress or (lambda done, total: None)
    say = say or (lambda text: None)
    methods = tuple(methods)
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown delivery methods {sorted(unknown)}")
    want = local.image(ref)
    if want is None and not registry:
        raise DeliveryError(f"image {ref} is not on this machine", "build it first (`invoke build`), or set registry: in its image spec")
    notes: list[str] = []

    def done(method: str, moved: int, image_id: str) -> Delivery:
        return Delivery(method, moved, image_id, time.monotonic() - started, "; ".join(notes))

    if want is not None and "present" in methods and remote.image(want.id) is not None:
        say(f"{ref} is on the host already (the same image id): nothing moves")
        _tag(remote, want.id, ref)
        return done("present", 0, want.id)
    if registry and "pull" in methods:
        try:
            digests = list(want.digests) if want is not None else []
            image_id, moved = _pull_from_registry(remote, conn, ref, registry, want, digests, progress, say)
            return done("pull", moved, image_id)
        except _FallBack as why:
            notes.append(str(why))
            say(str(why))
    if want is None:
        raise DeliveryError(f"image {ref} is neither on this machine nor pullable by {remote.name}: {notes[-1]}",
                            "build it here (`invoke build`), or push it to the registry")
    if "forward" in methods:
        try:
            return done("forward", _forward(local, remote, conn, ref, want.id, progress, say, cache_dir), want.id)
        except _FallBack as why:
            notes.append(str(why))
            say(str(why))
    if "save-load" in methods:
        return done("save-load", _save_load(local, remote, conn, ref, want.id, want.size, progress, say), want.id)
    raise DeliveryError(f"image {ref} could not be moved to {remote.name}: {'; '.join(notes) or 'no method allowed'}",
                        "allow the save-load method, or fix the reasons above")


# --- pull from the spec's registry ----------------------------------------------------------------


def _pull_from_registry(remote: Engine, conn: Connection, ref: str, registry: str, want, local_digests: list[str], progress: Progress,
                        say) -> tuple[str, int]:
    """The host pulls ``ref`` from ``registry`` when it holds the image built here (same manifest digest, then same id)."""
    parsed = parse_reference(ref)
    source = ref if ref.startswith(registry.rstrip("/") + "/") else parsed.on(registry)
    try:  # asks the registry for the manifest through the host's engine: no layer moves yet
        digest = remote.distribution_digest(source)
    except EngineError as err:
        raise _FallBack(f"registry {registry} did not give {source} to {remote.name}: {err.reason}") from None
    if want is not None:
        repository = source.rpartition(":")[0]
        pushed = {d.split("@", 1)[1] for d in local_digests if d.split("@", 1)[0] == repository}
        if pushed and digest not in pushed:
            raise _FallBack(f"registry {registry} holds another image under {source} than this machine built (push it again)")
    say(f"pulling {source} from the registry")
    try:
        pulled = _host_pull(remote, source, PullProgress(progress), conn)
    except PullFailed as err:
        if err.disk_full:
            raise _disk_full(remote, err.message) from None
        raise _FallBack(f"registry {registry} did not give {source} to the host: {err.message}") from None
    found = remote.image(source)
    if found is None:
        raise _FallBack(f"registry {registry}: the pull of {source} left no image")
    if want is not None and found.id != want.id:
        _untag(remote, source)
        raise _FallBack(f"registry {registry} holds another image under {source} than this machine built (push it again)")
    if source != ref:
        _tag(remote, found.id, ref)
    return found.id, pulled


# --- forward: the local registry through a reverse port forward --------------------------------------


def _forward(local: Engine, remote: Engine, conn: Connection, ref: str, image_id: str, progress: Progress, say, cache_dir) -> int:
    if find_registry_binary() is None:
        raise _FallBack("no docker-registry on this machine, so the whole image moved by docker save | docker load "
                        "(install Debian's docker-registry package to move only missing layers)")
    parsed = staging_reference(parse_reference(ref))
    try:
        with shared_registry(cache_dir) as registry:
            staged = push_staged(local, registry.address, ref, image_id, progress, conn, say)
            try:
                forward = conn.reverse_forward(("127.0.0.1", registry.port))
            except ChannelError as err:
                raise _FallBack(f"{err.problem}, so the whole image moved by docker save | docker load") from None
            with forward:
                pull_through(remote, conn, ref, parsed, image_id, forward.port, lambda: forward.meter.down, staged, progress, say)
            return forward.meter.total
    except RegistryError as err:
        raise _FallBack(f"{err.problem}: moved by docker save | docker load") from None


def push_staged(local: Engine, address: str, ref: str, image_id: str, progress: Progress, conn: Connection, say) -> Staged:
    """The image pushed into the local registry at ``address`` under its staging name (only new layers are written), and its
    stages made there; ``conn``: the host this is done for (an interrupted run stops the push)."""
    parsed = staging_reference(parse_reference(ref))
    say(f"pushing {ref} into the local registry (this machine's side of the SSH forward)")
    say(f"pushed into the local registry: {_push(local, image_id, parsed.on(address), progress, conn)}")
    try:
        return stage_image(address, parsed.path, parsed.tag)
    except StageError:  # one pull of the whole image: still only missing layers, but no resume point
        return Staged((), ())


def pull_through(remote: Engine, conn: Connection, ref: str, parsed: Reference, image_id: str, port: int, moved: Callable[[], int | None],
                 staged: Staged, progress: Progress, say, how: tuple[str, str] = ("through the SSH connection", "through the SSH forward"),
                 gone: Callable[[], str | None] | None = None) -> int:
    """The host pulls the stages, then the image under a temporary name, from a registry on its own 127.0.0.1:``port`` (the build
    machine's through a reverse forward, or a layer cache: Docker pulls plain HTTP from loopback); the real name goes only on the
    complete, same-id image. ``moved()``: the bytes that reached the host so far (None: the pull's own count), for progress;
    ``how``: where from, as the progress line and a failure say it; ``gone()``: why what it pulls through is gone (a layer
    cache that died), asked at each of the engine's events (it says one a second while it waits to retry), which ends the
    pull at once. Returns the bytes the host's engine fetched."""
    say(f"the host pulls the layers it lacks {how[0]}")  # the line is shown after the host's name already
    via = f"127.0.0.1:{port}"
    temp = parsed.on(via)
    tracker = PullProgress(progress, staged.sizes, moved)
    try:
        for stage in staged.stages:  # each completed one keeps its layers on the host should the next be interrupted
            _host_pull(remote, f"{via}/{parsed.path}:{stage}", tracker, conn, gone)
        fetched = _host_pull(remote, temp, tracker, conn, gone)  # one tracker for all: the layers of every pull
        found = remote.image(temp)
        if found is None or found.id != image_id:
            raise DeliveryError(f"the pulled image is {found.id[:19] if found else 'missing'}, not {image_id[:19]}",
                                "deploy again; if it persists, remove the image on the host", host=remote.name)
        _tag(remote, image_id, ref)
    except PullFailed as err:
        if err.disk_full:
            raise _disk_full(remote, err.message) from None
        raise DeliveryError(f"pulling {how[1]} failed: {err.message}",
                            "deploy again: only the layers still missing will move", host=remote.name) from None
    finally:
        _untag(remote, temp)
    _forget_temporary_names(remote, parsed, staged)
    return fetched


def _forget_temporary_names(remote: Engine, parsed, staged: Staged) -> None:
    """This image's stage and temporary names (this delivery's, or an interrupted one's): the real image holds the layers now."""
    tags = "|".join(re.escape(t) for t in (parsed.tag, *staged.stages))
    pattern = re.compile(r"127\.0\.0\.1:\d+/" + re.escape(parsed.path) + f":({tags})$")
    try:
        listed = remote.image_tags()
    except EngineError:
        return
    for tag in listed:
        if pattern.fullmatch(tag):
            _untag(remote, tag)


_PUSHING = threading.Lock()  # hosts deliver in parallel: one push at a time, so one's cleanup never untags another's push


def _push(local: Engine, image_id: str, staged: str, progress: Progress, conn: Connection) -> str:
    """The image into the local registry under ``staged`` (the same image again: the engine finds every layer there).

    Its bytes go to ``progress`` as the engine uploads them; returns what it did ('3 of 9 layers uploaded (1.2 GB)').
    An interrupted run stops the push at the engine's next progress event and takes the name off again.
    """
    tracker = PushProgress(progress)

    def on_event(event: dict) -> None:
        _checkpoint(conn)
        tracker.feed(event)

    with _PUSHING:
        _checkpoint(conn)
        try:
            local.tag(image_id, staged)
            try:
                local.push(staged, on_event)
            finally:
                _untag(local, staged)
        except EngineError as err:
            raise _FallBack(f"pushing into the local registry failed: {err.reason}") from None
    return tracker.summary()


# --- the host's pull, with progress ----------------------------------------------------------------


PULL_ATTEMPTS = 3


def _host_pull(remote: Engine, source: str, tracker: PullProgress, conn: Connection, gone: Callable[[], str | None] | None = None) -> int:
    """The host's dockerd pulls ``source`` (progress through ``tracker``); the bytes fetched; PullFailed once ``gone()`` says why.

    A stream to the engine that breaks off before the pull said it was done is asked again (a pull is
    idempotent, and the layers of completed stages stay). Seen once, on a loaded machine: the engine's
    answer ended mid-pull (its cause not found).
    """
    def on_event(event: dict) -> None:
        _checkpoint(conn)  # an interrupted run stops the pull at the next event
        why = gone() if gone is not None else None
        if why:
            raise PullFailed(why)  # the engine sees its client leave and stops the pull
        tracker.feed(event)

    for attempt in range(1, PULL_ATTEMPTS + 1):
        try:
            remote.pull(source, on_event)
            return tracker.finish()
        except EngineLost as lost:
            _checkpoint(conn)  # lost because the run was interrupted: not asked again
            if attempt == PULL_ATTEMPTS:
                raise PullFailed(f"the connection to the engine broke off {PULL_ATTEMPTS} times: {lost.reason}") from None
        except EngineError as err:
            raise PullFailed(err.reason) from None
    raise AssertionError("unreachable")


# --- save | load ----------------------------------------------------------------------------------------


def _save_load(local: Engine, remote: Engine, conn: Connection, ref: str, image_id: str, size: int, progress: Progress, say) -> int:
    say(f"streaming {ref} by docker save | docker load")
    meter = Meter()
    saved = local.save(ref)

    def counted(chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            _checkpoint(conn)  # an interrupted run stops sending: the host's docker load gets no complete image
            meter.add(down=len(chunk))
            # the tar runs past the image's size (a header a file): from there the total is not known until the end, so no "of" (a total
            # grown to the bytes moved read as done at every chunk, each such count printed unpaced)
            progress(meter.down, size if meter.down <= size else 0)
            yield chunk

    try:
        for event in remote.load(counted(saved)):
            if "error" in event:
                message = last_line(str(event["error"]))
                if "no space left on device" in message:
                    raise _disk_full(remote, message)
                raise DeliveryError(f"docker load refused {ref}: {message}", "deploy again; see the host's dockerd log", host=remote.name)
    except DeliveryError:
        raise
    except EngineError as err:  # either engine: this machine's save or the host's load
        _checkpoint(conn)  # the host's load ended because the run was interrupted, not for its own reason
        message = err.reason
        if "no space left on device" in message:
            raise _disk_full(remote, message) from None
        raise DeliveryError(f"docker save | docker load of {ref} failed: {message}", "deploy again", host=remote.name) from None
    finally:
        saved.close()  # this machine's engine stops writing the tar
    found = remote.image(ref)
    if found is None or found.id != image_id:
        raise DeliveryError(f"after docker load, {ref} is {found.id[:19] if found else 'missing'}, not {image_id[:19]}", "deploy again", host=remote.name)
    progress(meter.down, meter.down)
    return meter.total


# --- small engine helpers ----------------------------------------------------------------------------


def _tag(engine: Engine, image_id: str, ref: str) -> None:
    have = engine.image(ref)
    if have is not None and have.id == image_id:
        return
    engine.tag(image_id, ref)


def _untag(engine: Engine, ref: str) -> None:
    """Remove the name ``ref`` only (never the layers another name still uses), if it exists."""
    try:
        engine.untag(ref)
    except HostError:
        pass  # a leftover temporary name (an interrupted run's, say) is cosmetic; the next delivery retags over it or removes it


def _checkpoint(conn: Connection) -> None:
    """Raise when the run was interrupted (Ctrl-C, SIGTERM): the phase under way stops here."""
    if conn.interrupted:
        raise DeliveryInterrupted("interrupted during the image's delivery; no half-moved image carries its name",
                            "deploy again: it resumes, moving only what is still missing", host=conn.name)


def _disk_full(remote: Engine, message: str) -> DeliveryError:
    return DeliveryError(f"the host's disk is full ({message})", DISK_FULL_FIX, host=remote.name)
