"""Benchmark: `gpurig run`'s working-directory sync against `rsync -a --delete` over `ssh`, same tree, same host, same user, same key.

Run as root (it starts an sshd host, a throwaway login user with passwordless
sudo, and a byte-counting TCP proxy in front of the sshd):

    apt-get install -y rsync          # a bench tool only: not a test dependency, not in scripts/setup.sh
    python3 bench/bench_sync.py --runs 5

The tree (about 1 GB by default: ``--big-files`` files of ``--big-size``
random bytes in data/, ``--small-files`` source-like text files of about
``--small-size`` bytes in nested folders under src/) is made once per run.
Four cases per tool, in this order, each timed as a whole command from
interpreter start to exit: the initial sync into an empty destination, a
re-sync with nothing changed, a re-sync after appending a line to one small
file, a re-sync after changing 4 KiB in the middle of one big file
(``--big-edit rewrite``: the whole big file rewritten). Rounds alternate which
tool goes first; the destination is emptied at the start of each tool's round;
each edit touches a file no earlier edit touched.

- gpurig: this checkout (PYTHONPATH), a small client that scans the tree
  (``gpurig.jobs.tree.scan``), opens gpurig's SSH connection from an
  inventory (``ansible_become: true``: the ``manifest`` verb goes through
  sudo, ``apply`` runs as the login user, as for `gpurig run`) and calls
  ``gpurig.jobs.sync.sync`` into ``/srv/gpurig/sync/<user>/<key>/tree/``: what
  `gpurig run` does before it starts a job, without the job's bundle (its
  size is printed: `gpurig run` adds it to every sync's tar).
- rsync: ``rsync -a --delete --stats -e 'ssh ...'`` (OpenSSH's client,
  ``-F /dev/null``, no ControlMaster) into a folder of the login user's home.
- Bytes on the wire: both tools connect to a TCP proxy in this process that
  forwards to the sshd and counts every byte both ways, so SSH's handshake,
  framing, MACs and round trips count the same for both. rsync's own
  ``--stats`` totals and gpurig's tar size are printed beside them.

``--breakdown N`` also times the initial sync's parts alone, N times:
gpurig's initial tar written to /dev/null, piped through OpenSSH's client
and through gpurig's paramiko connection into ``cat > /dev/null``, and
extracted on the host, without SSH, by the job agent's ``apply`` and by GNU
tar.

The login user's shell is /bin/sh (root's ~/.bashrc runs pyenv on this
machine and would swamp every command). Everything the bench starts is
removed when it ends: sshd, proxy, user, sudoers entry, trees, both
destinations.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH_USER = "gpurigbench"  # bench_facts.py's throwaway user
SUDOERS = Path(f"/etc/sudoers.d/{BENCH_USER}-sync-bench")
SYNC_ROOT = Path("/srv/gpurig/sync")  # the job agent's default
CASES = (("initial", "initial sync"), ("nochange", "no-change re-sync"), ("small", "one small file edited"), ("big", "one big file edited"))
TOOLS = ("gpurig", "rsync")


# --- the gpurig client (runs in its own interpreter, timed from outside) ------------------------


def gpurig_client(inventory: str, root: str, out: str) -> None:
    """Scan ``root`` and sync it to the inventory's one host as `gpurig run` does; what it did, as JSON, to ``out``."""
    t0 = time.monotonic()
    from gpurig.connect.connector import Connector
    from gpurig.connect.ssh import SSHSettings
    from gpurig.inventory.source import load_inventory
    from gpurig.jobs.remote import JobAgent
    from gpurig.jobs.sync import sync, sync_key
    from gpurig.jobs.tree import scan

    times: dict[str, float] = {"import": time.monotonic() - t0}
    sizes: dict[str, int] = {}

    class Measured(JobAgent):
        """The agent's verbs timed, and their command lines and answers measured."""

        def line(self, verb: str, *args: str) -> str:
            text = super().line(verb, *args)
            sizes[f"{verb}_line"] = len(text.encode())
            return text

        def _call(self, verb, *args, **kw):
            result = super()._call(verb, *args, **kw)
            sizes[f"{verb}_answer"] = len(result.stdout.encode()) + len(result.stderr.encode())
            return result

        def manifest(self, key, create=True):
            t = time.monotonic()
            try:
                return super().manifest(key, create)
            finally:
                times["manifest"] = time.monotonic() - t

        def apply(self, key, feed, timeout=None):
            t = time.monotonic()
            try:
                return super().apply(key, feed, timeout)
            finally:
                times["apply"] = time.monotonic() - t

    t = time.monotonic()
    tree = scan(root)
    times["scan"] = time.monotonic() - t
    host = next(iter(load_inventory(inventory).hosts.values()))
    settings = SSHSettings(host_key_policy="strict", project_known_hosts=Path(inventory).with_name("known_hosts"), user_known_hosts=None,
                           ssh_config=None, allow_agent=False, look_for_keys=False)
    connector = Connector(settings)
    conn = connector.open(host)
    try:
        t = time.monotonic()
        conn.connect()
        times["connect"] = time.monotonic() - t
        done = sync(Measured(conn), sync_key(Path(root)), tree)
    finally:
        conn.close()
        connector.close()
    times["total"] = time.monotonic() - t0
    sent = [e.path for e in done.plan.send if e.kind != "dir"]
    Path(out).write_text(json.dumps({
        "entries": len(tree.entries), "files": done.plan.files, "bytes": done.plan.bytes, "deleted": len(done.plan.delete),
        "moved": done.moved, "tar": done.sent_bytes, "sent": sent[:20], "times": times, "sizes": sizes,
    }))


def pipe_client(inventory: str, path: str) -> None:
    """``path``'s bytes through gpurig's SSH connection into ``cat > /dev/null``, in writes the size tarfile's stream makes (10 kB)."""
    from gpurig.connect.connector import Connector
    from gpurig.connect.ssh import SSHSettings
    from gpurig.connect.streams import Streams
    from gpurig.inventory.source import load_inventory

    host = next(iter(load_inventory(inventory).hosts.values()))
    connector = Connector(SSHSettings(host_key_policy="strict", project_known_hosts=Path(inventory).with_name("known_hosts"), user_known_hosts=None,
                                      ssh_config=None, allow_agent=False, look_for_keys=False))
    conn = connector.open(host)

    def feed(write) -> None:
        with open(path, "rb") as f:
            while chunk := f.read(tarfile.RECORDSIZE):
                write(chunk)

    try:
        conn.run("cat > /dev/null", streams=Streams(feed=feed))
    finally:
        conn.close()
        connector.close()


# --- the byte-counting proxy ---------------------------------------------------------------------


class CountingProxy:
    """A TCP proxy on 127.0.0.1 to one port that counts the bytes of every connection, each way."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = self.down = self.connections = 0
        self.pumps = 0
        self.cond = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # forward each write at once, as the direct path would
            pair = [client, server, 2]
            with self.cond:
                self.pumps += 2
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, server, "up", pair), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, "down", pair), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, way: str, pair: list) -> None:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        moved = 0
        try:
            while True:
                n = src.recv_into(buf)
                if not n:
                    break
                dst.sendall(view[:n])
                moved += n
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            with self.cond:
                setattr(self, way, getattr(self, way) + moved)
                pair[2] -= 1
                if pair[2] == 0:
                    pair[0].close()
                    pair[1].close()
                self.pumps -= 1
                self.cond.notify_all()

    def take(self, timeout: float = 30) -> tuple[int, int, int]:
        """(bytes up, bytes down, connections) since the last take, once every connection has closed; counters zeroed."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.pumps == 0, timeout):
                sys.exit("a connection through the proxy is still open after the tool exited: its bytes would be miscounted")
            counts = (self.up, self.down, self.connections)
            self.up = self.down = self.connections = 0
        return counts

    def close(self) -> None:
        self.listener.close()


# --- the tree ------------------------------------------------------------------------------------

WORDS = ("def", "return", "self", "import", "class", "for", "in", "if", "else", "None", "True", "tensor", "model", "batch", "loss",
         "optimizer", "step", "epoch", "config", "data", "loader", "device", "cuda", "grad", "torch", "numpy", "path", "value")


def make_tree(root: Path, args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    """The bench tree: big random files under data/, small text files in nested folders under src/; all a day old."""
    rng = random.Random(args.seed)
    big, small = [], []
    for i in range(args.big_files):
        path = root / "data" / f"shard{i % 20:02d}" / f"blob_{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(args.big_size))
        big.append(path)
    for i in range(args.small_files):
        path = root / "src" / f"pkg{i % 10:02d}" / f"sub{(i // 10) % 10:02d}" / f"part{(i // 100) % 5}" / f"mod_{i:05d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        want = rng.randint(args.small_size // 8, args.small_size * 2 - args.small_size // 8)
        lines, size = [], 0
        while size < want:
            line = "    " * rng.randint(0, 3) + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 10))) + "\n"
            lines.append(line)
            size += len(line)
        path.write_text("".join(lines)[:want])
        small.append(path)
    (root / "README.md").write_text("bench tree\n")
    old = time.time() - 86400
    for path in [*big, *small, root / "README.md"]:
        os.utime(path, (old, old))
    return big, small


def edit_small(path: Path, n: int) -> None:
    with open(path, "a") as f:
        f.write(f"# edit {n}\n")
    _newer(path)


def edit_big(path: Path, how: str) -> None:
    size = path.stat().st_size
    if how == "rewrite":
        path.write_bytes(os.urandom(size))
    else:
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(os.urandom(min(4096, size)))
    _newer(path)


def _newer(path: Path) -> None:
    """The edit's mtime is now: a different whole second from the tree's (a day old), so both tools' quick checks see it."""
    now = time.time()
    os.utime(path, (now, now))


def listing(root: Path, skip_internal: bool = False) -> dict[str, tuple]:
    """path -> (kind, size, whole-second mtime, executable bits): what both tools' quick checks compare."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if skip_internal and rel_dir == ".":
            dirnames[:] = [d for d in dirnames if not d.startswith(".gpurig-")]
            filenames = [f for f in filenames if not f.startswith(".gpurig-")]
        for name in dirnames:
            found[os.path.normpath(os.path.join(rel_dir, name))] = ("dir",)
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            found[os.path.normpath(os.path.join(rel_dir, name))] = ("file", st.st_size, int(st.st_mtime), st.st_mode & 0o111)
    return found


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def check_copy(tool: str, src: Path, dest: Path, edited: list[Path], contents: bool) -> None:
    """The destination holds what the tree holds (names, sizes, mtimes, exec bits; the edited files' bytes; with ``contents`` every byte)."""
    mine, theirs = listing(src), listing(dest, skip_internal=True)
    if mine != theirs:
        missing = sorted(set(mine) - set(theirs))[:5]
        extra = sorted(set(theirs) - set(mine))[:5]
        wrong = sorted(p for p in set(mine) & set(theirs) if mine[p] != theirs[p])[:5]
        sys.exit(f"{tool}: the copy differs from the tree: missing {missing}, extra {extra}, different {wrong}")
    for path in edited if not contents else [src / p for p, v in mine.items() if v[0] == "file"]:
        rel = path.relative_to(src)
        if digest(path) != digest(dest / rel):
            sys.exit(f"{tool}: {rel} has other bytes at the destination than in the tree")


# --- running and reporting -----------------------------------------------------------------------


def timed(argv: list[str], env: dict[str, str], log: Path) -> tuple[float, float, str]:
    """(wall s, CPU s of the command and its children, its output); a failure ends the bench."""
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    text = log.read_text(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{argv[0]} failed (exit {os.waitstatus_to_exitcode(status)}):\n{text[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, text


def rsync_stats(text: str) -> dict[str, int]:
    stats = {}
    for label, key in (("Total bytes sent", "sent"), ("Total bytes received", "received"), ("Number of regular files transferred", "files"),
                       ("Literal data", "literal"), ("Matched data", "matched")):
        m = re.search(rf"^{label}: ([\d,.]+)", text, re.M)
        stats[key] = int(m.group(1).replace(",", "").replace(".", "")) if m else -1
    return stats


def human(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 100 * scale else f"{n / scale:.0f} {unit}"
    return f"{n:.0f} B"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="rounds; each figure is the median (default 5)")
    ap.add_argument("--big-files", type=int, default=1000)
    ap.add_argument("--big-size", type=int, default=1 << 20, help="bytes of each big file (default 1 MiB)")
    ap.add_argument("--small-files", type=int, default=5000)
    ap.add_argument("--small-size", type=int, default=2048, help="mean bytes of a small file (default 2048)")
    ap.add_argument("--big-edit", choices=("patch", "rewrite"), default="patch", help="patch: 4 KiB in the middle changed; rewrite: every byte")
    ap.add_argument("--only", default=",".join(TOOLS))
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--breakdown", type=int, default=0, metavar="N",
                    help="also time the initial sync's parts N times: the SSH pipe alone (OpenSSH, paramiko), the host's extraction alone (agent, GNU tar)")
    ap.add_argument("--client", nargs=3, metavar=("INVENTORY", "ROOT", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--pipe", nargs=2, metavar=("INVENTORY", "FILE"), help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if args.client:
        gpurig_client(*args.client)
        return
    if args.pipe:
        pipe_client(*args.pipe)
        return
    if os.geteuid() != 0:
        sys.exit("bench_sync.py must run as root: it starts an sshd host and creates a throwaway login user")
    tools = [t for t in args.only.split(",") if t]
    if "rsync" in tools and not shutil.which("rsync"):
        sys.exit("rsync is not installed: apt-get install -y rsync (a bench tool, not a dependency of gpurig or its tests)")
    sys.path.insert(0, str(REPO / "bench"))
    sys.path.insert(0, str(REPO))
    from bench_facts import bench_hosts

    load = os.getloadavg()
    made_parents = [p for p in (SYNC_ROOT, SYNC_ROOT.parent) if not p.exists()]
    with bench_hosts(1, "gpurig-bench-sync-") as (work, key, hosts):
        SUDOERS.write_text(f"{BENCH_USER} ALL=(ALL) NOPASSWD: ALL\n")
        SUDOERS.chmod(0o440)
        proxy = CountingProxy(hosts[0].port)
        try:
            run_bench(args, tools, work, key, hosts[0], proxy, load)
        finally:
            proxy.close()
            SUDOERS.unlink(missing_ok=True)
            shutil.rmtree(SYNC_ROOT / BENCH_USER, ignore_errors=True)
            for p in made_parents:  # the folders the agent made for this bench, if they were not there before and nothing else uses them
                try:
                    p.rmdir()
                except OSError:
                    pass


def run_bench(args, tools, work: Path, key: Path, host, proxy: CountingProxy, load) -> None:
    inv = work / "inventory"
    inv.mkdir()
    known = inv / "known_hosts"
    known.write_text(f"[127.0.0.1]:{proxy.port} {' '.join(host.host_key.with_suffix('.pub').read_text().split()[:2])}\n")
    (inv / "hosts.yaml").write_text(
        "all:\n  hosts:\n    sync0:\n"
        f"      ansible_host: 127.0.0.1\n      ansible_port: {proxy.port}\n      ansible_user: {BENCH_USER}\n"
        f"      ansible_ssh_private_key_file: {key}\n      ansible_become: true\n"
    )
    tree = work / "tree"
    t = time.monotonic()
    big, small = make_tree(tree, args)
    total = sum(p.stat().st_size for p in [*big, *small])
    print(f"tree: {len(big)} files of {human(args.big_size)} + {len(small)} small files ({human(sum(p.stat().st_size for p in small))}), "
          f"{human(total)} in all, made in {time.monotonic() - t:.1f}s", flush=True)

    from gpurig.jobs.sync import sync_key

    gpurig_dest = SYNC_ROOT / BENCH_USER / sync_key(tree) / "tree"  # the synced files; their lock and stages sit beside it
    rsync_dest = Path(f"/home/{BENCH_USER}/rsync-dest")
    env = {**os.environ, "HOME": str(work), "PYTHONPATH": str(REPO), "LC_ALL": "C"}
    env.pop("SSH_AUTH_SOCK", None)
    ssh = (f"ssh -F /dev/null -p {proxy.port} -i {key} -o IdentitiesOnly=yes -o BatchMode=yes -o UserKnownHostsFile={known} "
           "-o StrictHostKeyChecking=yes -o ControlMaster=no -o ControlPath=none")
    commands = {
        "gpurig": [sys.executable, str(Path(__file__).resolve()), "--client", str(inv / "hosts.yaml"), str(tree), str(work / "gpurig.json")],
        "rsync": ["rsync", "-a", "--delete", "--stats", "-e", ssh, f"{tree}/", f"{BENCH_USER}@127.0.0.1:{rsync_dest}/"],
    }
    dests = {"gpurig": gpurig_dest, "rsync": rsync_dest}
    rows: dict[tuple[str, str], list[dict]] = {(tool, case): [] for tool in tools for case, _ in CASES}
    n_small = n_big = 0
    for run in range(args.runs):
        order = tools if run % 2 == 0 else tools[::-1]
        for tool in order:
            shutil.rmtree(dests[tool], ignore_errors=True)
            os.sync()
            edited: list[Path] = []
            for case, _ in CASES:
                expect: list[Path] | None = None
                if case == "small":
                    path = small[(n_small * 97) % len(small)]
                    n_small += 1
                    edit_small(path, n_small)
                    expect = [path]
                elif case == "big":
                    path = big[(n_big * 37 + 11) % len(big)]
                    n_big += 1
                    edit_big(path, args.big_edit)
                    expect = [path]
                elif case == "nochange":
                    expect = []
                proxy.take()  # nothing left over from the last case
                wall, cpu, text = timed(commands[tool], env, work / f"{tool}.log")
                up, down, conns = proxy.take()
                row = {"wall": wall, "cpu": cpu, "up": up, "down": down, "conns": conns}
                if tool == "gpurig":
                    row.update(json.loads((work / "gpurig.json").read_text()))
                    sent = row["sent"]
                    got = None if expect is None else sorted(str(p.relative_to(tree)) for p in expect)
                    if got is not None and sorted(sent) != got:
                        print(f"  DEFECT? gpurig sent {sent} for the {case} case, expected {got}", flush=True)
                else:
                    row.update(rsync_stats(text))
                    if expect is not None and row["files"] != len(expect):
                        print(f"  rsync transferred {row['files']} files for the {case} case, expected {len(expect)}", flush=True)
                rows[(tool, case)].append(row)
                edited += expect or []
                print(f"run {run + 1} {tool:6s} {case:8s} {wall:7.2f}s wall {cpu:6.2f}s cpu  wire {human(up + down):>8s} "
                      f"(up {up}, down {down}, {conns} conn)", flush=True)
                os.sync()  # what this case wrote is on disk before the next one starts
            check_copy(tool, tree, dests[tool], edited, contents=run == args.runs - 1)
    if args.runs:
        report(args, tools, rows, total, load)
    if args.breakdown:
        breakdown(args.breakdown, tree, work, inv, env, ssh.split(), proxy)


def breakdown(runs: int, tree: Path, work: Path, inv: Path, env: dict[str, str], ssh: list[str], proxy: CountingProxy) -> None:
    """Where an initial sync's time goes: gpurig's own initial tar through each SSH client alone, and extracted on the host alone."""
    from gpurig.jobs.remote import agent_source
    from gpurig.jobs.sync import plan_sync, tar_feed
    from gpurig.jobs.tree import scan

    place = Path(f"/home/{BENCH_USER}/breakdown")  # readable by the login user, removed with it
    place.mkdir(mode=0o755)
    scanned = scan(tree)
    plan = plan_sync(scanned, {})
    tar = place / "initial.tar"
    with open(tar, "wb") as f:
        tar_feed(scanned, plan)(f.write)
    agent = place / "job_agent.py"
    agent.write_text(agent_source())
    for p in (tar, agent):
        p.chmod(0o644)
    dest = SYNC_ROOT / BENCH_USER / "breakdown"
    as_user = ["sudo", "-u", BENCH_USER]
    steps = {
        "the tar written by gpurig's client (tar_feed, to /dev/null)": None,
        "OpenSSH client: the tar into cat > /dev/null": [*ssh, f"{BENCH_USER}@127.0.0.1", "cat > /dev/null"],
        "paramiko (gpurig's connection): the same": [sys.executable, str(Path(__file__).resolve()), "--pipe", str(inv / "hosts.yaml"), str(tar)],
        "the job agent's apply from the tar, no SSH": [*as_user, "python3", str(agent), "apply", "--cache", dest.name],
        "GNU tar -x from the tar, no SSH": [*as_user, "tar", "-C", str(dest), "-xf", "-"],
    }
    walls: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(runs):
        for name, argv in steps.items():
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            shutil.chown(dest, BENCH_USER, BENCH_USER)
            os.sync()
            proxy.take()
            start = time.monotonic()
            if argv is None:
                with open(os.devnull, "wb") as f:
                    tar_feed(scanned, plan)(f.write)
            else:
                with open(tar, "rb") as stdin:
                    done = subprocess.run(argv, env=env, stdin=stdin, capture_output=True, text=True)
                if done.returncode:
                    sys.exit(f"{name} failed: {done.stderr[-2000:]}")
            walls[name].append(time.monotonic() - start)
            proxy.take()
    size = tar.stat().st_size
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(place, ignore_errors=True)
    print()
    print(f"initial sync, its parts alone (gpurig's initial tar, {human(size)}; the pipes go through the counting proxy), median of {runs}:")
    for name, ws in walls.items():
        print(f"  {name:62s} {statistics.median(ws):6.2f} s   ({' '.join(f'{w:.2f}' for w in ws)})")


def report(args, tools, rows, total: int, load) -> None:
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("wall", "cpu", "up", "down")} for k, v in rows.items()}
    print()
    print(f"Sync of a {human(total)} tree ({args.big_files} x {human(args.big_size)} + {args.small_files} small files) to one loopback sshd host, "
          f"median of {args.runs} interleaved runs; bytes: both ways through the counting proxy")
    print(f"machine: {os.cpu_count()} cores, load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}, "
          f"at end {os.getloadavg()[0]:.2f}; {subprocess.run(['rsync', '--version'], capture_output=True, text=True).stdout.splitlines()[0]}"
          if "rsync" in tools and shutil.which("rsync") else f"machine: {os.cpu_count()} cores, load average at start {load[0]:.2f}")
    both = all(t in tools for t in TOOLS)
    head = f"  {'case':24s} {'gpurig wall':>11s} {'rsync wall':>10s} {'ratio':>6s}  {'gpurig bytes':>12s} {'rsync bytes':>11s} {'ratio':>7s}"
    print(head)
    for case, label in CASES:
        g, r = med.get(("gpurig", case)), med.get(("rsync", case))
        gw = f"{g['wall']:.2f} s" if g else "-"
        rw = f"{r['wall']:.2f} s" if r else "-"
        gb = human(g["up"] + g["down"]) if g else "-"
        rb = human(r["up"] + r["down"]) if r else "-"
        line = f"  {label:24s} {gw:>11s} {rw:>10s} {ratio(g['wall'], r['wall']) if both else '-':>6s}  {gb:>12s} {rb:>11s} "
        line += f"{ratio(g['up'] + g['down'], r['up'] + r['down']) if both else '-':>7s}"
        print(line)
    print()
    print("details (medians): wire up/down; client CPU; rsync's --stats; gpurig's tar, its manifest answer, its command lines, its phases")
    for case, label in CASES:
        if ("gpurig", case) in rows:
            g, rs = med[("gpurig", case)], rows[("gpurig", case)]
            m = lambda f, rs=rs: statistics.median(r[f] for r in rs)  # noqa: E731
            s = lambda f, rs=rs: statistics.median(r["sizes"].get(f, 0) for r in rs)  # noqa: E731
            tm = lambda f, rs=rs: statistics.median(r["times"].get(f, 0) for r in rs)  # noqa: E731
            print(f"  gpurig {label:22s} up {human(g['up']):>8s} down {human(g['down']):>8s}  cpu {g['cpu']:.2f} s  files {m('files'):.0f}  "
                  f"tar {human(m('tar'))}  manifest answer {human(s('manifest_answer'))}  lines {human(s('manifest_line'))} + {human(s('apply_line'))}  "
                  f"import {tm('import'):.2f} scan {tm('scan'):.2f} connect {tm('connect'):.2f} manifest {tm('manifest'):.2f} apply {tm('apply'):.2f} s")
        if ("rsync", case) in rows:
            r, rs = med[("rsync", case)], rows[("rsync", case)]
            m = lambda f, rs=rs: statistics.median(x[f] for x in rs)  # noqa: E731
            print(f"  rsync  {label:22s} up {human(r['up']):>8s} down {human(r['down']):>8s}  cpu {r['cpu']:.2f} s  files {m('files'):.0f}  "
                  f"Total bytes sent {human(m('sent'))} received {human(m('received'))}  literal {human(m('literal'))} matched {human(m('matched'))}")
    if "gpurig" in tools:
        from gpurig.jobs.remote import AGENT, SAMPLER
        from gpurig.skeleton import shipped_text

        bundle = sum(len(shipped_text(p).encode()) + 512 for p in (AGENT, SAMPLER))
        print(f"  a `gpurig run` adds its job's bundle to each sync's tar: job_agent.py + gpu_sampler.py, {human(bundle)} with headers, plus job.json")
    print("  walls per run:")
    for key, rs in rows.items():
        print(f"    {key[0]:6s} {key[1]:8s} " + " ".join(f"{r['wall']:.2f}" for r in rs))


if __name__ == "__main__":
    main()
