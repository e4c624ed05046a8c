"""Package commands every step installs with (apt on Debian and Ubuntu), and Debian version comparison for plans.

Each install first lets dpkg finish what a host lost mid-install left half
done (``dpkg --configure -a``, and a reinstall of a package dpkg was stopped
in the middle of unpacking), waits (bounded, saying so) for another
package manager holding dpkg's or apt's lock instead of failing, and never
asks a question. dpkg runs without a pty of its own: with one it would lead
a session apart from the command's, and an interrupted run could not stop it
with the rest of the command's process group (``gpurig.connect.remotegroup``).
"""

from __future__ import annotations

import re
import shlex

from gpurig.steps.commands import NOTICE

LOCK_WAIT_S = 120
_APT = ("apt-get -q -y -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold")
# A repository that cannot be reached fails fast, once, instead of retrying for minutes.
_FETCH = "-o Acquire::Retries=0 -o Acquire::http::Timeout=20 -o Acquire::https::Timeout=20"
# `locked CMD...` runs CMD; while it fails because another process holds dpkg's or apt's lock it is tried
# again each second, up to LOCK_WAIT_S in all, after one line saying who holds the lock. Its output
# passes through once it ran (a lock error is the whole output of a run that did nothing).
_LOCKED = (
    r"""locked() { waited=0; while :; do out=$("$@" 2>&1) && { [ -z "$out" ] || printf '%s\n' "$out"; return 0; }; rc=$?; """
    r"""case $out in *'locked by another process'*|*'Could not get lock'*) ;; *) printf '%s\n' "$out" >&2; return $rc;; esac; """
    r"""pid=$(printf '%s\n' "$out" | sed -n 's/.*with pid \([0-9][0-9]*\).*/\1/p; s/.*held by process \([0-9][0-9]*\).*/\1/p' | head -n 1); """
    r"""who="another process"; [ -z "$pid" ] || who="$(cat /proc/$pid/comm 2>/dev/null || echo process) (pid $pid)"; """
    r"""if [ $waited -ge @WAIT@ ]; then echo "E: the package lock is still held by $who after @WAIT@ s of waiting" >&2; return $rc; fi; """
    r"""[ $waited -gt 0 ] || echo "@NOTICE@waiting up to @WAIT@ s for the package lock, held by $who" >&2; """
    r"""sleep 1; waited=$((waited+1)); done; }"""
).replace("@WAIT@", str(LOCK_WAIT_S)).replace("@NOTICE@", NOTICE)

# A dpkg stopped at the wrong moment of an unpack leaves the package flagged "reinstall required": `dpkg --configure -a`
# then refuses it ("package is in a very bad inconsistent state; you should reinstall it before attempting configuration")
# and so does every apt run after. Such packages are reinstalled from the lists, and what dpkg left unconfigured is
# configured again; a failure there is the step's failure, with dpkg's reason.
_REINSTALL_BROKEN = (
    "broken=$(dpkg-query -W -f '${db:Status-Eflag} ${binary:Package}\\n' | sed -n 's/^reinstreq //p') && "
    f'{{ [ -z "$broken" ] || locked {_APT} {_FETCH} install --reinstall --no-install-recommends $broken; }} && '
    '{ [ -z "$unfinished$broken" ] || locked dpkg --configure -a; }'
)


def install_command(*packages: str, update: bool = True, guard: str = "", optional: tuple[str, ...] = ()) -> str:
    """One shell line: finish interrupted installs, refresh the lists, check ``guard`` (a shell test), install.

    ``optional`` packages are installed too where this release's apt knows
    them (Debian 13 splits docker-cli out of docker.io; Debian 12 has none).
    """
    words = " ".join(shlex.quote(p) for p in packages)
    steps = ["export DEBIAN_FRONTEND=noninteractive", "unfinished=", "{ locked dpkg --configure -a || unfinished=1; }"]
    if update:
        steps.append(f"locked {_APT} {_FETCH} update")
    steps.append(_REINSTALL_BROKEN)
    if guard:
        steps.append(guard)
    steps.append(f"locked {_APT} {_FETCH} install --no-install-recommends {words}")
    for extra in optional:
        q = shlex.quote(extra)
        steps.append(f"if apt-cache show {q} >/dev/null 2>&1; then locked {_APT} {_FETCH} install --no-install-recommends {q}; fi")
    return _LOCKED + "; " + " && ".join(steps)


def download_command(url: str, path: str) -> str:
    """Fetch ``url`` to ``path`` with apt's own HTTP(S) client (no curl or wget needed on a bare host)."""
    return (f"install -m 0755 -d {shlex.quote(path.rsplit('/', 1)[0])} && "
            f"/usr/lib/apt/apt-helper {_FETCH} download-file {shlex.quote(url)} {shlex.quote(path)} && chmod 0644 {shlex.quote(path)}")


def candidate_guard(package: str, minimum: str, why: str) -> str:
    """A shell test run after ``apt-get update``: fail with one line when apt would install a version below ``minimum``."""
    p, m = shlex.quote(package), shlex.quote(minimum)
    said, why_q = shlex.quote(f"apt would install {package}"), shlex.quote(f"older than {minimum} ({why})")
    return (f'v=$(apt-cache policy {p} | sed -n "s/^ *Candidate: //p"); '
            f'{{ [ -n "$v" ] && [ "$v" != "(none)" ] && dpkg --compare-versions "$v" ge {m}; }} '
            f'|| {{ echo {said} "${{v:-(none)}}," {why_q} >&2; exit 1; }}')


def upstream(version: str) -> tuple[int, ...]:
    """The numeric upstream part of a Debian version: '1:535.247.01-1~deb12u1' -> (535, 247, 1)."""
    m = re.match(r"(?:\d+:)?(\d+(?:\.\d+)*)", version)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def dpkg_arch(machine: str | None) -> str:
    return {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el"}.get(machine or "", machine or "amd64")
