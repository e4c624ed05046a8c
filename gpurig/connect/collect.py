"""A command's output as it arrives: decoded in pieces, shown to a handler, and sudo's password prompt answered once.

Also where sudo's password from the environment ($GPURIG_SUDO_PASSWORD) is
kept, once taken out of it.
"""

from __future__ import annotations

import codecs
import os
import threading
from collections.abc import Callable

SUDO_PASSWORD_ENV = "GPURIG_SUDO_PASSWORD"
OutputHandler = Callable[[str, str], None]  # (stream name "stdout"|"stderr", text chunk)


class SudoPrompt:
    """Answers sudo's password prompt once; a second prompt means the password was wrong."""

    def __init__(self, prompt: str, password: str) -> None:
        self.prompt = prompt
        self._password = password
        self.asked = 0
        self._seen = ""

    def feed(self, stderr_text: str) -> tuple[bytes | None, bool]:
        """(bytes to send to stdin or None, whether to close stdin) after more stderr arrived."""
        self._seen += stderr_text
        count = self._seen.count(self.prompt)
        if count == self.asked:
            return None, False
        self.asked = count
        if count == 1:
            return (self._password + "\n").encode(), False
        return None, True  # wrong password: end sudo's retries with EOF instead of guessing again

    def clean(self, stderr: str) -> str:
        return stderr.replace(self.prompt, "")


class OutputCollector:
    """Gathers a command's output, decoding incrementally so streamed chunks never split a character."""

    def __init__(self, on_output: OutputHandler | None, watcher: SudoPrompt | None) -> None:
        self.on_output = on_output
        self.watcher = watcher
        self.parts: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._decoders = {k: codecs.getincrementaldecoder("utf-8")("replace") for k in self.parts}

    def add(self, stream: str, data: bytes, final: bool = False) -> tuple[bytes | None, bool]:
        """Record a chunk; returns what to answer on stdin (the sudo password) and whether to close it."""
        text = self._decoders[stream].decode(data, final)
        if not text:
            return None, False
        self.parts[stream].append(text)
        if self.on_output:
            shown = self.watcher.clean(text) if self.watcher else text
            if shown:
                self.on_output(stream, shown)
        if stream == "stderr" and self.watcher:
            return self.watcher.feed(text)
        return None, False

    def text(self, stream: str) -> str:
        return "".join(self.parts[stream])


_ENV_PASSWORD: dict[str, str | None] = {"value": None}
_ENV_LOCK = threading.Lock()


def env_sudo_password() -> str | None:
    """$GPURIG_SUDO_PASSWORD, taken OUT of the environment the first time it is seen.

    Every child gpurig starts (local commands, docker, hadolint, git) inherits
    os.environ: a password left there would reach ``gpurig exec -- env`` and
    its report. It is kept here instead, for the connectors of this process.
    """
    with _ENV_LOCK:
        if SUDO_PASSWORD_ENV in os.environ:
            _ENV_PASSWORD["value"] = os.environ.pop(SUDO_PASSWORD_ENV)
        return _ENV_PASSWORD["value"]
