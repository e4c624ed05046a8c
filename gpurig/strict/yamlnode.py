"""A YAML value with its key path: typed accessors that refuse, never coerce, with one line naming file, key and rule.

Values are checked by the ``*_problem`` functions of gpurig/strict/validate.py (or
any ``Check``: value -> rule broken, or None); error messages quote a value
only as a short escaped excerpt, and name an unknown key only when it looks
like a key (a spec path may be a link to some other file).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpurig.errors import GpurigError, did_you_mean
from gpurig.strict import validate

Check = Callable[[str], "str | None"]
# No legitimate value (URL, requirement, path) is longer; a longer one only costs memory and log space.
MAX_TEXT = 1024
# A key in an error line's path: longer ones are cut, as values are (validate.excerpt).
MAX_KEY_SHOWN = 64


class Node:
    """A YAML value with its key path, so every error can say where it is."""

    def __init__(self, source: str | Path, path: str, value: Any, error: type[GpurigError] = GpurigError) -> None:
        # source: the file, or what errors name in its place ("inventory: host h"); only ever shown
        self.source, self.path, self.value, self.error = source, path, value, error

    def child(self, key: str | int, value: Any) -> Node:
        if isinstance(key, int):
            return Node(self.source, f"{self.path}[{key}]", value, self.error)
        if len(key) > MAX_KEY_SHOWN:  # a key is data too: a 10,000-character one was echoed whole into the error line
            key = validate.excerpt(key)
        return Node(self.source, f"{self.path}.{key}" if self.path else key, value, self.error)

    def fail(self, problem: str, fix: str) -> GpurigError:
        """The error to raise: file, key path, the rule and its fix, on one line."""
        where = f"{self.source}: {self.path}" if self.path else str(self.source)
        return self.error(f"{where}: {problem}", fix)

    def mapping(self, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, Node]:
        if self.value is None:
            self.value = {}
        if not isinstance(self.value, dict):
            raise self.fail(f"expected a mapping, got {_kind(self.value)}", f"write keys {', '.join(allowed)}")
        for key in self.value:
            if key not in allowed:
                # Name the key only when it looks like one: a spec path may be a link to some other file,
                # whose first line must not end up in a terminal or a CI log.
                if isinstance(key, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,39}", key):
                    named = f"unknown key {key!r}{did_you_mean(key, allowed)}"
                else:
                    named = f"a key that is not one of this mapping's names ({_kind(key)})"
                raise self.fail(named, f"valid keys here: {', '.join(allowed)}")
        for key in required:
            if key not in self.value:
                raise self.fail(f"missing key {key!r}", f"add {key}: ...")
        return {k: self.child(k, v) for k, v in self.value.items()}

    def of_type(self, types: type | tuple[type, ...], want: str, fix: str) -> Any:
        """The value when it is of ``types`` (``want`` says which, in words); for documents with keys nobody lists, a report's."""
        if isinstance(self.value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise self.fail(f"expected {want}, got {_kind(self.value)}", fix)
        if not isinstance(self.value, types):
            raise self.fail(f"expected {want}, got {_kind(self.value)}", fix)
        return self.value

    def text(self, check: Check, example: str) -> str:
        """A string that passes ``check``; numbers, lists and overlong values are refused, never coerced."""
        value = self.value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # YAML reads 3.10 as the float 3.1: refuse rather than guess
            raise self.fail(f"{validate.excerpt(value)} is a number", f"quote it: \"{example}\"")
        if not isinstance(value, str):
            raise self.fail(f"expected a string, got {_kind(value)}", f"write e.g. {example!r}")
        if len(value) > MAX_TEXT:
            raise self.fail(f"a value of {len(value)} characters (at most {MAX_TEXT})", f"write e.g. {example!r}")
        # Every text value is one line of printable text, whatever its own rule: a control character
        # in a model name or a tag would reach a terminal, a log or a label.
        problem = check(value) or validate.free_text_problem(value)
        if problem:
            raise self.fail(f"{validate.excerpt(value)} {problem}", f"write e.g. {example!r}")
        return value

    def optional_text(self, check: Check, example: str, default: str = "") -> str:
        """text(), where null or "" means the default (a setting left empty)."""
        if self.value is None or self.value == "":
            return default
        return self.text(check, example)

    def items(self, example: str) -> list[Node]:
        if self.value is None:
            return []
        if not isinstance(self.value, list):
            raise self.fail(f"expected a list, got {_kind(self.value)}", f"write e.g. [{example}]")
        return [self.child(i, v) for i, v in enumerate(self.value)]

    def strings(self, check: Check, example: str) -> tuple[str, ...]:
        """A list of distinct strings, each passing ``check``."""
        seen: dict[str, int] = {}
        for i, item in enumerate(self.items(example)):
            value = item.text(check, example)
            if value in seen:
                raise item.fail(f"{validate.excerpt(value)} is listed twice (also at [{seen[value]}])", "remove the duplicate")
            seen[value] = i
        return tuple(seen)

    def integer(self, low: int, high: int, example: str) -> int:
        value = self.value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"expected a whole number, got {_kind(value)}", f"write e.g. {example}")
        if not low <= value <= high:
            raise self.fail(f"{validate.excerpt(value)} is out of range ({low}-{high})", f"write e.g. {example}")
        return value

    def boolean(self, example: str) -> bool:
        if not isinstance(self.value, bool):
            raise self.fail(f"expected true or false, got {_kind(self.value)}", f"write {example}")
        return self.value

    def duration(self, example: str) -> int:
        """Seconds, from a duration as people write one (``4h``, ``90m``, ``1h30m``, ``2d``: validate.duration_seconds)."""
        seconds = validate.duration_seconds(self.value)
        if seconds is None:
            raise self.fail(f"{validate.excerpt(self.value)} is not a duration",
                            f"write e.g. {example} (whole numbers with d, h, m or s: 90m, 1h30m, 2d)")
        return seconds

    def ports(self) -> tuple[int, ...]:
        ports = []
        for item in self.items("22, 8888"):
            problem = validate.port_problem(item.value)
            if problem:
                raise item.fail(f"{validate.excerpt(item.value)} {problem}", "write e.g. [22, 8888]")
            if item.value in ports:
                raise item.fail(f"port {item.value} is listed twice", "remove the duplicate")
            ports.append(item.value)
        return tuple(ports)


def _kind(value: Any) -> str:
    """A value's YAML kind, for messages that must not quote it."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "a mapping"}
    return "nothing (null)" if value is None else names.get(type(value), type(value).__name__)
