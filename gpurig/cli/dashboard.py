"""The ``dashboard`` task: the team's web page (fleet, live GPUs, jobs, history) served by gpurig itself until Ctrl-C."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from gpurig.cli.options import host_task, select_hosts
from gpurig.errors import ConfigError
from gpurig.report import err_console, outside
from gpurig.strict.validate import excerpt, finite_number, whole_number

if TYPE_CHECKING:
    from pathlib import Path

    from gpurig.flows.fleettask import HostOptions

__all__ = ["dashboard"]

_HELP = {
    "bind": "the address to serve on (default 127.0.0.1: this machine only); another address shares the page with whoever "
            "reaches it and has the token (plain HTTP: use it on a network you trust)",
    "port": "the port (default 0: a free one, printed)",
    "interval": "seconds between the monitor's samples (default 1)",
    "idle_after": "flag a GPU that a process or job holds at under 5% utilisation for this many seconds, naming its holder (default 600)",
    "json": "when the dashboard stops, write the page's last snapshot as JSON to this file (- = stdout); never the token",
    "format": "table (default); the dashboard's data is its page and /api/snapshot",
    "allow_actions": "let the page cancel a running or queued job (as `gpurig cancel`) and stop a container deploy made (as "
                     "`gpurig stop`), after a confirmation; each action is "
                     "recorded in .gpurig/history/actions.jsonl and shown in History. Off by default: the page is read-only and "
                     "refuses every POST (403). Actions need the page's cookie, its own origin and its anti-CSRF header",
    "check": "at start, run provision's check mode on the selected hosts (what `gpurig provision --check` would change; nothing is "
             "changed) and show each host's drift in the fleet table: in step, N steps would change, or unknown with why",
}


@host_task(help=_HELP)
def dashboard(c, opts: HostOptions, bind="127.0.0.1", port=0, interval=None, idle_after=None, allow_actions=False, check=False):
    """Serve the team's web page on this machine: fleet, live GPUs, jobs (with their logs) and history of the selected hosts
    (token in the URL); read-only unless --allow-actions.

    The fleet rows show a Slurm node's state and drain reason, and with --check what provision would change. Its monitor session
    stops containers deployed with idle_stop once their GPUs sat idle that long, as gpurig monitor does.
    """
    from gpurig.dashboard.actions import desk_for
    from gpurig.dashboard.feeds import Feeds
    from gpurig.dashboard.webauth import bind_address, is_loopback, new_token
    from gpurig.dashboard.webserver import Dashboard

    interval_s = finite_number(interval) if interval is not None else 1.0
    if interval_s is None or not 0.2 <= interval_s <= 3600:
        raise ConfigError(f"--interval {excerpt(interval)} is not a number of seconds from 0.2 to 3600", "give --interval a number such as 1")
    idle_s = finite_number(idle_after) if idle_after is not None else 600.0
    if idle_s is None or not 0 <= idle_s <= 366 * 86400:
        raise ConfigError(f"--idle-after {excerpt(idle_after)} is not a number of seconds", "give --idle-after a number such as 600")
    number = whole_number(port)
    if number is None or not 0 <= number <= 65535:
        raise ConfigError(f"--port {excerpt(port)} is not a port number", "give --port a number from 1 to 65535, or 0 for a free one")
    token = new_token()
    address = bind_address(str(bind), token)
    hosts = select_hosts(opts)
    feeds = Feeds(opts, hosts, interval_s, idle_after=idle_s, check=bool(check) or opts.check,
                  say=lambda line: err_console.print(f"idle_stop: {outside(line)}", highlight=False, soft_wrap=True))
    desk = desk_for(opts, bool(allow_actions), changed=lambda: feeds.poke("jobs", "history"), stopped=feeds.container_changed)
    server = Dashboard(feeds, token, address, number, desk=desk)  # the port is taken before any host is contacted
    url_file = None
    try:
        feeds.start()
        server.serve()
        if not is_loopback(address):
            err_console.print(f"[yellow]note[/] serving on {outside(address)}: whoever has the URL below sees the page; "
                              "plain HTTP, so use it on a network you trust")
        url_file = _tell_url(server.url(token), server.url(), opts)
        mode = "actions allowed (cancel, stop), each recorded in the history" if allow_actions else "read-only"
        err_console.print(f"dashboard of {len(hosts)} host{'s' if len(hosts) != 1 else ''}, {mode}: Ctrl-C stops it")
        import threading

        threading.Event().wait()
    except KeyboardInterrupt as stop:
        if getattr(stop, "exit_code", 130) != 130:
            raise  # SIGTERM: ends as every task does (143), after the cleanup below
    finally:
        server.close()
        left = feeds.stop()
        if url_file is not None:
            url_file.unlink(missing_ok=True)
        if opts.json:
            from gpurig.files import write_report

            write_report(opts.json, feeds.document()[0])
        if left:
            err_console.print(f"[yellow]note[/] still ending: {', '.join(left)}")
    err_console.print("dashboard stopped")


def _tell_url(with_token: str, bare: str, opts: HostOptions) -> Path | None:
    """The URL with its token, to the terminal only: on stderr when it is one, else into a file only this user reads (its path said)."""
    if sys.stderr.isatty():
        err_console.print(f"dashboard: {with_token}", highlight=False, soft_wrap=True)
        return None
    import os

    folder = opts.settings.project / ".gpurig" / "dashboard"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{bare.rsplit(':', 1)[1].strip('/')}.url"
    path.unlink(missing_ok=True)  # one left by a dashboard that was killed: made afresh, so its mode is 0600
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(with_token + "\n")
    err_console.print(f"dashboard: {bare} (not a terminal: the URL with its token is in {outside(path)}, readable by you only)")
    return path
