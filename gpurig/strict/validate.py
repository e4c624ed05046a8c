"""Grammar checks for values that come from users' files and flags.

Each ``*_problem`` function returns ``None`` for a valid value or the rule it
breaks, in words ("contains a shell metacharacter"), for the caller to put in
its one-line error beside the file and key. Every pattern is matched whole
(``re.fullmatch``): ``$`` would let a trailing newline through.
"""

from __future__ import annotations

import ipaddress
import math
import re
from urllib.parse import urlsplit, urlunsplit

_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_DNS_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
_SHELL_META = set(";|&<>$`\\\"'*?()[]{}!#~")
_DEB_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(?::[a-z0-9-]+)?(?:=[A-Za-z0-9.+:~-]+)?")
_URL_FORBIDDEN = set(" \t\r\n\v\f\"'<>\\^`{|}")
# distribution/reference's grammar: [domain[:port]/]path-components[:tag][@digest]
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?"
_IMAGE_REF = re.compile(
    rf"(?:{_IMAGE_DOMAIN}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
_REGISTRY = re.compile(rf"{_IMAGE_DOMAIN}(?:/{_IMAGE_COMPONENT})*")
# ASCII only: \w would take 'é' or '١', which Docker refuses (after the hosts were contacted)
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# Numbers as people type them, in ASCII digits only: str.isdigit() takes '²' and '١٢', which int() then refuses or reads.
_WHOLE = re.compile(r"[0-9]{1,18}")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][+-]?[0-9]{1,3})?")
# What a terminal acts on: C0 and C1 controls (ESC starts every escape sequence), DEL, and the
# bidirectional overrides that make text read differently from what it is.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _control(value: str) -> bool:
    return any(ord(ch) < 32 or 127 <= ord(ch) <= 159 for ch in value)


def whole_number(value: object, high: int = 10**18) -> int | None:
    """A whole number typed as text (or given as an int) from 0 to ``high``; None for anything else.

    The one reading of a count, port or index from a flag, a variable or a
    host's output: ASCII digits only, at most 18 of them.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value if 0 <= value <= high else None
    if not isinstance(value, str) or not _WHOLE.fullmatch(value):
        return None
    number = int(value)
    return number if number <= high else None


def finite_number(value: object) -> float | None:
    """A finite number typed as text ("0.5", "1e3") or given as an int or float; None for anything else.

    ASCII digits only, never nan or inf, and nothing whose float would overflow.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) < 10**300 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if not isinstance(value, str) or not _DECIMAL.fullmatch(value):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


_DURATION = re.compile(r"(?:[0-9]{1,6}[dhms])+")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
MAX_DURATION_S = 366 * 86400


def duration_seconds(value: object) -> int | None:
    """A duration as people write one (``4h``, ``90m``, ``1h30m``, ``2d``, ``45s``: whole numbers, each with its unit d, h, m or s)
    in seconds, above 0 and at most a year; None for anything else (a bare number, whose unit nobody can tell, included)."""
    if not isinstance(value, str) or not _DURATION.fullmatch(value):
        return None
    seconds = sum(int(n) * _UNIT_S[u] for n, u in re.findall(r"([0-9]+)([dhms])", value))
    return seconds if 0 < seconds <= MAX_DURATION_S else None


def duration_text(seconds: float) -> str:
    """Seconds as a duration written back: 14400 -> 4h, 14520 -> 4h02m, 90 -> 1m30s, 172800 -> 2d."""
    s = int(seconds)
    days, hours, minutes, secs = s // 86400, s % 86400 // 3600, s % 3600 // 60, s % 60
    if days:
        return f"{days}d" + (f"{hours:02d}h" if hours or minutes else "") + (f"{minutes:02d}m" if minutes else "")
    if hours:
        return f"{hours}h" + (f"{minutes:02d}m" if minutes else "")
    if minutes:
        return f"{minutes}m" + (f"{secs:02d}s" if secs else "")
    return f"{secs}s"

def printable(text: object, newlines: bool = False) -> str:
    """``text`` safe to put on a terminal or in a log: every control character (ESC included) shown as an escape.

    For text that came from outside (host names, notes, a host's output,
    recorded runs): a terminal escape sequence in it is shown, not obeyed.
    ``newlines``: keep line breaks and tabs (a multi-line table cell); a carriage return is always shown.
    """
    text = str(text)

    def shown(match: re.Match) -> str:
        ch = match.group()
        if newlines and ch in "\n\t":
            return ch
        return f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}"

    return _UNPRINTABLE.sub(shown, text)


def free_text_problem(value: object) -> str | None:
    """Free text (a model name, a note): one line, no control characters."""
    if not isinstance(value, str):
        return "must be text"
    if _UNPRINTABLE.search(value):
        return "contains a control character"
    return None


def container_name_problem(value: object) -> str | None:
    """A Docker container name: letters, digits, '_', '.', '-', not starting with one of '_.-'."""
    if not isinstance(value, str) or not _CONTAINER_NAME.fullmatch(value):
        return "is not a container name (letters, digits, '_', '.', '-', at most 128)"
    return None


def excerpt(value: object, limit: int = 40) -> str:
    """A short, escaped rendering of a user's value for an error message (never more than ``limit`` chars).

    A URL's user:password@ is left out: an error line ends up in terminals and CI logs.
    """
    if isinstance(value, str) and "://" in value and "@" in value:
        value = strip_userinfo(value)
    if isinstance(value, int) and value.bit_length() > 4 * limit:  # repr() of a huge int is slow, or refused past 4300 digits
        return f"a number of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value)
    if len(text) <= limit:
        return text
    # a string keeps its closing quote so the excerpt reads as one value
    return text[: limit - 4] + "...'" if isinstance(value, str) else text[: limit - 3] + "..."


def matches(pattern: re.Pattern, value: object) -> bool:
    """``value`` is a string matched whole by ``pattern`` (no trailing newline slips through)."""
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def hostname_problem(value: object) -> str | None:
    """A DNS name, IPv4 address, IPv6 address or [IPv6]; nothing a shell or ssh option parser could act on."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty host name or address"
    if len(value) <= 253 and _DNS_NAME.fullmatch(value):
        return None  # the common case, decided by one regex: only letters, digits, '_', '-' and dots
    if _control(value) or any(ch.isspace() for ch in value):
        return "contains whitespace or a control character"
    if value.startswith("-"):
        return "starts with '-' (it would be read as an option)"
    if any(ch in _SHELL_META for ch in value.replace("[", "").replace("]", "")) or "%" in value:
        return "contains a shell metacharacter"
    bare = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        address = None
    if bare != value:
        # brackets are for IPv6 only: ssh would take "[10.0.0.1]" as a name, not an address
        return None if address is not None and address.version == 6 else "is bracketed but not an IPv6 address"
    if address is not None:
        return None
    if len(value) > 253 or not _DNS_NAME.fullmatch(value):
        return "is not a valid host name (letters, digits, '-', '_' and dots) or IP address"
    return None


def user_problem(value: object) -> str | None:
    """A login name: letters, digits, '_', '.', '-', at most 32, not starting with '-'."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty user name"
    if _control(value) or any(ch.isspace() for ch in value):
        return "contains whitespace or a control character"
    if value.startswith("-"):
        return "starts with '-' (it would be read as an option)"
    if not _USER.fullmatch(value):
        return "is not a valid user name (letters, digits, '_', '.', '-', at most 32)"
    return None


def port_problem(value: object) -> str | None:
    """A TCP port: an integer (not a bool, not a float) from 1 to 65535."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "must be a whole number (a TCP port such as 22)"
    if not 0 < value < 65536:
        return "is out of range (1-65535)"
    return None


def debian_package_problem(value: object) -> str | None:
    """A Debian package name, optionally with :arch and =version (Debian policy 5.6.1 / 5.6.12)."""
    if not isinstance(value, str) or not _DEB_PACKAGE.fullmatch(value):
        return "is not a Debian package name (lowercase letters, digits, '+', '-', '.'; optional =VERSION)"
    return None


def url_problem(value: object, schemes: tuple[str, ...] = ("http", "https")) -> str | None:
    """An absolute URL with one of ``schemes``, a host, and no whitespace, quotes or shell-special characters."""
    if not isinstance(value, str) or not value:
        return "must be a URL"
    if _control(value) or any(ch in _URL_FORBIDDEN for ch in value):
        return "contains whitespace, a quote or a character not allowed in a URL"
    if value.startswith("-"):
        return "starts with '-' (it would be read as an option)"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in schemes:
        return f"must start with {' or '.join(s + '://' for s in schemes)}"
    if not parts.hostname:
        return "has no host"
    if "#" in value:
        return "has a #fragment (no index, mirror or registry uses one)"
    return None


def image_ref_problem(value: object) -> str | None:
    """An image reference as Docker parses it: [registry[:port]/]name[:tag][@digest], lowercase path."""
    if not isinstance(value, str) or len(value) > 255 or not _IMAGE_REF.fullmatch(value):
        return "is not an image reference such as debian:bookworm-slim or registry.example.com:5000/ml/base:1"
    return None


def registry_problem(value: object) -> str | None:
    """A registry with an optional path: host[:port][/path]."""
    if not isinstance(value, str) or len(value) > 255 or not _REGISTRY.fullmatch(value):
        return "is not a registry such as registry.example.com:5000/ml"
    return None


def tag_problem(value: object) -> str | None:
    """An image tag: letters, digits, '_', '.', '-', at most 128, not starting with '.' or '-'."""
    if not isinstance(value, str) or not _TAG.fullmatch(value):
        return "is not a valid image tag (letters, digits, '_', '.', '-', at most 128)"
    return None


def strip_userinfo(url: str) -> str:
    """``url`` without ``user:password@``: what may be recorded in labels, reports and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def path_problem(value: object) -> str | None:
    """A local path gpurig itself opens: no control characters, not starting with '-'."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty path"
    if _control(value):
        return "contains a control character"
    if value.startswith("-"):
        return "starts with '-' (it would be read as an option)"
    return None


def find_links_problem(value: object) -> str | None:
    """A pip --find-links source: an http(s) URL, or a local directory path."""
    if isinstance(value, str) and "://" in value:
        return url_problem(value)
    return path_problem(value)


def pip_requirement_problem(value: object) -> str | None:
    """A PEP 508 requirement (name, extras, versions, markers); never a pip option such as -r or --index-url."""
    from packaging.requirements import InvalidRequirement, Requirement

    if not isinstance(value, str) or not value.strip():
        return "must be a package requirement such as numpy or numpy>=2"
    if value.lstrip().startswith("-"):
        return "starts with '-': pip would read it as an option (set indexes under build:, not in package lists)"
    if _control(value):
        return "contains a control character"
    try:
        requirement = Requirement(value)
    except InvalidRequirement:
        return "is not a package requirement (PEP 508) such as numpy, numpy>=2 or jupyterlab[full]==4.*"
    if requirement.url is not None and url_problem(requirement.url):
        return "names a URL that is not http(s)"
    return None


def placeholders_problem(value: object, fields: tuple[str, ...]) -> str | None:
    """A str.format template whose only replacement fields are bare ``{name}`` from ``fields``.

    No format spec, conversion, index or attribute: ``{variant:>1500000000}``
    would pad to 1.5 GB, ``{variant.__class__}`` would reach into objects.
    """
    import string

    if not isinstance(value, str):
        return "must be a string"
    try:
        parsed = list(string.Formatter().parse(value))
    except ValueError:
        return "has an unbalanced '{' or '}' (write {{ or }} for a literal brace)"
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in fields:
            return f"uses an unknown field {excerpt('{' + name + '}', 30)} (allowed: {', '.join('{' + f + '}' for f in fields)})"
        if spec or conversion:
            return f"formats {{{name}}} with a conversion or width (write plain {{{name}}})"
    return None


def debian_suite_problem(value: object) -> str | None:
    """A Debian or Ubuntu suite / codename such as bookworm or bookworm-backports."""
    if not isinstance(value, str) or not re.fullmatch(r"[a-z][a-z0-9.-]{0,39}", value):
        return "is not a suite name such as bookworm"
    return None
