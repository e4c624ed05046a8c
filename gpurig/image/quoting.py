"""Quoting values for the places templates put them, and a seal that makes forgetting to quote an error.

Everything render.py hands to a template is *sealed* (``seal``): strings come
out of it as ``Sealed`` objects, which compare, hash and test true like their
text but refuse to become text by any other way than these filters:

- ``sh``: shell words, for RUN lines and shell scripts (``shlex.quote`` each,
  a list becomes space-separated words);
- ``dq``: a Dockerfile double-quoted value, for ENV and LABEL (``\\``, ``"``
  and ``$`` escaped: BuildKit expands variables in them);
- ``word``: a bare token where no quoting exists (FROM, WORKDIR, comments,
  sshd_config): inert characters only, anything else is refused.

``{{ value }}`` without a filter, ``~`` concatenation, ``join``, ``format``
and every other path to text raise ``UnquotedValue`` instead of emitting the
value raw. No filter can write a line break into a Dockerfile (it would start
a new instruction): a value with a control character is refused by all three.
Template text itself is trusted; only values are sealed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from typing import Any

import jinja2

from gpurig.errors import RenderError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_INERT = re.compile(r"[][A-Za-z0-9_.:/@+=,%-]*")  # brackets: an IPv6 registry [::1]:5000


class UnquotedValue(RenderError):
    """A template emitted a value without a quoting filter."""


def _refuse() -> UnquotedValue:
    return UnquotedValue(
        "a template emits a value without a quoting filter",
        "pipe it through | sh (shell), | dq (Dockerfile ENV/LABEL value) or | word (bare token)",
    )


class Sealed:
    """A string from the spec, the project or the host: text only through a quoting filter."""

    __slots__ = ("_text",)

    def __init__(self, text: str) -> None:
        self._text = text

    def __str__(self) -> str:
        raise _refuse()

    __format__ = __html__ = __str__  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "<sealed text>"

    def __bool__(self) -> bool:
        return bool(self._text)

    def __eq__(self, other: object) -> bool:
        return self._text == (other._text if isinstance(other, Sealed) else other)

    def __hash__(self) -> int:
        return hash(self._text)


class SealedObject:
    """An object whose attributes come out sealed (a dataclass of the spec, a matrix entry)."""

    __slots__ = ("_target",)

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return seal(getattr(self._target, name))

    def __str__(self) -> str:
        raise _refuse()

    __format__ = __html__ = __str__  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "<sealed object>"


def seal(value: Any) -> Any:
    """``value`` with every string in it sealed; numbers, booleans and None pass as they are."""
    if value is None or isinstance(value, (bool, int, float, Sealed, SealedObject)):
        return value
    if isinstance(value, (str, os.PathLike)):
        return Sealed(os.fspath(value))
    if isinstance(value, (list, tuple)):
        return type(value)(seal(v) for v in value)
    if isinstance(value, dict):
        return {seal(k): seal(v) for k, v in value.items()}
    if callable(value) and not dataclasses.is_dataclass(value):
        return lambda *args, **kwargs: seal(value(*(_unseal(a) for a in args), **{k: _unseal(v) for k, v in kwargs.items()}))
    return SealedObject(value)


def _unseal(value: Any) -> Any:
    return value._text if isinstance(value, Sealed) else value


def _texts(value: Any, context: str) -> list[str]:
    """The texts of a value or a list of values, none with a control character."""
    items = value if isinstance(value, (list, tuple)) else [value]
    texts = []
    for item in items:
        if isinstance(item, SealedObject) or item is None or isinstance(item, bool):
            raise RenderError(f"| {context} got {type(item).__name__}, not text", "pass a string, number or list")
        text = item._text if isinstance(item, Sealed) else str(item)
        if _CONTROL.search(text):
            raise RenderError(
                f"a value with a line break or control character cannot be written into a {context} context",
                "fix the value in the spec (load_spec should have refused it: report this)",
            )
        texts.append(text)
    return texts


def sh(value: Any) -> str:
    """Shell words: each value single-quoted where needed, a list joined by spaces."""
    return " ".join(shlex.quote(t) for t in _texts(value, "sh"))


def dq(value: Any) -> str:
    """A Dockerfile double-quoted value: BuildKit unescapes \\\\, \\" and \\$ and expands nothing."""
    return " ".join('"' + re.sub(r'([\\"$])', r"\\\1", t) + '"' for t in _texts(value, "dq"))


def word(value: Any) -> str:
    """A bare token (FROM, WORKDIR, comments, sshd_config): only characters no parser acts on."""
    texts = _texts(value, "word")
    for text in texts:
        if not _INERT.fullmatch(text):
            raise RenderError(
                f"{text[:40]!r} cannot stand unquoted where the template puts it",
                "use letters, digits and . _ : / @ + = , % - [ ] only",
            )
    return " ".join(texts)


def finalize(value: Any) -> Any:
    """Jinja's finalize hook: only text (template text, filter output) and numbers reach the output.

    A sealed value, or a list or mapping that may hold some, must go through a filter first.
    """
    if isinstance(value, (str, jinja2.Undefined)) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value  # an Undefined says itself what is missing (StrictUndefined raises)
    raise _refuse()


FILTERS = {"sh": sh, "dq": dq, "word": word}
