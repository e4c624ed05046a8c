"""Files on hosts: the unified diff a plan shows, and the one command every step writes a file with.

``write_file_command`` is pure: it returns a shell line that, run on the host
(as root where needed), writes the new content to a temp file in the target's
directory, gives it the old file's mode and owner (or ``mode`` for a new
file), keeps a timestamped copy of the old file when asked, and renames it
over the target, so readers see the old file or the whole new one, never
half. The content travels base64-encoded as one quoted argument, so no byte
of it is ever read by a shell.
"""

from __future__ import annotations

import base64
import difflib
import shlex

BACKUP_SUFFIX = ".gpurig-bak"

_WRITE = r"""set -eu
path=$1 data=$2 mode=$3 backup=$4
dir=$(dirname -- "$path")
[ -d "$dir" ] || mkdir -p -m 0755 -- "$dir"
tmp=$(mktemp -- "$dir/.${path##*/}.XXXXXX.gpurig-tmp")
trap 'rm -f -- "$tmp"' EXIT HUP INT TERM
printf '%s' "$data" | base64 -d > "$tmp"
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
"""


def write_file_command(path: str, content: str, *, mode: int = 0o644, backup: bool = True) -> str:
    """A shell line that atomically replaces ``path`` with ``content`` on the host it runs on."""
    data = base64.b64encode(content.encode()).decode()
    return shlex.join(["sh", "-c", _WRITE, "gpurig-write", path, data, f"{mode:04o}", "yes" if backup else "no"])


def unified_diff(path: str, old: str | None, new: str) -> str:
    """``diff -u`` of the host's file (None: it does not exist) and the new content."""
    before = [] if old is None else _lines(old)
    return "".join(
        difflib.unified_diff(before, _lines(new), "/dev/null" if old is None else f"{path} (host)", f"{path} (gpurig)")
    )


def _lines(text: str) -> list[str]:
    return [line + "\n" for line in text.splitlines()]
