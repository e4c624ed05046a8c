"""Whether a path is ignored by a tree's gitignore-syntax files, with git's semantics (https://git-scm.com/docs/gitignore).

Each pattern is compiled once into a regex over bytes, because git's wildmatch
compares bytes: ``?`` is one byte, so it does not match a two-byte ``é``, and
names that are not UTF-8 still match as git would. A path's subject is the
path relative to the ignore file's directory with a NUL byte appended when the
path is a directory (NUL cannot occur in a name), so "directories only" is part
of the regex instead of a test in Python. Each file's patterns are combined
into two alternations, last pattern first, one matched against the base name
(patterns without a slash) and one against the relative path; the first
alternative to match is the last matching pattern, which decides.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from gpurig.jobs.charclass import byte_set, char_class

_BACKSLASH, _SLASH, _STAR, _QUESTION, _LBRACKET, _RBRACKET = (ord(c) for c in "\\/*?[]")
_NUL = b"\x00"
_ONE, _MANY, _DIRS = "one", "many", "dirs"  # a byte of a set; any number of them; "**/" (nothing, or up to a slash)
_ANY_BYTE = frozenset(range(1, 256))
_NAME_BYTE = _ANY_BYTE - {ord("/")}
_REGEX_GAPS = 2
_DIR_MARK = {True: _NUL, False: b""}
_WILD = frozenset(b"*?[\\")
_FS_ENCODING = sys.getfilesystemencoding()  # os.fsencode's, without its per-call overhead: matching calls it for every path


@dataclass(frozen=True)
class Pattern:
    """One line of an ignore file, compiled: where it came from, how it reads, and what it matches."""

    source: str  # the ignore file, as a user names it (e.g. "sub/.gitignore")
    line: int
    text: str  # the line after trailing-space trimming, as written (with its "!" and slashes)
    negated: bool
    dir_only: bool
    basename: bool  # no slash other than a trailing one: matches the name at any depth below the file's directory
    regex: bytes  # over the subject (see the module's docstring), anchored at both ends
    nfa: _Nfa | None = None  # for a pattern with more wildcards than a backtracking regex can try in linear time
    literal: bytes | None = None  # a pattern without wildcards: the name or path it is, looked up instead of tried
    suffix: bytes | None = None  # a name pattern of stars and then no wildcard ("*.pyc"): the ending it asks for


def parse(text: str | bytes, source: str = "") -> tuple[Pattern, ...]:
    """The patterns of one ignore file, in file order; lines that can never match anything are left out."""
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # git skips a UTF-8 byte order mark
    patterns = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw or raw.startswith(b"#"):
            continue  # before the CR goes, as in git: a line of one CR is no blank line, but it matches nothing either
        line = _trim_trailing_spaces(raw[:-1] if raw.endswith(b"\r") else raw)
        pattern = _compile(line, source, number)
        if pattern is not None:
            patterns.append(pattern)
    return tuple(patterns)


def _trim_trailing_spaces(line: bytes) -> bytes:
    """git's trim_trailing_spaces: unescaped trailing spaces go, a backslash keeps the space after it."""
    last_space = -1
    i = 0
    while i < len(line):
        c = line[i]
        if c == 0x20:
            if last_space < 0:
                last_space = i
        elif c == _BACKSLASH:
            i += 1
            if i == len(line):
                return line
            last_space = -1
        else:
            last_space = -1
        i += 1
    return line[:last_space] if last_space >= 0 else line


def _compile(line: bytes, source: str, number: int) -> Pattern | None:
    written = line.decode("utf-8", "backslashreplace")
    negated = line.startswith(b"!")
    body = line[1:] if negated else line
    dir_only = body.endswith(b"/")
    if dir_only:
        body = body[:-1]
    basename = b"/" not in body
    if not basename and body.startswith(b"/"):
        body = body[1:]  # a leading slash only anchors, which every pattern with a slash is anyway
    # git compares a path pattern's literal head (up to the first of *?[\) as a string and wildmatches only the rest, so
    # a "**" right after that head counts as at the start: "a**/b" matches "a/x/b" and "ab". Replicated, being what git does.
    head = 0 if basename else next((k for k, c in enumerate(body) if c in b"*?[\\"), len(body))
    glob = _glob(body, head) if body else None
    if glob is None:
        return None
    regex = glob[0] + (_NUL if dir_only else _NUL + b"?") + rb"\Z"
    gaps = sum(kind != _ONE for kind, _ in glob[1])
    # re backtracks: each wildcard before the last tries every length, so 20 stars against a 60-byte name ran for
    # minutes. Up to two it is at most quadratic in a name or path; past that the pattern runs as an automaton.
    nfa = _Nfa(glob[1], dir_only) if gaps > _REGEX_GAPS else None
    literal = suffix = None
    if not any(c in _WILD for c in body):
        literal = body
    elif basename and body.startswith(b"*") and body.lstrip(b"*") and not any(c in _WILD for c in body.lstrip(b"*")):
        suffix = body.lstrip(b"*")
    return Pattern(source, number, written, negated, dir_only, basename, regex, nfa, literal, suffix)


def _glob(pattern: bytes, start: int = 0) -> tuple[bytes, list[tuple[str, frozenset[int]]]] | None:
    """wildmatch(pattern[start:], WM_PATHNAME) after a literal pattern[:start], as a regex; None for a pattern git can never match
    (an unclosed class, an unknown [:name:], a lone trailing backslash). With it, the same as tokens for ``_Nfa``."""
    out = []
    tokens: list[tuple[str, frozenset[int]]] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == _STAR:
            j = i
            while j < n and pattern[j] == _STAR:
                j += 1
            after_slash = i == start or pattern[i - 1] == _SLASH
            before_slash = j == n or pattern[j] == _SLASH or (pattern[j] == _BACKSLASH and j + 1 < n and pattern[j + 1] == _SLASH)
            if j - i >= 2 and after_slash and before_slash:
                if j < n and pattern[j] == _SLASH:
                    out.append(b"(?:[^\\x00]*/)?")  # "**/": zero or more whole directories
                    tokens.append((_DIRS, _ANY_BYTE))
                    i = j + 1
                    continue
                out.append(b"[^\\x00]*")  # "/**" at the end, or a "**" before an escaped slash: anything, slashes included
                tokens.append((_MANY, _ANY_BYTE))
            else:
                out.append(b"[^/\\x00]*")  # "*", and any other run of stars
                tokens.append((_MANY, _NAME_BYTE))
            i = j
        elif c == _QUESTION:
            out.append(b"[^/\\x00]")
            tokens.append((_ONE, _NAME_BYTE))
            i += 1
        elif c == _LBRACKET:
            parsed = char_class(pattern, i + 1)
            if parsed is None:
                return None
            members, i = parsed
            out.append(byte_set(members))
            tokens.append((_ONE, members))
        elif c == _BACKSLASH:
            if i + 1 == n:
                return None
            out.append(re.escape(pattern[i + 1:i + 2]))
            tokens.append((_ONE, frozenset(pattern[i + 1:i + 2])))
            i += 2
        else:
            out.append(re.escape(pattern[i:i + 1]))
            tokens.append((_ONE, frozenset(pattern[i:i + 1])))
            i += 1
    return b"".join(out), tokens


class _Nfa:
    """A pattern as a bit-parallel automaton: one pass over the subject, whatever the wildcards (as git's wildmatch, never
    exponential). Bit k of the state is "the first tokens up to state k matched"; a byte moves each bit by a shift and a mask."""

    def __init__(self, tokens: list[tuple[str, frozenset[int]]], dir_only: bool) -> None:
        self.dir_only = dir_only
        # (members, state): a byte of members keeps the state put (inside a wildcard), or moves it on to the next one. The
        # byte -> states tables are made per byte as the bytes are met: two tables of 256 for every pattern made 5,000
        # patterns cost 2 s and 60 MB before any path was matched.
        self._stays: list[tuple[frozenset[int], int]] = []
        self._moves: list[tuple[frozenset[int], int]] = []
        self._tables: dict[int, tuple[int, int]] = {}  # byte -> (the states that stay put on it, the states that move on)
        self.skip1 = self.skip2 = 0  # the states that move on one, or two, without a byte (a wildcard matching nothing)
        state = 0
        for kind, members in tokens:
            if kind == _ONE:
                self._moves.append((members, state))
                state += 1
            elif kind == _MANY:
                self._stays.append((members, state))
                self.skip1 |= 1 << state
                state += 1
            else:  # "**/": nothing, or anything up to a slash (the extra state is inside it)
                self.skip1 |= 1 << state
                self.skip2 |= 1 << state
                self._stays.append((_ANY_BYTE, state + 1))
                self._moves.append((frozenset(b"/"), state + 1))
                state += 2
        self.final = 1 << state

    def _table(self, byte: int) -> tuple[int, int]:
        found = self._tables.get(byte)
        if found is None:
            found = self._tables[byte] = (sum(1 << state for members, state in self._stays if byte in members),
                                          sum(1 << state for members, state in self._moves if byte in members))
        return found

    def _closed(self, states: int) -> int:
        while True:
            more = states | (states & self.skip1) << 1 | (states & self.skip2) << 2
            if more == states:
                return states
            states = more

    def match(self, subject: bytes) -> bool:
        """Whether the subject (its NUL mark included, see the module's docstring) matches the whole pattern."""
        is_dir = subject.endswith(_NUL)
        if self.dir_only and not is_dir:
            return False
        states = self._closed(1)
        for byte in subject[:-1] if is_dir else subject:
            stays, moves = self._table(byte)
            states = self._closed(states & stays | (states & moves) << 1)
            if not states:
                return False
        return bool(states & self.final)


class IgnoreFile:
    """One ignore file's patterns, compiled into two alternations (names, paths) tried last pattern first."""

    def __init__(self, directory: str, patterns: tuple[Pattern, ...]) -> None:
        self.directory = directory
        self.patterns = patterns
        # Patterns without wildcards, and "*SUFFIX" name patterns, are looked up by the name, path or ending they ask for:
        # an alternation tries its branches one by one, so 5,000 plain lines against 1,000 files took 8 s.
        # Each key keeps (the last pattern of it, the last one that also matches a file: not dir_only), as git's last match.
        self._literals: tuple[dict[bytes, tuple[int, int]], dict[bytes, tuple[int, int]]] = ({}, {})  # names, paths
        self._suffixes: dict[bytes, tuple[int, int]] = {}
        for k, p in enumerate(patterns):
            if p.nfa is None and p.literal is not None:
                self._index(self._literals[0 if p.basename else 1], p.literal, k, p.dir_only)
            elif p.nfa is None and p.suffix is not None:
                self._index(self._suffixes, p.suffix, k, p.dir_only)
        self._suffix_lengths = sorted({len(suffix) for suffix in self._suffixes})
        self._names = self._alternation([k for k, p in enumerate(patterns) if p.basename])
        self._paths = self._alternation([k for k, p in enumerate(patterns) if not p.basename])
        self._automata = [k for k in range(len(patterns) - 1, -1, -1) if patterns[k].nfa is not None]  # last first

    @staticmethod
    def _index(table: dict[bytes, tuple[int, int]], key: bytes, k: int, dir_only: bool) -> None:
        last, last_for_files = table.get(key, (-1, -1))
        table[key] = (k, last_for_files if dir_only else k)

    def _alternation(self, indexes: list[int]) -> tuple[re.Pattern[bytes], tuple[int, ...]] | None:
        indexes = [k for k in indexes if self.patterns[k].nfa is None and self.patterns[k].literal is None and self.patterns[k].suffix is None]
        if not indexes:
            return None
        order = tuple(reversed(indexes))
        return re.compile(b"|".join(b"(" + self.patterns[k].regex + b")" for k in order)), order

    def _looked_up(self, name: bytes, relative: bytes) -> int:
        """The last literal or suffix pattern that matches (-1: none), by lookups instead of tries."""
        best = -1
        is_dir = name.endswith(_NUL)
        which = 0 if is_dir else 1
        bare_name = name[:-1] if is_dir else name
        for table, subject in zip(self._literals, (bare_name, relative[:-1] if is_dir else relative)):
            if table and (found := table.get(subject)) is not None:
                best = max(best, found[which])
        for length in self._suffix_lengths:
            if length <= len(bare_name) and (found := self._suffixes.get(bare_name[-length:])) is not None:
                best = max(best, found[which])
        return best

    def last_match(self, name: bytes, relative: bytes) -> Pattern | None:
        """The last pattern matching a path, given its subjects: base name and path relative to this file's directory."""
        best = self._looked_up(name, relative)
        for compiled, subject in ((self._names, name), (self._paths, relative)):
            if compiled is not None and (m := compiled[0].match(subject)) is not None and m.lastindex is not None:
                best = max(best, compiled[1][m.lastindex - 1])
        for k in self._automata:
            if k <= best:
                break
            nfa = self.patterns[k].nfa
            if nfa is not None and nfa.match(name if self.patterns[k].basename else relative):
                best = k
                break
        return self.patterns[best] if best >= 0 else None


class IgnoreRules:
    """Every ignore file of a tree by its directory: which pattern decides a path, and whether the path is ignored.

    Paths are posix, relative to the tree's root, without a leading "./".
    Files in deeper directories take precedence; of two files for one
    directory, the one added later does (add .git/info/exclude before the
    root .gitignore, as git ranks them).
    """

    def __init__(self, files: Iterable[tuple[str, str | bytes]] = ()) -> None:
        self._files: dict[str, list[IgnoreFile]] = {}
        self._chains: dict[str, tuple[tuple[int, IgnoreFile], ...]] = {}
        for directory, text in files:
            self.add(directory, text)

    def add(self, directory: str, text: str | bytes, source: str = "") -> None:
        """Take one more ignore file, whose patterns are relative to ``directory`` ("" for the root)."""
        directory = directory.strip("/")
        directory = "" if directory == "." else directory.removeprefix("./")
        named = source or (f"{directory}/.gitignore" if directory else ".gitignore")
        patterns = parse(text, named)
        if patterns:
            self._files.setdefault(directory, []).append(IgnoreFile(directory, patterns))
            self._chains.clear()

    def __bool__(self) -> bool:
        return bool(self._files)

    def _chain(self, parent: str) -> tuple[tuple[int, IgnoreFile], ...]:
        """The files that apply inside ``parent``, deepest first, each with the byte length of its directory's prefix.

        Built from the parent's own chain, which a walk has always asked for first: climbing every level
        for every directory made a tree 2,000 folders deep cost 2,000 x 2,000 steps (21 s).
        """
        missing = []
        directory: str | None = parent
        while directory is not None and directory not in self._chains:  # up to the nearest directory already known
            missing.append(directory)
            directory = directory.rpartition("/")[0] if directory else None
        chain = self._chains[directory] if directory is not None else ()
        for directory in reversed(missing):
            own = self._files.get(directory, ())
            if own:
                cut = len(os.fsencode(directory)) + 1 if directory else 0
                chain = tuple((cut, f) for f in reversed(own)) + chain
            self._chains[directory] = chain
        return chain

    def match(self, path: str, is_dir: bool) -> Pattern | None:
        """The pattern that decides ``path`` itself (possibly a negation), or None; its parent directories are not looked at."""
        parent, _, _ = path.rpartition("/")
        chain = self._chain(parent)
        if not chain:
            return None
        mark = _DIR_MARK[is_dir]
        whole = path.encode(_FS_ENCODING, "surrogateescape")
        name = whole[whole.rfind(b"/") + 1:] + mark
        for cut, ignore_file in chain:
            found = ignore_file.last_match(name, whole[cut:] + mark)
            if found is not None:
                return found
        return None

    def excluded(self, path: str, is_dir: bool) -> bool:
        """Whether ``path``'s own last matching pattern excludes it; for a walk that never enters excluded directories."""
        found = self.match(path, is_dir)
        return found is not None and not found.negated

    def ignored(self, path: str, is_dir: bool) -> bool:
        """Whether git would ignore ``path``: it is excluded, or a directory above it is (which no "!" pattern can undo)."""
        parts = path.split("/")
        return any(self.excluded("/".join(parts[:k]), True) for k in range(1, len(parts))) or self.excluded(path, is_dir)
