"""The grammar of ``ansible_ssh_common_args`` / ``ansible_ssh_extra_args``: the ssh options gpurig honours, accepts or refuses.

Checked when the inventory loads (so ``gpurig hosts`` and ``gpurig inventory``
refuse a ProxyCommand as ``facts`` does) and read again when a host is
connected to, for its ProxyJump.
"""

from __future__ import annotations

import re
import shlex

from gpurig.strict.validate import excerpt, hostname_problem, port_problem, user_problem, whole_number

# ssh options accepted and not needed: gpurig keeps one connection per host open and sends keepalives itself.
_UNNEEDED_OPTIONS = {
    "controlmaster",
    "controlpersist",
    "controlpath",
    "serveraliveinterval",
    "serveralivecountmax",
    "tcpkeepalive",
    "compression",
}
_UNNEEDED_FLAGS = set("CqT")  # compression, quiet, no pty: nothing gpurig does differently
_OPTION_FIX = {
    "proxycommand": "use -J or -o ProxyJump=HOST instead (gpurig never runs a ProxyCommand)",
    "stricthostkeychecking": "gpurig checks host keys itself: use --host-key-policy strict|accept-new|off",
    "userknownhostsfile": "gpurig keeps host keys in known_hosts beside the inventory and reads ~/.ssh/known_hosts",
    "connecttimeout": "use --connect-timeout",
}
_OPTION = re.compile(r"\s*([A-Za-z]+)\s*(?:=\s*|\s+)(.*)", re.S)
_HOP_FIX = "use a plain host name or address, user name and port; gpurig refuses anything a shell could act on"
_GENERAL_FIX = "remove it; gpurig understands -J / -o ProxyJump= and accepts Control*, ServerAlive*, Compression"


class SSHArgsProblem(ValueError):
    """Why ssh arguments cannot be used (``rule``, said after the variable's name) and what to do (``fix``)."""

    def __init__(self, rule: str, fix: str) -> None:
        super().__init__(rule)
        self.rule, self.fix = rule, fix


def ssh_args_jump(args: object) -> str | None:
    """The ProxyJump in ssh arguments ('-J host' or '-o ProxyJump=host'), None when there is none.

    Options gpurig does not need (Control*, ServerAlive*, Compression, -C -q
    -T) are accepted; any other is refused by name (SSHArgsProblem) rather
    than silently ignored.
    """
    try:
        words = shlex.split(str(args or ""))
    except ValueError as err:
        raise SSHArgsProblem(f"{excerpt(args)} cannot be split into words: {err}", "balance its quotes") from None
    jump = None
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-J", "-o"):
            if i + 1 == len(words):
                raise SSHArgsProblem(f"ends with {word} and no value", f"give {word} its value or remove it")
            value, i = words[i + 1], i + 2
        else:
            value, i = word[2:], i + 1
        if word.startswith("-J"):
            jump = value
        elif word.startswith("-o"):
            m = _OPTION.fullmatch(value)
            option = m.group(1) if m else value.strip()
            if option.lower() == "proxyjump":
                if not m or not m.group(2).strip():
                    raise SSHArgsProblem("-o ProxyJump has no value", "write -o ProxyJump=[user@]host[:port]")
                jump = m.group(2).strip()
            elif option.lower() not in _UNNEEDED_OPTIONS:
                raise SSHArgsProblem(f"option {excerpt(option)} is not supported by gpurig", _OPTION_FIX.get(option.lower(), _GENERAL_FIX))
        elif not (len(word) > 1 and word[0] == "-" and set(word[1:]) <= _UNNEEDED_FLAGS):
            raise SSHArgsProblem(f"{excerpt(word)} is not supported by gpurig", _GENERAL_FIX)
    return jump


def jump_hops(spec: str | None, where: str) -> list[tuple[str, str, int | None, str]]:
    """(user or '', host, port or None, as written) per hop of a ProxyJump spec, each part validated (SSHArgsProblem).

    The one grammar of a jump host: at load (a `$(...)` in a hop passed `gpurig hosts`) and when connecting.
    """
    if not spec or spec == "none":
        return []
    hops = []
    for hop in spec.split(","):
        written = hop
        hop = hop.removeprefix("ssh://")
        user, _, rest = hop.rpartition("@")
        if rest.startswith("["):
            host, _, port = rest[1:].partition("]")
            port = port.removeprefix(":")
        else:
            host, _, port = rest.partition(":")
        what = f"jump host {excerpt(written)} in {where}"
        _refuse(what, host, hostname_problem)
        if user:
            _refuse(f"user of {what}", user, user_problem)
        number = whole_number(port, 99999) if port else None
        if port:
            _refuse(f"port of {what}", port if number is None else number, port_problem)
        hops.append((user, host, number, written))
    return hops


def _refuse(what: str, value: object, problem) -> None:
    rule = problem(value)
    if rule:
        raise SSHArgsProblem(f"{what} {excerpt(value)} {rule}", _HOP_FIX)
