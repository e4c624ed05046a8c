"""gitignore's bracket expressions (``[a-z]``, ``[!/]``, ``[[:alpha:]]``) as the set of bytes they match, as git's wildmatch reads
them, and a set of bytes as a regex class; for gpurig.jobs.ignore."""

from __future__ import annotations

from collections.abc import Callable

_BACKSLASH, _SLASH, _LBRACKET, _RBRACKET = (ord(c) for c in "\\/[]")


def _ascii(test: Callable[[str], bool]) -> frozenset[int]:
    return frozenset(c for c in range(128) if test(chr(c)))


# wildmatch's classes use git's own ASCII-only ctype, whose space is tab, newline, CR and space (no \v, \f).
_SPACE = frozenset(b"\t\n\r ")
_PRINT = frozenset(range(0x20, 0x7F))
_NAMED: dict[bytes, frozenset[int]] = {
    b"alnum": _ascii(lambda c: c.isascii() and c.isalnum()),
    b"alpha": _ascii(lambda c: c.isascii() and c.isalpha()),
    b"blank": frozenset(b" \t"),
    b"cntrl": frozenset(range(0x20)) | {0x7F},
    b"digit": frozenset(b"0123456789"),
    b"graph": _PRINT - _SPACE,
    b"lower": frozenset(b"abcdefghijklmnopqrstuvwxyz"),
    b"print": _PRINT,
    b"punct": frozenset(b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    b"space": _SPACE,
    b"upper": frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    b"xdigit": frozenset(b"0123456789abcdefABCDEF"),
}


def char_class(pattern: bytes, i: int) -> tuple[frozenset[int], int] | None:
    """The bytes a ``[...]`` starting at ``i`` (just after the ``[``) matches, and where it ends; a port of wildmatch's loop."""
    n = len(pattern)
    if i >= n:
        return None
    ch = pattern[i]
    negated = ch in b"!^"
    if negated:
        i += 1
        if i >= n:
            return None
        ch = pattern[i]
    members: set[int] = set()
    prev = 0
    while True:
        if ch == _BACKSLASH:
            i += 1
            if i >= n:
                return None
            ch = pattern[i]
            members.add(ch)
        elif ch == ord("-") and prev and i + 1 < n and pattern[i + 1] != _RBRACKET:
            i += 1
            ch = pattern[i]
            if ch == _BACKSLASH:
                i += 1
                if i >= n:
                    return None
                ch = pattern[i]
            members.update(range(prev, ch + 1))  # a reversed range is empty, as in git
            ch = 0  # a range cannot start a range
        elif ch == _LBRACKET and i + 1 < n and pattern[i + 1] == ord(":"):
            start = i + 2
            end = pattern.find(b"]", start)
            if end < 0:
                return None
            if end - start - 1 < 0 or pattern[end - 1] != ord(":"):
                members.add(_LBRACKET)  # no ":]": the "[" is an ordinary member and the scan goes on after it
            else:
                named = _NAMED.get(pattern[start:end - 1])
                if named is None:
                    return None  # git gives up on the whole pattern for an unknown [:name:]
                members |= named
                i = end
                ch = 0
        else:
            members.add(ch)
        prev = ch
        i += 1
        if i >= n:
            return None
        ch = pattern[i]
        if ch == _RBRACKET:
            break
    chosen = frozenset(range(256)) - members if negated else frozenset(members)
    return chosen - {_SLASH, 0}, i + 1


def byte_set(members: frozenset[int]) -> bytes:
    if not members:
        return b"(?!)"
    ranges: list[tuple[int, int]] = []
    run: list[int] = []
    for c in sorted(members):
        if run and c == run[-1] + 1:
            run.append(c)
        else:
            if run:
                ranges.append((run[0], run[-1]))
            run = [c]
    ranges.append((run[0], run[-1]))
    parts = (f"\\x{a:02x}" if a == b else f"\\x{a:02x}-\\x{b:02x}" for a, b in ranges)
    return ("[" + "".join(parts) + "]").encode()
