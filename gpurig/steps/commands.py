"""What a ``Change`` does on a host, as objects: a shell line, a file upload, or a call into Python.

``Shell`` runs a line with the rights the inventory grants
(``Connection.admin``). ``Upload`` puts a file on the host (from a local
file or from text) over SFTP into a fresh private staging folder, then
installs it in place as the administrator with ``install_file_command``:
its bytes never appear in a command line, where ``ps`` would show them.
``Call`` is for what a command line cannot say: waiting for a reboot,
talking to a Docker engine. ``run_change`` runs a change's commands in
order and turns any failure into one ``HostError`` naming the change;
a line a shell command prints on stderr after ``NOTICE`` is logged for the
user as it comes (e.g. that it waits for another apt's lock).
"""

from __future__ import annotations

import logging
import os
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from gpurig.connect.connection import CommandError, CommandInterrupted, CommandTimeout, Connection, ConnectionLost
from gpurig.errors import GpurigError, HostError, error_line, permission_denied

log = logging.getLogger(__name__)
NOTICE = "gpurig-notice: "  # a command's stderr line that starts so is for the user to read while it runs

# Installs the staged file $2 as $1, atomically: readers see the old file or the whole new one, never half.
_INSTALL = r"""set -eu
path=$1 src=$2 mode=$3 backup=$4 stage=${5:-} check=${6:-}
[ -z "$stage" ] || trap 'rm -rf -- "$stage"' EXIT HUP INT TERM
dir=$(dirname -- "$path")
[ -d "$dir" ] || mkdir -p -m 0755 -- "$dir"
owner=$(stat -c %u -- "$dir")
if [ "$owner" != 0 ] && [ "$owner" != "$(id -u)" ]; then
  echo "refusing to write in $dir: it belongs to uid $owner, neither root nor $(id -un)" >&2; exit 1
fi
tmp=$(mktemp -- "$dir/.${path##*/}.XXXXXX.gpurig-tmp")
trap 'rm -f -- "$tmp"; [ -z "$stage" ] || rm -rf -- "$stage"' EXIT HUP INT TERM
cat -- "$src" > "$tmp"
if [ -n "$check" ] && ! said=$(sh -c "$check" gpurig-check "$tmp" 2>&1); then
  # The old file was never touched; the checker's own last line says why it refused the new one.
  line=$(echo "$said" | grep . | tail -n 1)
  case "$line" in *"$tmp"*) line="${line%%"$tmp"*}$path (new)${line#*"$tmp"}" ;; esac
  echo "${check%% *} refused the new $path, the old one stays: $line" >&2
  exit 1
fi
if [ -e "$path" ]; then
  chmod --reference="$path" -- "$tmp"
  chown --reference="$path" -- "$tmp"
  if [ "$backup" = yes ]; then
    cp -p -- "$path" "$path.gpurig-bak.$(date -u +%Y%m%dT%H%M%SZ)"
  fi
else
  chmod "$mode" -- "$tmp"
fi
sync -- "$tmp" 2>/dev/null || sync
mv -f -- "$tmp" "$path"
trap - EXIT HUP INT TERM
[ -z "$stage" ] || rm -rf -- "$stage"
"""


def install_file_command(path: str, staged: str, *, mode: int = 0o644, backup: bool = True, remove: str = "", check: str = "") -> str:
    """A shell line that atomically replaces ``path`` with the file at ``staged`` on the host it runs on.

    The new file gets the old one's mode and owner (``mode`` for a new file);
    a timestamped copy of the old file is kept when ``backup``. A folder that
    belongs to another user than root or the one writing is refused: in a
    shared /tmp another user could have made it first and swap the file.
    ``remove``: the staging folder, removed at the end whatever happened (one round trip less).
    ``check``: a shell line that must accept the new file (its path is ``$1``) before it replaces
    the old one, as Ansible's ``validate``: ``dockerd --validate --config-file "$1"``.
    """
    args = [path, staged, f"{mode:04o}", "yes" if backup else "no", remove, *([check] if check else [])]
    return shlex.join(["sh", "-c", _INSTALL, "gpurig-install", *args])


@dataclass(frozen=True)
class Shell:
    """A shell line, run as the host's administrator; written to be idempotent."""

    line: str

    def __str__(self) -> str:
        return self.line


@dataclass(frozen=True)
class Upload:
    """A file for ``remote`` on the host: a local file (``local``) or text (``content``), never through argv."""

    remote: str
    local: str | None = None
    content: str | None = field(default=None, repr=False)
    mode: int = 0o644  # for a new file; an existing one keeps its own mode and owner
    backup: bool = True  # keep a timestamped copy of the file it replaces
    check: str = ""  # a shell line that must accept the new file ($1) before it replaces the old one

    def __str__(self) -> str:
        return f"upload {self.local or 'new content'} to {self.remote}"


@dataclass(frozen=True)
class Call:
    """Python code that changes the host through its connection: ``fn(conn)``; ``description`` is what a person reads."""

    description: str
    fn: Callable[[Connection], None] = field(compare=False, repr=False)

    def __str__(self) -> str:
        return self.description


Command = Shell | Upload | Call


# Trailers that follow the line saying what went wrong (apt-helper ends "Could not resolve 'host'" with this).
_GENERIC = frozenset({"E: Download Failed"})


def run_change(conn: Connection, summary: str, commands: tuple[Command, ...], *, fix: str = "", timeout: float | None = None) -> None:
    """Run ``commands`` in order; the first that fails raises a HostError: could not <summary>, why, and the fix."""
    for command in commands:
        try:
            if isinstance(command, Shell):
                conn.admin(command.line, timeout=timeout, on_output=_Notices(conn.name))
            elif isinstance(command, Upload):
                _upload(conn, command, timeout)
            else:
                command.fn(conn)
        except CommandError as err:
            # The command line itself (a script, file content) means nothing to a reader: its error line does, whole.
            said = error_line(err.result.stderr.strip() or err.result.stdout.strip(), _GENERIC)
            why = f"exited {err.result.exited}" + (f": {said}" if said else "")
            how = fix or err.fix
            if permission_denied(why) and not conn.become:
                how = "set ansible_become: true for this host (the login user is not root)"
            raise HostError(f"could not {summary}: {why}", how) from None
        except CommandTimeout:
            raise HostError(f"could not {summary}: no end within {timeout or 0:.0f} s; it was stopped on the host",
                            "look at the host (a hung apt or DKMS build?) and run again") from None
        except ConnectionLost:
            if conn.interrupted:  # gpurig closed it on its way out
                raise HostError(f"could not {summary}: interrupted", "run again: the steps pick up where this one stopped") from None
            raise HostError(f"could not {summary}: the connection to the host was lost mid-command",
                            "check that the host is up; run again and the steps pick up where this one stopped") from None
        except CommandInterrupted as err:
            raise HostError(f"could not {summary}: {err.problem}", err.fix) from None
        except HostError as err:
            if isinstance(command, Call):
                raise  # a call's own error says what went wrong
            raise HostError(f"could not {summary}: {err.problem}", fix or err.fix) from None


class _Notices:
    """An output handler that logs each ``NOTICE`` line of stderr as a warning about ``host``."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._held = ""

    def __call__(self, stream: str, text: str) -> None:
        if stream != "stderr":
            return
        *lines, self._held = (self._held + text).split("\n")
        for line in lines:
            if line.startswith(NOTICE):
                log.warning("%s: %s", self.host, line.removeprefix(NOTICE))


def _upload(conn: Connection, upload: Upload, timeout: float | None) -> None:
    # A fresh 0700 folder of the login user's (mktemp -d), never one found there: in a shared /tmp another
    # user could have made it first and swap the file before root installs it.
    staging = conn.run("mktemp -d -t gpurig-upload.XXXXXXXX").stdout.strip()
    if not staging.startswith("/"):  # else the file would be staged as /NAME, at the root
        raise HostError(f"mktemp -d printed no folder to stage {upload.remote} in (it printed {staging[:60]!r})",
                        "check the host's /tmp (full? read-only?) and its login session, then run again")
    staged = f"{staging}/{upload.remote.rsplit('/', 1)[-1]}"
    try:
        if upload.local is not None:
            conn.put(upload.local, staged, mode=0o600)
        else:
            fd, local = tempfile.mkstemp(prefix="gpurig-upload.")  # 0600
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write((upload.content or "").encode())
                conn.put(local, staged, mode=0o600)
            finally:
                os.unlink(local)
    except BaseException:  # nothing of ours stays in /tmp
        try:
            conn.run(["rm", "-rf", "--", staging], warn=True)
        except GpurigError:
            pass
        raise
    # The install command removes the staging folder itself, on failure too: one round trip less.
    conn.admin(install_file_command(upload.remote, staged, mode=upload.mode, backup=upload.backup, remove=staging, check=upload.check),
               timeout=timeout)
