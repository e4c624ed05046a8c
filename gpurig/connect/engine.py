"""A Docker engine through its HTTP API: the one door to Docker for every engine verb, on hosts and on this machine.

Deploy, verify, jobs and the image build all inspect, list, tag, pull, push,
save, load, import, run and exec here. Only ``docker build`` itself runs the docker CLI
(``gpurig.image.dockercli``, a layer above: BuildKit and its streamed output).

``gpurig.connect.engineopen`` opens one: ``open_engine(conn)`` a host's,
``local_engine()`` this machine's (the engine its docker CLI builds into:
DOCKER_CONTEXT's context, else DOCKER_HOST, else the current docker context,
else the default socket). Only this machine's engine is given the user's
registry logins (~/.docker/config.json and its credential helpers) to pull and push with.

Every method returns typed results (``gpurig.connect.engineinfo``), a plain
value (an image id, a digest, layer sizes) or nothing, and every failure of a request, whatever docker-py, requests or the
socket raised, becomes one ``EngineError`` with the problem and the fix
(``EngineLost`` when the connection to the engine broke off). No ``docker``
CLI text is parsed, and no caller sees docker-py.
"""

from __future__ import annotations

import posixpath
import tarfile
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import closing, suppress

import docker
import docker.auth
import docker.errors
import docker.utils
import requests
import urllib3.exceptions

from gpurig.connect.engineinfo import ContainerInfo, EngineInfo, Exited, ImageInfo, container_info, engine_info, image_info, name_and_tag, saved_layers
from gpurig.connect.enginewire import close_hijacked, demux, read_to_end
from gpurig.errors import HostError, last_line

# Everything a request can fail with: the engine's refusal (docker.errors) or a broken connection.
ENGINE_FAILURES = (docker.errors.DockerException, requests.RequestException, urllib3.exceptions.HTTPError, OSError)
_LOST = (requests.RequestException, urllib3.exceptions.HTTPError, OSError)


class EngineError(HostError):
    """A host's Docker engine that cannot be reached or refused a request.

    ``reason`` is the engine's own words (or the broken connection's), without the host and the request.
    """

    def __init__(self, problem: str, fix: str = "", reason: str = "", host: str = "") -> None:
        super().__init__(problem, fix, host)
        self.reason = reason or problem


class EngineLost(EngineError):
    """The connection to the engine broke off during a request (asking again may work)."""


class Engine:
    """One host's engine; ``name`` is the host's inventory name (it starts every error message).

    ``local``: the engine of the machine gpurig runs on, the only one pulls and pushes send the user's registry logins to.
    """

    def __init__(self, name: str, api: docker.APIClient, local: bool = False) -> None:
        self.name = name
        self._api = api
        self.local = local

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._api.close()

    # --- reading ---------------------------------------------------------------------------------

    def info(self) -> EngineInfo:
        info = self._call("read the engine's info", self._api.info)
        version = self._call("read the engine's version", self._api.version)
        return engine_info(info, version)

    def image(self, ref: str) -> ImageInfo | None:
        """The image ``ref`` (a name:tag or an id) names on this host, or None."""
        data = self._inspect(self._api.inspect_image, f"inspect image {ref}", ref)
        return None if data is None else image_info(data)

    def container(self, name: str) -> ContainerInfo | None:
        data = self._inspect(self._api.inspect_container, f"inspect container {name}", name)
        return None if data is None else container_info(data)

    def containers(self, label: str | None = None) -> list[ContainerInfo]:
        """Every container (running or not), optionally only those carrying ``label`` (``key`` or ``key=value``)."""
        filters = {"label": [label]} if label else None
        listed = self._call("list containers", self._api.containers, all=True, filters=filters)
        found = []
        for entry in listed:
            info = self.container(entry["Id"])
            if info is not None:  # removed between the list and the inspect
                found.append(info)
        return sorted(found, key=lambda c: c.name)

    def labelled_images(self, label: str) -> list[ImageInfo]:
        """Every tagged (not dangling) image carrying ``label`` (``key`` or ``key=value``), each once."""
        listed = self._call("list images", self._api.images, filters={"label": [label], "dangling": False})
        found = []
        for image_id in dict.fromkeys(entry["Id"] for entry in listed):
            info = self.image(image_id)
            if info is not None:  # removed between the list and the inspect
                found.append(info)
        return found

    def image_tags(self) -> list[str]:
        """Every name:tag of every image on this host."""
        return [tag for entry in self._call("list images", self._api.images) for tag in entry.get("RepoTags") or ()]

    def distribution_digest(self, ref: str) -> str:
        """The manifest digest a registry gives for ``ref``, asked through this engine (no layer moves)."""
        what = f"ask the registry for {ref}"
        data = self._call(what, self._api.inspect_distribution, ref)
        try:
            return str(data["Descriptor"]["digest"])
        except (KeyError, TypeError):
            raise EngineError(f"the registry's answer for {ref} names no digest", "check the registry", "no digest in its answer", host=self.name) from None

    # --- containers ------------------------------------------------------------------------------

    def create(self, body: dict, name: str) -> str:
        """A container from an engine API create request; its id."""
        return str(self._call(f"create {name}", self._api.create_container_from_config, body, name=name)["Id"])

    def start(self, ref: str) -> None:
        self._call(f"start {ref}", self._api.start, ref)

    def stop(self, ref: str, timeout: int = 10) -> None:
        """Stop it, killing it after ``timeout`` seconds."""
        self._call(f"stop {ref}", self._api.stop, ref, timeout=timeout)

    def remove(self, ref: str) -> None:
        """Remove it, stopping it first if it runs (its anonymous volumes stay)."""
        self._call(f"remove {ref}", self._api.remove_container, ref, force=True)

    def put_archive(self, ref: str, path: str, data: bytes) -> None:
        """Unpack a tar into the container at ``path`` (before it starts, too)."""
        self._call(f"copy files into {ref}", self._api.put_archive, ref, path, data)

    def wait(self, ref: str, timeout: float) -> int | None:
        """Its exit code if it exits within ``timeout`` seconds; None while it still runs then."""
        try:
            return self._api.wait(ref, timeout=timeout).get("StatusCode")
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            return None  # still running after the timeout
        except ENGINE_FAILURES as err:
            raise self._error(f"wait for {ref}", err) from None

    def logs(self, ref: str, tail: int | str = "all") -> str:
        """Its last ``tail`` lines of stdout and stderr."""
        data = self._call(f"read the logs of {ref}", self._api.logs, ref, stdout=True, stderr=True, tail=tail)
        return data.decode(errors="replace") if isinstance(data, bytes) else str(data)

    def follow_logs(self, ref: str, tail: int | str = "all", follow: bool = False) -> Iterator[bytes]:
        """Its stdout and stderr as they come, from ``tail`` lines back; with ``follow`` until it stops or the caller does."""
        what = f"read the logs of {ref}"
        return self._stream(what, self._call(what, self._api.logs, ref, stream=True, follow=follow, tail=tail, stdout=True, stderr=True))

    def exec_run(self, ref: str, argv: list[str]) -> tuple[int | None, bytes]:
        """(exit code, stdout) of ``argv`` run in the running container."""
        what = f"run {argv[0]} in {ref}"
        run = self._call(what, self._api.exec_create, ref, argv, stdout=True, stderr=False)
        out = self._call(what, self._api.exec_start, run["Id"])
        code = self._call(what, self._api.exec_inspect, run["Id"]).get("ExitCode")
        return code, out if isinstance(out, bytes) else str(out).encode()

    def exec(self, ref: str, argv: list[str], timeout: float) -> Exited | None:
        """``argv`` run in the running container to its end; None when it still runs after ``timeout`` seconds.

        An overrunning process is left to run: the engine cannot stop one exec
        (``docker exec``, its client gone, leaves it running too).
        """
        deadline = time.monotonic() + timeout
        what = f"run {argv[0]} in {ref}"
        run = self._call(what, self._api.exec_create, ref, argv, stdout=True, stderr=True)
        sock = self._call(what, self._api.exec_start, run["Id"], socket=True)
        try:
            data = self._call(what, read_to_end, sock, deadline)
        finally:
            close_hijacked(sock)
        if data is None:
            return None
        code = self._call(what, self._api.exec_inspect, run["Id"]).get("ExitCode")
        out, err = demux(data)
        return Exited(int(code or 0), out.decode(errors="replace"), err.decode(errors="replace"))

    def run(self, body: dict, name: str, timeout: float) -> Exited | None:
        """A throwaway container made from a create request, run to its end; None when it still runs after ``timeout`` seconds.

        The container is removed on every way out (an overrun, a refusal to
        start, Ctrl-C), as ``docker run --rm`` would once it ends.
        """
        deadline = time.monotonic() + timeout
        self.create(body, name)
        try:
            self.start(name)
            remaining = deadline - time.monotonic()
            code = self.wait(name, remaining) if remaining > 0 else None
            if code is None:
                return None
            what = f"read the output of {name}"
            out = self._call(what, self._api.logs, name, stdout=True, stderr=False)
            err = self._call(what, self._api.logs, name, stdout=False, stderr=True)
            return Exited(int(code), out.decode(errors="replace"), err.decode(errors="replace"))
        finally:
            # a failure to remove must not hide why the run ended; the container carries the caller's label to be found by
            with suppress(EngineError):
                self.remove(name)

    # --- images ----------------------------------------------------------------------------------

    def tag(self, image_id: str, ref: str) -> None:
        """Give the image the name ``ref`` (name:tag), taking it from any image that had it."""
        name, tag = name_and_tag(ref)
        self._call(f"tag {ref}", self._api.tag, image_id, name, tag, force=True)

    def untag(self, ref: str) -> None:
        """Remove the name ``ref`` (the layers stay while another name uses them); nothing when there is no such name."""
        try:
            self._api.remove_image(ref, noprune=False)
        except docker.errors.NotFound:
            pass
        except ENGINE_FAILURES as err:
            raise self._error(f"untag {ref}", err) from None

    def push(self, ref: str, on_event: Callable[[dict], None] = lambda event: None, timeout: float | None = None) -> str:
        """Push ``ref`` (name:tag) to its registry; the manifest digest the registry gave ('' when the engine did not say).

        An error the registry streams back is an EngineError too. Each JSON event goes to ``on_event``, which may raise
        to stop: the response is closed then (as after ``timeout`` seconds), and the engine, its client gone, stops the push.
        """
        name, tag = name_and_tag(ref)
        what, api = f"push {ref}", self._api
        # docker-py's push() hides the response, as its pull() does; its credentials header is kept (docker login's)
        response = self._call(what, api._post_json, api._url("/images/{0}/push", name), None, params={"tag": tag},
                              headers=self._logins(name), stream=True, timeout=timeout)
        digest = ""
        with closing(self._events(what, response, timeout, refusals=True)) as events:
            for event in events:
                aux = event.get("aux")
                if isinstance(aux, dict) and aux.get("Digest"):
                    digest = str(aux["Digest"])
                on_event(event)
        return digest

    def pull(self, ref: str, on_event: Callable[[dict], None], timeout: float | None = None) -> None:
        """The engine pulls ``ref`` (name:tag or name@digest); each JSON event it streams goes to ``on_event`` (which may raise to stop).

        On any end before the pull completed (``on_event`` raising, Ctrl-C, a lost
        connection, ``timeout`` seconds passed) the response is closed: the engine
        sees its client leave and stops the pull. An ``error`` event is the
        caller's to read (deploy tells a full disk from other failures).
        """
        name, tag = name_and_tag(ref)
        what, api = f"pull {ref}", self._api
        # docker-py's pull() hides the response; it is needed to close it (and stop the engine's pull) on an interruption.
        response = self._call(what, api._post, api._url("/images/create"), params={"fromImage": name, "tag": tag},
                              headers=self._logins(name), stream=True, timeout=timeout)
        with closing(self._events(what, response, timeout)) as events:
            for event in events:
                on_event(event)

    def import_image(self, chunks: Iterable[bytes], ref: str, changes: Iterable[str] = (), timeout: float | None = None) -> str:
        """``docker import``: a root filesystem's tar stream as the image ``ref`` (name:tag), with Dockerfile ``changes``; its id.

        An exception out of ``chunks`` (Ctrl-C, the tar's writer failing) stops the
        upload half-way, and the engine, its tar cut short, makes no image.
        """
        name, tag = name_and_tag(ref)
        what, api = f"import {ref}", self._api
        params = {"fromSrc": "-", "repo": name, "tag": tag, "changes": list(changes)}
        response = self._call(what, api._post, api._url("/images/create"), data=chunks, params=params,
                              headers={"Content-Type": "application/tar"}, stream=True, timeout=timeout)
        image_id = ""
        with closing(self._events(what, response, timeout, refusals=True)) as events:
            for event in events:
                if str(event.get("status", "")).startswith("sha256:"):
                    image_id = str(event["status"]).strip()
        if not image_id:
            raise EngineError(f"the Docker engine gave no image id for {what}", "see the engine's log", "no image id in its answer", host=self.name)
        return image_id

    def save(self, *refs: str) -> Generator[bytes, None, None]:
        """``docker save REFS``: the images as one tar stream (a layer they share once), in chunks of 1 MiB.

        Closing the iterator early closes the response, and the engine stops writing the tar.
        """
        what, api = f"save {' '.join(refs)}", self._api
        response = self._call(what, api._get, api._url("/images/get"), params={"names": list(refs)}, stream=True, timeout=None)
        try:
            api._raise_for_status(response)
            yield from response.iter_content(1 << 20, False)
        except ENGINE_FAILURES as err:
            raise self._error(what, err) from None
        finally:
            response.close()

    def layer_sizes(self, *refs: str) -> dict[str, int]:
        """Each layer of these images (by diff id) and its size: the uncompressed tar a host stores.

        Read from ``save`` as it streams (nothing is written to disk; either layout, ``saved_layers``), as the
        engine reports no size per layer; images that share a layer list it once.
        """
        with closing(self.save(*refs)) as chunks:
            try:
                sizes, manifest = saved_layers(chunks)
            except (tarfile.TarError, ValueError, KeyError) as err:
                raise EngineError(f"the Docker engine's save of {' '.join(refs)} is not a tar gpurig can read: {err}",
                                  "check that the images exist (`docker image ls`)", str(err), host=self.name) from None
        by_diff_id = {}
        for image in manifest:
            # the config's name is the image id: "<hex>.json" (legacy) or "blobs/sha256/<hex>" (OCI)
            image_id = "sha256:" + posixpath.basename(image["Config"]).removesuffix(".json")
            info = self.image(image_id)
            if info is None:
                raise EngineError(f"cannot read the layers of {image_id}: it went while it was saved", "try again", "image removed",
                                  host=self.name)
            for path, diff_id in zip(image["Layers"], info.layers):
                by_diff_id[diff_id] = sizes[path]
        return by_diff_id

    def load(self, chunks: Iterable[bytes]) -> Iterator[dict]:
        """``docker load`` of a tar stream; the engine's JSON events (an ``error`` event is the engine's refusal)."""
        what = "load an image"
        answer = self._call(what, self._api.load_image, chunks)
        return (event for event in self._stream(what, answer or ()) if isinstance(event, dict))

    def _events(self, what: str, response, timeout: float | None = None, refusals: bool = False) -> Generator[dict, None, None]:
        """The JSON events of a streamed answer; closing the generator closes the response, and the engine, its client gone, stops.

        With ``timeout``, an answer still streaming after that many seconds is an
        EngineError (each read waits that long at most, too: the request's timeout);
        with ``refusals``, so is an ``error`` event (the registry's or the engine's words).
        """
        api = self._api
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            api._raise_for_status(response)
            for event in api._stream_helper(response, decode=True):
                if deadline is not None and time.monotonic() > deadline:
                    raise self._overrun(what, timeout)
                if refusals and isinstance(event, dict) and "error" in event:
                    reason = last_line(str(event["error"]))
                    raise EngineError(f"the Docker engine refused to {what}: {reason}", "see the engine's message", reason, host=self.name)
                if isinstance(event, dict):
                    yield event
        except ENGINE_FAILURES as err:
            if deadline is not None and time.monotonic() > deadline:
                raise self._overrun(what, timeout) from None
            raise self._error(what, err) from None
        finally:
            response.close()

    def _overrun(self, what: str, timeout: float | None) -> EngineError:
        reason = f"no end within {timeout:.0f} s"
        return EngineError(f"the Docker engine did not {what} within {timeout:.0f} s", "check that the engine and the registry answer",
                           reason, host=self.name)

    def _logins(self, name: str) -> dict[str, str]:
        """The user's registry login for ``name``'s registry (docker login's, or its credential helper's), as a header.

        Given to this machine's engine only: another host's engine gets no credential of this machine's user.
        """
        if not self.local:
            return {}
        header = self._call(f"read the registry login for {name}",
                            lambda: docker.auth.get_config_header(self._api, docker.auth.resolve_repository_name(name)[0]))
        return {"X-Registry-Auth": header} if header else {}

    # --- the one error conversion ----------------------------------------------------------------

    def _inspect(self, fn, what: str, key: str) -> dict | None:
        """``fn(key)``'s answer, or None when the engine says there is no such thing."""
        try:
            return fn(key)
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as err:
            if err.status_code == 404:
                return None
            raise self._error(what, err) from None
        except ENGINE_FAILURES as err:
            raise self._error(what, err) from None

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ENGINE_FAILURES as err:
            raise self._error(what, err) from None

    def _stream(self, what: str, items: Iterable) -> Iterator:
        try:
            yield from items
        except ENGINE_FAILURES as err:
            raise self._error(what, err) from None

    def _error(self, what: str, err: BaseException) -> EngineError:
        """One line for a failed request: the engine's own explanation when it gave one."""
        if isinstance(err, docker.errors.APIError):
            reason = err.explanation or str(err)
            if isinstance(reason, bytes):
                reason = reason.decode(errors="replace")
            reason = last_line(str(reason))
            return EngineError(f"the Docker engine refused to {what}: {reason}",
                               "see the engine's message; `docker info` on the host", reason, host=self.name)
        reason = last_line(str(err)) or type(err).__name__
        kind = EngineLost if isinstance(err, _LOST) else EngineError
        return kind(f"lost the Docker engine while trying to {what}: {reason}",
                    "check that dockerd runs on the host (`invoke facts`) and retry", reason, host=self.name)
