"""The test doubles every test shares: a connection that replays recorded answers, and an engine that does the same.

Both stand for what cannot be had in a unit test (a remote host, a Docker
engine on it) and replay outputs recorded from real ones; neither decides
anything the code under test should decide. Import them as ``from fakes import
...`` (tests/ is on sys.path through its conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gpurig.connect.connection import Connection, Result
from gpurig.errors import HostError

# What a scripted command answers: a Result's (exit code, stdout, stderr), or an error to raise.
Answer = tuple[int, str, str] | HostError
Script = Callable[[str], Answer]


class ScriptedConnection(Connection):
    """A real ``Connection`` (so sudo, needs_sudo, admin and error handling are gpurig's own) whose host is a script.

    ``answers`` is either a list, consumed one per command (the last one
    repeats), or a function of the command line. Every line the host was asked
    to run is kept in ``lines``, in order, as it would have reached the shell.
    """

    def __init__(self, name: str = "gpu-01", answers: Iterable[Answer] | Script = ((0, "", ""),), *,
                 user: str | None = "root", become: bool = False, sudo_password: str | None = None, remote: bool = True) -> None:
        super().__init__(name, user=user, become=become, sudo_password=lambda: sudo_password)
        self.remote = remote
        self.streams: list[str] = []  # the lines asked for as streams (the engine's dial-stdio)
        self._script: Script | None = answers if callable(answers) else None
        self._queue: list[Answer] = [] if callable(answers) else list(answers)
        self.lines: list[str] = []
        self._closed = False

    def _execute(self, line: str, shown: str, *, timeout: float | None, on_output: Any, watcher: Any = None, streams: Any = None) -> Result:
        self.lines.append(line)
        if self._script is not None:
            answer = self._script(line)
        else:
            answer = self._queue.pop(0) if len(self._queue) > 1 else self._queue[0]
        if isinstance(answer, HostError):
            raise answer
        exited, out, err = answer
        return Result(self.name, shown, exited, out, err, 0.0)

    def stream_opener(self, line: str) -> Callable[[float | None], object] | None:
        """A remote host's stream that is a closed socket (as dial-stdio is where the engine cannot be reached)."""
        if not self.remote:
            return None
        self.streams.append(line)

        def open_stream(timeout: float | None) -> object:
            raise OSError("Socket is closed")
        return open_stream

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True


class RecordedEngine:
    """What deploy's planning and verify's probe ask of a host's engine, answered from recorded values.

    Containers by name, images by ref; ``ended`` is what every exec or
    throwaway run answers (a recorded ``Exited``, or None for one that overran).
    """

    def __init__(self, containers: Iterable[Any] = (), images: dict[str, Any] | None = None, ended: Any = None,
                 name: str = "gpu-01") -> None:
        self.containers = {c.name: c for c in containers}
        self.images = dict(images or {})
        self.ended = ended
        self.name = name
        self.asked: list[tuple[str, Any]] = []  # ("exec", argv) or ("run", create body), in order

    def __enter__(self) -> RecordedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def exec(self, ref: str, argv: list[str], timeout: float) -> Any:
        self.asked.append(("exec", argv))
        return self.ended

    def run(self, body: dict, name: str, timeout: float) -> Any:
        self.asked.append(("run", body))
        return self.ended

    def container(self, name: str) -> Any:
        return self.containers.get(name)

    def image(self, ref: str) -> Any:
        return self.images.get(ref)
