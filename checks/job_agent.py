"""gpurig's job agent: the host side of `invoke run`, `jobs`, `logs --job`, `attach`, `cancel` and `fetch`.

Standalone (Python 3.6+, stdlib only): gpurig sends it inside the command line
for each verb, and a job's own copy (in the job's folder) supervises that job
once it is submitted. Everything about a job lives on the host, so any machine
with the inventory sees the same queue:

    /srv/gpurig/sync/<login>/<key>/tree/  the synced working directory (files read-only, see below); beside it the
                                          folder's lock, the uploads being staged and the job bundles not yet submitted
    /srv/gpurig/jobs/<id>/job.json        what to run: the container body (env values: 0600, root's)
                         meta.json        what anyone may read: command, image, GPUs asked for, times asked
                         state.json       pending | running | succeeded | failed | cancelled, attempts, exit code
                         log              the job's stdout and stderr, every attempt
                         samples.jsonl    the monitor's sampler (gpu_sampler.py) over the run
                         work/            the job's copy of the working directory (hard links), its cwd

Verbs (each prints one JSON document on stdout, or streams; a refusal is one
line ``gpurig-agent-error: {"problem": ..., "fix": ...}`` on stderr, exit 3):

    manifest --cache DIR              make the sync folder (owned by the login user) and list what it holds (zlib, base64)
    apply --cache DIR                 stdin: a tar of what changed (code/...), the job's files (job/...) and
                                      gpurig-sync.json (what to delete); staged, then moved into place
    submit --root R --cache DIR --id ID   the job's folder from the pending bundle, its work/ copy, its supervisor
    supervise DIR                     (the job's own copy, detached) queue, run, log, sample, retry, time out
    list --root R [--id ID...]        every job's state; a job whose supervisor is gone is failed, and why
    cancel --root R --id ID [--grace S]   stop it (its process group, with a grace period), or drop it from the queue
    logs --root R --id ID [--follow] [--tail N]   its log; --follow until the job has ended
    artifacts --root R --id ID        its artifact files with sha256; pack --root R --id ID [-- PATH...]: them as a tar
    samples --root R --id ID          the sampler's records (at most 2000 samples, evenly thinned)

The queue: a job that asks for GPUs waits until it is the earliest-submitted
waiting job (FIFO) and as many GPUs as it asks for are held by no running
container (gpurig's or not) unless both sides share; the choice and the
container's creation happen under one lock, so two jobs never take one GPU.
Synced files are kept without write bits and each job gets hard links to
them: a job can make, replace and delete files in its work/, never change a
synced file another job also sees (a write in place fails; root in a
container is the exception, and the next sync notices it by size and mtime).
"""

import base64
import errno
import fcntl
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
import zlib

ERROR = "gpurig-agent-error: "
REFUSED = 3
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{2,63}$")
KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
FINAL = ("succeeded", "failed", "cancelled")
BOOT_TOKEN = "/run/gpurig/boot-token"
TREE = "tree"  # the synced files, in a folder of their own: the agent's lock, stages and bundles never share a name with them
JOB_LABEL = "io.gpurig.job.id"
SHARE_LABEL = "io.gpurig.job.share"
DEPLOY_SETTINGS = "io.gpurig.deploy.settings"
MAX_SAMPLES = 2000
POLL_S = 1.0


class Refusal(Exception):
    def __init__(self, problem, fix=""):
        Exception.__init__(self, problem)
        self.problem, self.fix = problem, fix


def say(doc):
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    sys.stdout.flush()


def now():
    return round(time.time(), 3)


def disk_full(err, where):
    return Refusal("the host's disk is full while writing %s (%s)" % (where, os.strerror(err.errno)),
                   "free space on the host (df -h %s), or remove old jobs (gpurig jobs; --keep N)" % where)


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def write_json(path, doc, mode=0o644):
    tmp = "%s.%s.tmp" % (path, secrets.token_hex(4))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Locked:
    """An flock on a file, held for a with-block."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


# --- the host: who runs this, since when, which boot --------------------------------------------


def login_ids():
    """(uid, gid) of the login user: sudo's caller where sudo ran this, else whoever runs it."""
    uid = os.environ.get("SUDO_UID")
    gid = os.environ.get("SUDO_GID")
    if os.getuid() == 0 and uid and gid and uid.isdigit() and gid.isdigit():
        return int(uid), int(gid)
    return os.getuid(), os.getgid()


def boot_token():
    """This boot's token: /run is emptied by every boot (and a container host's restart), so a new token means a new boot."""
    try:
        with open(BOOT_TOKEN) as f:
            token = f.read().strip()
        if token:
            return token
    except OSError:
        pass
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            kernel = f.read().strip()
    except OSError:
        kernel = "unknown"
    token = "%s/%s" % (kernel, secrets.token_hex(8))
    try:
        os.makedirs(os.path.dirname(BOOT_TOKEN), mode=0o755, exist_ok=True)
        fd = os.open(BOOT_TOKEN, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    except FileExistsError:
        return boot_token()
    except OSError:
        return kernel  # /run not writable (not root): the kernel's boot id alone
    return token


def proc_start(pid):
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None when there is none."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            text = f.read()
        return int(text[text.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(record):
    """Whether the process a state's ``supervisor`` names still runs (same pid, same start time: not a reused pid)."""
    if not record or not record.get("pid"):
        return False
    return proc_start(int(record["pid"])) == record.get("start")


def descendants(pid):
    """``pid`` and every process below it, found through /proc's parent links."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                text = f.read()
            ppid = int(text[text.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, ()))
    return found


def stop_tree(pid, grace):
    """TERM to ``pid``'s whole tree, KILL to what is left after ``grace`` seconds."""
    for p in descendants(pid):
        try:
            os.kill(p, signal.SIGTERM)
        except OSError:
            pass
    end = time.monotonic() + grace
    while time.monotonic() < end and any(proc_start(p) is not None for p in descendants(pid)):
        time.sleep(0.2)
    for p in descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


# --- the Docker engine, over its unix socket ----------------------------------------------------


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=None):
        http.client.HTTPConnection.__init__(self, "localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


def engine_socket():
    host = os.environ.get("DOCKER_HOST", "")
    return host[len("unix://"):] if host.startswith("unix://") else "/var/run/docker.sock"


class Engine:
    """The few Engine API calls the agent makes; every failure is a Refusal with the engine's own words."""

    def __init__(self):
        self.path = engine_socket()

    def call(self, method, path, body=None, timeout=60, stream=False):
        conn = UnixHTTPConnection(self.path, timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
        except OSError as err:
            conn.close()
            raise Refusal("cannot reach the Docker engine at %s: %s" % (self.path, err.strerror or err),
                          "start Docker on the host (systemctl start docker) or run gpurig provision") from None
        if stream and response.status < 300:
            return conn, response
        raw = response.read()
        conn.close()
        if response.status == 404:
            return None
        if response.status >= 300:
            try:
                message = json.loads(raw.decode()).get("message", "")
            except ValueError:
                message = raw.decode(errors="replace").strip()
            raise Refusal("the Docker engine refused to %s %s: %s" % (method, path.split("?")[0], message.strip()),
                          "see the engine's message; `docker info` on the host")
        return json.loads(raw.decode()) if raw.strip() else {}

    def running(self):
        """Every running container, inspected (its DeviceRequests and labels)."""
        found = []
        for entry in self.call("GET", "/containers/json") or ():
            data = self.call("GET", "/containers/%s/json" % entry["Id"])
            if data:
                found.append(data)
        return found

    def stream(self, method, path, body, sink):
        """A multiplexed stdout/stderr stream (attach, exec) to ``sink(bytes)`` until it ends."""
        self.pump(self.call(method, path, body, timeout=None, stream=True), sink)

    @staticmethod
    def pump(opened, sink):
        """The frames of an opened stream (``call(..., stream=True)``) to ``sink`` until it ends; then it is closed."""
        conn, response = opened
        try:
            while True:
                head = read_exact(response, 8)
                if not head:
                    return
                if len(head) < 8 or head[0] not in (0, 1, 2) or head[1:4] != b"\0\0\0":
                    sink(head)  # a TTY's stream has no frames: the rest as it comes
                    while True:
                        chunk = response.read1(65536) if hasattr(response, "read1") else response.read(4096)
                        if not chunk:
                            return
                        sink(chunk)
                size = int.from_bytes(head[4:8], "big")
                payload = read_exact(response, size)
                sink(payload)
                if len(payload) < size:
                    return
        except OSError:
            return
        finally:
            conn.close()


def read_exact(response, n):
    parts, got = [], 0
    while got < n:
        chunk = response.read(n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


# --- GPUs: who holds which ----------------------------------------------------------------------


def held_gpus(engine, host_gpus, me):
    """{GPU index: (holder, shares)} of every running container other than the job's own ``me``."""
    by_uuid = dict((u.lower(), i) for i, u in host_gpus)
    indexes = [i for i, _ in host_gpus]
    held = {}
    for data in engine.running():
        labels = (data.get("Config") or {}).get("Labels") or {}
        if labels.get(JOB_LABEL) == me:
            continue
        name = (data.get("Name") or "").lstrip("/") or data.get("Id", "")[:12]
        holder = "job %s" % labels[JOB_LABEL] if JOB_LABEL in labels else "container %s" % name
        shares = labels.get(SHARE_LABEL) == "true"
        if DEPLOY_SETTINGS in labels:
            try:
                shares = bool(json.loads(labels[DEPLOY_SETTINGS]).get("share"))
            except ValueError:
                pass
        for request in (data.get("HostConfig") or {}).get("DeviceRequests") or ():
            caps = [c for group in request.get("Capabilities") or () for c in group]
            if "gpu" not in caps and request.get("Driver") != "nvidia":
                continue
            ids = request.get("DeviceIDs") or ()
            count = request.get("Count") or 0
            if ids:
                taken = [by_uuid.get(d.lower()) if d.startswith("GPU-") else (int(d) if d.isdigit() else None) for d in ids]
            elif count == -1:
                taken = indexes
            else:
                taken = indexes[:count]
            for i in taken:
                if i is not None:
                    held[i] = (holder, shares)
    return held


def pick_gpus(request, host_gpus, held, share):
    """(device ids, None) when the request can start now, else (None, why it waits)."""
    indexes = [i for i, _ in host_gpus]
    usable = [i for i in indexes if i not in held or (share and held[i][1])]
    if request.get("all"):
        wanted = indexes
    elif request.get("ids"):
        by_uuid = dict((u.lower(), i) for i, u in host_gpus)
        wanted = [by_uuid.get(d.lower()) if d.startswith("GPU-") else int(d) for d in request["ids"]]
    else:
        wanted = None
    if wanted is not None:
        busy = [i for i in wanted if i not in usable]
        if busy:
            return None, "waiting for GPU %s (held by %s)" % (", ".join(map(str, busy)), held[busy[0]][0])
        return [str(i) for i in wanted], None
    count = int(request.get("count") or 0)
    if len(usable) < count:
        holders = sorted(set(h for h, _ in held.values()))
        return None, "waiting for %d GPU%s: %d of %d free (held by %s)" % (
            count, "" if count == 1 else "s", len(usable), len(indexes), ", ".join(holders) or "nobody")
    return [str(i) for i in usable[:count]], None


# --- the synced working directory ---------------------------------------------------------------


def ensure_dir(path, mode, owner=None):
    try:
        os.makedirs(path, mode=mode, exist_ok=True)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full(err, path) from None
        raise Refusal("cannot create %s: %s" % (path, err.strerror),
                      "set ansible_become: true for this host (gpurig needs root there), or make %s writable" % os.path.dirname(path)) from None
    if owner is not None and os.getuid() == 0:
        st = os.lstat(path)
        if (st.st_uid, st.st_gid) != owner:
            os.chown(path, owner[0], owner[1])


def walk(top):
    """(relative posix path, lstat) of everything under ``top``, without following links."""
    todo = [""]
    while todo:
        rel = todo.pop()
        here = os.path.join(top, rel) if rel else top
        try:
            names = sorted(os.listdir(here))
        except OSError:
            continue
        for name in names:
            path = rel + "/" + name if rel else name
            try:
                st = os.lstat(os.path.join(top, path))
            except OSError:
                continue
            yield path, st
            if stat.S_ISDIR(st.st_mode):
                todo.append(path)


def manifest(cache):
    entries = {}
    for path, st in walk(cache):
        if stat.S_ISREG(st.st_mode):
            entries[path] = ["file", st.st_size, int(st.st_mtime), stat.S_IMODE(st.st_mode)]
        elif stat.S_ISDIR(st.st_mode):
            entries[path] = ["dir", 0, 0, stat.S_IMODE(st.st_mode)]
        elif stat.S_ISLNK(st.st_mode):
            entries[path] = ["link", 0, 0, 0, os.readlink(os.path.join(cache, path))]
    return entries


def cmd_manifest(args):
    cache = cache_path(args)
    tree = os.path.join(cache, TREE)
    if "--no-create" not in args:  # check mode: what is there, making nothing
        login = login_ids()
        ensure_dir(os.path.dirname(cache), 0o700, login)
        ensure_dir(cache, 0o755, login)
        ensure_dir(tree, 0o755, login)
    entries = manifest(tree) if os.path.isdir(tree) else {}
    # a listing of 6,000 files is 450 kB of JSON and about a sixth of that compressed: it crosses the wire at every sync
    packed = base64.b64encode(zlib.compress(json.dumps(entries).encode(), 6)).decode()
    say({"cache": cache, "z": packed})


def safe_member(name, prefix):
    """The relative path of a tar member under ``prefix``/, or None when it would leave it."""
    if not name.startswith(prefix + "/"):
        return None
    rel = name[len(prefix) + 1:].strip("/")
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        return None
    return rel


def link_inside(rel, target):
    if target.startswith("/"):
        return False
    depth = len(rel.split("/")) - 1
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


def cmd_apply(args):
    cache = cache_path(args)
    if not os.path.isdir(cache):
        raise Refusal("the sync folder %s is missing" % cache, "run again: gpurig makes it first")
    stage = os.path.join(cache, "stage-" + secrets.token_hex(4))
    with Locked(os.path.join(cache, "lock")):
        os.mkdir(stage, 0o700)
        try:
            control, files, sent = extract(stage)
            moved = commit(os.path.join(cache, TREE), stage, files, control.get("delete") or ())
            job = control.get("job")
            if job:
                bundle(cache, stage, job)
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise disk_full(err, cache) from None
            raise
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    say({"files": moved, "bytes": sent, "deleted": len(control.get("delete") or ())})


def extract(stage):
    """Every member into ``stage`` (code/ and job/), checked; (control document, [(kind, rel)], bytes)."""
    control, files, sent = {}, [], 0
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|", bufsize=1 << 20) as tar:
        for member in tar:
            if member.name == "gpurig-sync.json":
                control = json.loads(tar.extractfile(member).read().decode())
                continue
            prefix = "job" if member.name.startswith("job/") else "code"
            rel = safe_member(member.name, prefix)
            if rel is None:
                raise Refusal("the upload names %r, outside the working directory" % member.name, "report this as a gpurig bug")
            dest = os.path.join(stage, prefix, rel)
            os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
            if member.isdir():
                os.makedirs(dest, mode=0o755, exist_ok=True)
            elif member.issym():
                if not link_inside(rel, member.linkname):
                    raise Refusal("the upload's link %s points outside the working directory" % rel, "report this as a gpurig bug")
                os.symlink(member.linkname, dest)
            elif member.isfile():
                source = tar.extractfile(member)
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
                sent += member.size
                keep = 0o600 if prefix == "job" else 0o444 | (member.mode & 0o111)
                os.chmod(dest, keep)
                os.utime(dest, (member.mtime, member.mtime))
            else:
                raise Refusal("the upload holds %s, which is neither a file, a folder nor a link" % rel, "report this as a gpurig bug")
            if prefix == "code":
                files.append(("dir" if member.isdir() else "link" if member.issym() else "file", rel))
    return control, files, sent


def remove(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def commit(cache, stage, files, delete):
    """Staged files into place (a rename each), then what the client no longer has removed; the number moved."""
    moved = 0
    for kind, rel in sorted(files, key=lambda f: (f[1].count("/"), f[1])):
        src, dest = os.path.join(stage, "code", rel), os.path.join(cache, rel)
        parent = os.path.dirname(dest)
        walked = cache
        for part in os.path.relpath(parent, cache).split("/") if parent != cache else ():
            walked = os.path.join(walked, part)
            if os.path.lexists(walked) and not os.path.isdir(walked) or os.path.islink(walked):
                remove(walked)  # a file (or link) where a folder now is
            if not os.path.lexists(walked):
                os.mkdir(walked, 0o755)
        if kind == "dir":
            if os.path.lexists(dest) and (os.path.islink(dest) or not os.path.isdir(dest)):
                remove(dest)
            if not os.path.lexists(dest):
                os.mkdir(dest, 0o755)
            continue
        if os.path.isdir(dest) and not os.path.islink(dest):
            shutil.rmtree(dest)
        os.replace(src, dest)
        moved += 1
    for rel in sorted(delete, key=lambda p: -p.count("/")):
        if safe_member("code/" + rel, "code") is not None:
            remove(os.path.join(cache, rel))
    return moved


def bundle(cache, stage, job):
    if not ID_RE.match(job):
        raise Refusal("%r is not a job id" % job, "report this as a gpurig bug")
    pending = os.path.join(cache, "pending")
    os.makedirs(pending, mode=0o700, exist_ok=True)
    dest = os.path.join(pending, job)
    remove(dest)
    os.replace(os.path.join(stage, "job"), dest)
    os.chmod(dest, 0o700)  # job.json holds the env's values


def cache_path(args):
    key = opt(args, "--cache")
    if not KEY_RE.match(key or ""):
        raise Refusal("%r is not a sync folder name" % key, "report this as a gpurig bug")
    return os.path.join(opt(args, "--sync-root") or "/srv/gpurig/sync", login_name(), key)


def login_name():
    uid = login_ids()[0]
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


# --- submitting a job ---------------------------------------------------------------------------


def job_dir(args):
    ident = opt(args, "--id")
    if not ID_RE.match(ident or ""):
        raise Refusal("%r is not a job id" % ident, "give the id gpurig run printed (gpurig jobs lists them)")
    return os.path.join(opt(args, "--root"), ident)


def snapshot(cache, work, uid):
    """``work`` as hard links to the synced files (a copy across filesystems); its folders handed to ``uid``."""
    tree = os.path.join(cache, TREE)
    with Locked(os.path.join(cache, "lock")):
        os.mkdir(work, 0o755)
        for path, st in walk(tree):
            src, dest = os.path.join(tree, path), os.path.join(work, path)
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(dest, 0o755)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dest)
            elif stat.S_ISREG(st.st_mode):
                try:
                    os.link(src, dest)
                except OSError as err:
                    if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                        raise
                    shutil.copy2(src, dest)
    if uid is not None and os.getuid() == 0:
        for path, st in [("", os.lstat(work))] + list(walk(work)):
            if stat.S_ISDIR(st.st_mode):
                os.chown(os.path.join(work, path) if path else work, uid, uid)


def cmd_submit(args):
    root = opt(args, "--root")
    directory = job_dir(args)
    ident = os.path.basename(directory)
    cache = cache_path(args)
    pending = os.path.join(cache, "pending", ident)
    if not os.path.isdir(pending):
        raise Refusal("job %s was not uploaded to %s" % (ident, cache), "run again")
    ensure_dir(root, 0o755)
    job = read_json(os.path.join(pending, "job.json"))
    if not job:
        raise Refusal("job %s's job.json is missing or unreadable" % ident, "run again")
    try:
        with Locked(os.path.join(root, ".lock")):
            if os.path.lexists(directory):
                raise Refusal("a job %s exists already on this host" % ident, "run again (a new id is drawn)")
            seq = (read_json(os.path.join(root, ".seq"), 0) or 0) + 1
            write_json(os.path.join(root, ".seq"), seq)
            os.mkdir(directory, 0o755)
        for name in os.listdir(pending):
            shutil.move(os.path.join(pending, name), os.path.join(directory, name))
        os.rmdir(pending)
        os.chmod(os.path.join(directory, "job.json"), 0o600)
        meta = dict(job["meta"], seq=seq, submitted_at=now())
        workdir = os.path.join(directory, "work")
        if job.get("exec"):
            workdir = exec_workdir(job, ident)
            write_json(os.path.join(directory, "job.json"), job, 0o600)
        snapshot(cache, workdir, job.get("uid"))
        meta["work"] = workdir
        write_json(os.path.join(directory, "meta.json"), meta)
        write_json(os.path.join(directory, "state.json"), {"state": "pending", "reason": "starting", "attempts": []})
        log = os.open(os.path.join(directory, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        os.close(log)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            shutil.rmtree(directory, ignore_errors=True)
            raise disk_full(err, root) from None
        raise
    how = start_supervisor(directory, ident)
    say({"id": ident, "seq": seq, "state": "pending", "supervisor": how, "work": workdir})


def exec_workdir(job, ident):
    """Where a job run in a deployed container keeps its copy: inside that container's /workspace volume."""
    data = Engine().call("GET", "/containers/%s/json" % job["exec"]["container"])
    if not data:
        raise Refusal("there is no container %s on this host" % job["exec"]["container"], "deploy it first (gpurig deploy), or drop --container")
    for mount in data.get("Mounts") or ():
        if mount.get("Destination") == "/workspace" and mount.get("Type") == "bind":
            base = os.path.join(mount["Source"], ".gpurig-jobs")
            ensure_dir(base, 0o755, None)
            job["exec"]["cwd"] = "/workspace/.gpurig-jobs/%s" % ident
            return os.path.join(base, ident)
    raise Refusal("container %s has no /workspace folder from the host to put the job's files in" % job["exec"]["container"],
                  "deploy it with gpurig (it mounts /srv/gpurig/NAME/workspace there), or run the job in a fresh container (--variant)")


def start_supervisor(directory, ident):
    """The job's own agent, detached from this SSH session: a systemd unit where systemd runs and this is root, else setsid."""
    argv = [sys.executable, os.path.join(directory, "job_agent.py"), "supervise", directory]
    null = open(os.devnull, "r+b")
    if os.getuid() == 0 and os.path.isdir("/run/systemd/system") and shutil.which("systemd-run"):
        unit = "gpurig-job-%s" % ident
        done = subprocess.run(["systemd-run", "--unit", unit, "--collect", "--quiet", "--description",
                               "gpurig job %s" % ident] + argv, stdin=null, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if done.returncode == 0:
            return "systemd unit %s" % unit
    subprocess.Popen(argv, stdin=null, stdout=null, stderr=null, start_new_session=True, close_fds=True)
    return "detached process"


# --- the supervisor: one job's whole life -------------------------------------------------------


class Job:
    def __init__(self, directory):
        self.dir = directory
        self.id = os.path.basename(directory)
        self.root = os.path.dirname(directory)
        self.spec = read_json(os.path.join(directory, "job.json"))
        self.meta = read_json(os.path.join(directory, "meta.json"))
        self.cancel = threading.Event()
        self.timed_out = threading.Event()
        self.engine = Engine()
        self.container = None  # the running container's id, or the exec's id
        self.output = None  # the attached stream of the container's stdout and stderr
        self.exec_pid = None

    def state(self):
        return read_json(os.path.join(self.dir, "state.json"), {}) or {}

    def update(self, **changes):
        with Locked(os.path.join(self.dir, ".state.lock")):
            doc = self.state()
            doc.update(changes)
            write_json(os.path.join(self.dir, "state.json"), doc)
        return doc

    def log(self, text):
        with open(os.path.join(self.dir, "log"), "ab") as f:
            f.write(("gpurig: %s\n" % text).encode())


def supervise(directory):
    job = Job(directory)
    sys.stderr = open(os.path.join(directory, "agent.log"), "a")
    me = {"pid": os.getpid(), "start": proc_start(os.getpid())}
    job.update(supervisor=me, boot=boot_token())

    def on_term(signum, frame):
        job.cancel.set()
        threading.Thread(target=stop_running, args=(job,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    spec = job.spec
    attempts = int(spec.get("retry") or 0) + 1
    result = {"state": "failed", "reason": "did not start", "exit_code": None}
    try:
        for attempt in range(1, attempts + 1):
            devices = wait_turn(job)  # a retry queues again: its early place in the queue puts it first
            if devices is None:
                break
            result = run_attempt(job, attempt, attempts, devices)
            if result["state"] != "failed" or job.cancel.is_set() or attempt == attempts:
                break
            job.log("attempt %d of %d %s; retrying" % (attempt, attempts, result["reason"]))
    except Refusal as err:  # the engine refused the container (a bad setting, a missing image): the job failed, and says why
        job.log(err.problem)
        result = {"state": "failed", "reason": err.problem, "exit_code": None}
        remove_container(job)
    except Exception as err:  # any other end is still an end: the job must never stay "running"
        job.log("the job agent failed: %r" % (err,))
        result = {"state": "failed", "reason": "the job agent failed: %s" % (err,), "exit_code": None}
        remove_container(job)
    if job.cancel.is_set():
        result = dict(result, state="cancelled", reason="cancelled" + (" while waiting for GPUs" if not job.state().get("attempts") else ""))
    job.update(state=result["state"], reason=result["reason"], exit_code=result.get("exit_code"), ended_at=now())
    prune(job)


def wants_gpus(request):
    return bool(request.get("all") or request.get("ids") or request.get("count"))


def wait_turn(job):
    """Start the job once its turn came: the device ids it got (``[]``: it asks for none), or None when cancelled first."""
    spec = job.spec
    request = spec.get("gpus") or {}
    if job.cancel.is_set():
        return None
    if spec.get("exec") or not wants_gpus(request):
        start_container(job, [])
        return []
    host_gpus = [tuple(g) for g in spec.get("host_gpus") or ()]
    said = None
    while not job.cancel.is_set():
        with Locked(os.path.join(job.root, ".lock")):
            ahead = queue_ahead(job.root, job.id, int(job.meta.get("seq") or 0))
            if ahead:
                why = "waiting in the queue: %d job%s ahead (%s first)" % (len(ahead), "" if len(ahead) == 1 else "s", ahead[0])
                devices = None
            else:
                devices, why = pick_gpus(request, host_gpus, held_gpus(job.engine, host_gpus, job.id), bool(spec.get("share")))
                if devices is not None:
                    start_container(job, devices)
                    return devices
        if why != said:
            job.update(state="pending", reason=why)
            said = why
        job.cancel.wait(POLL_S)
    return None


def queue_ahead(root, me, seq):
    """The ids of waiting GPU jobs submitted before ``seq`` whose supervisors still run (FIFO)."""
    ahead = []
    for name in os.listdir(root):
        if name == me or name.startswith("."):
            continue
        d = os.path.join(root, name)
        state = read_json(os.path.join(d, "state.json"), {}) or {}
        if state.get("state") != "pending" or not alive(state.get("supervisor")):
            continue
        meta = read_json(os.path.join(d, "meta.json"), {}) or {}
        if meta.get("exec") or not wants_gpus(meta.get("gpus") or {}):
            continue
        if int(meta.get("seq") or 0) < seq:
            ahead.append((int(meta.get("seq") or 0), name))
    return [name for _, name in sorted(ahead)]


def container_name(job):
    return "gpurig-job-%s" % job.id


def start_container(job, devices):
    """Create and start the job's container on ``devices`` (a fresh one per attempt); in exec mode, nothing to create."""
    if job.spec.get("exec"):
        return
    body = json.loads(json.dumps(job.spec["body"]))
    if devices:
        caps = [["gpu"]]
        body.setdefault("HostConfig", {})["DeviceRequests"] = [{"Driver": "", "Count": 0, "DeviceIDs": devices, "Capabilities": caps, "Options": {}}]
    name = container_name(job)
    job.engine.call("DELETE", "/containers/%s?force=1" % name)
    created = job.engine.call("POST", "/containers/create?name=%s" % name, body)
    job.container = created["Id"]
    # Attached before it starts, as `docker run` attaches: every byte it writes comes through, the last line without a
    # newline too (following the log file misses what is written as the container exits).
    job.output = job.engine.call("POST", "/containers/%s/attach?stream=1&stdout=1&stderr=1" % job.container, timeout=None, stream=True)
    job.engine.call("POST", "/containers/%s/start" % job.container)


def run_attempt(job, attempt, attempts, devices):
    spec = job.spec
    job.timed_out.clear()
    if job.cancel.is_set():  # the cancel came while the container started: it saw no container to stop
        stop_running(job)
    started = now()
    record = {"attempt": attempt, "started_at": started, "devices": devices}
    where = spec["exec"]["container"] if spec.get("exec") else container_name(job)
    job.update(state="running", reason="attempt %d of %d" % (attempt, attempts) if attempts > 1 else "", attempt=attempt,
               devices=devices, started_at=job.state().get("started_at") or started, container=where)
    sampler = start_sampler(job)
    timer = None
    if spec.get("timeout"):
        timer = threading.Timer(float(spec["timeout"]), timeout_hit, args=(job,))
        timer.daemon = True
        timer.start()
    log = open(os.path.join(job.dir, "log"), "ab", buffering=0)
    try:
        if spec.get("exec"):
            code = run_exec(job, log)
        else:
            job.engine.pump(job.output, log.write)
            waited = job.engine.call("POST", "/containers/%s/wait" % job.container, timeout=None) or {}
            code = waited.get("StatusCode")
    except Refusal as err:
        log.write(("gpurig: %s\n" % err.problem).encode())
        code = None
    finally:
        log.close()
        if timer:
            timer.cancel()
        stop_sampler(sampler)
        remove_container(job)
    record.update(ended_at=now(), exit_code=code)
    if job.cancel.is_set():
        state, reason = "cancelled", "cancelled"
    elif job.timed_out.is_set():
        state, reason = "failed", "timed out after %s" % seconds_text(float(spec["timeout"]))
    elif code == 0:
        state, reason = "succeeded", ""
    elif code is None:
        state, reason = "failed", "lost the container (see the log)"
    elif code > 128:
        state, reason = "failed", "killed by signal %d" % (code - 128)
    else:
        state, reason = "failed", "exited %d" % code
    record.update(state=state, reason=reason)
    job.update(attempts=job.state().get("attempts", []) + [record])
    return {"state": state, "reason": reason, "exit_code": code}


def remove_container(job):
    """The attempt's container goes once its exit code and log are kept (an exec's container is a deployed one: it stays)."""
    if not job.spec.get("exec") and job.container:
        try:
            job.engine.call("DELETE", "/containers/%s?force=1" % job.container)
        except Refusal:
            pass
    if job.output is not None:
        job.output[0].close()
    job.container = job.output = None


def seconds_text(s):
    s = int(s)
    return "%dh%02dm" % (s // 3600, s % 3600 // 60) if s >= 3600 else "%dm%02ds" % (s // 60, s % 60) if s >= 60 else "%ds" % s


def run_exec(job, log):
    ex = job.spec["exec"]
    body = {"Cmd": ex["argv"], "AttachStdout": True, "AttachStderr": True, "WorkingDir": ex.get("cwd") or "/workspace",
            "Env": ex.get("env") or []}
    if ex.get("user"):
        body["User"] = ex["user"]
    made = job.engine.call("POST", "/containers/%s/exec" % ex["container"], body)
    if not made:
        raise Refusal("container %s is gone" % ex["container"], "deploy it again")
    job.container = made["Id"]

    def learn_pid():
        for _ in range(100):
            info = job.engine.call("GET", "/exec/%s/json" % made["Id"]) or {}
            if info.get("Pid"):
                job.exec_pid = int(info["Pid"])
                if job.cancel.is_set():  # cancelled before its pid was known
                    stop_running(job)
                return
            if info.get("Running") is False and info.get("ExitCode") is not None:
                return
            time.sleep(0.1)

    threading.Thread(target=learn_pid, daemon=True).start()
    job.engine.stream("POST", "/exec/%s/start" % made["Id"], {"Detach": False, "Tty": False}, log.write)
    for _ in range(100):
        info = job.engine.call("GET", "/exec/%s/json" % made["Id"]) or {}
        if not info.get("Running"):
            return info.get("ExitCode")
        time.sleep(0.1)
    return None


def stop_running(job):
    """Cancel or timeout: the container stopped with its grace period (TERM, then KILL), or the exec's process tree."""
    grace = float(job.spec.get("grace") or 10)
    try:
        if job.spec.get("exec"):
            if job.exec_pid:
                stop_tree(job.exec_pid, grace)
        elif job.container:
            job.engine.call("POST", "/containers/%s/stop?t=%d" % (job.container, int(grace)), timeout=grace + 30)
    except Refusal as err:
        job.log("could not stop the job: %s" % err.problem)


def timeout_hit(job):
    job.timed_out.set()
    job.log("timed out after %s; stopping it" % seconds_text(float(job.spec["timeout"])))
    stop_running(job)


def start_sampler(job):
    path = os.path.join(job.dir, "gpu_sampler.py")
    if not os.path.exists(path):
        return None
    out = open(os.path.join(job.dir, "samples.jsonl"), "ab")
    try:
        return subprocess.Popen([sys.executable, path, "--interval", str(job.spec.get("sample_interval") or 2)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.DEVNULL)
    finally:
        out.close()


def stop_sampler(proc):
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def prune(job):
    """Keep the ``keep`` newest ended jobs of the same working directory; older ones (and their copies) go."""
    keep = job.spec.get("keep")
    if keep is None:
        return
    mine = []
    with Locked(os.path.join(job.root, ".lock")):
        for name in os.listdir(job.root):
            d = os.path.join(job.root, name)
            meta = read_json(os.path.join(d, "meta.json"), {}) or {}
            state = read_json(os.path.join(d, "state.json"), {}) or {}
            if meta.get("sync") == job.meta.get("sync") and state.get("state") in FINAL:
                mine.append((int(meta.get("seq") or 0), d, meta))
        for _, d, meta in sorted(mine, reverse=True)[int(keep):]:
            work = meta.get("work") or ""
            if work and not work.startswith(d + "/"):
                shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(d, ignore_errors=True)


# --- reading jobs -------------------------------------------------------------------------------


def describe(directory, token):
    """One job's document; a pending or running job whose supervisor is gone is made failed here, with why."""
    meta = read_json(os.path.join(directory, "meta.json"))
    state = read_json(os.path.join(directory, "state.json"))
    if meta is None or state is None:
        return None
    if state.get("state") not in FINAL and not alive(state.get("supervisor")):
        if state.get("supervisor") is None and time.time() - float(meta.get("submitted_at") or 0) < 30:
            pass  # just submitted: its supervisor has not said its pid yet
        else:
            rebooted = state.get("boot") not in (None, token)
            why = "host rebooted" if rebooted else "its job agent ended unexpectedly (see %s/agent.log)" % directory
            with Locked(os.path.join(directory, ".state.lock")):
                state = read_json(os.path.join(directory, "state.json"), state)
                state.update(state="failed", reason=why, ended_at=state.get("ended_at") or now())
                write_json(os.path.join(directory, "state.json"), state)
    doc = dict(meta)
    doc.update(state)
    doc["id"] = os.path.basename(directory)
    doc.pop("supervisor", None)
    doc.pop("boot", None)
    return doc


def cmd_list(args):
    root = opt(args, "--root")
    wanted = many(args, "--id")
    token = boot_token()
    jobs = []
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    for name in names:
        if name.startswith(".") or (wanted and not any(name.startswith(w) for w in wanted)):
            continue
        doc = describe(os.path.join(root, name), token)
        if doc:
            jobs.append(doc)
    waiting = sorted((j for j in jobs if j.get("state") == "pending"), key=lambda j: j.get("seq") or 0)
    for place, j in enumerate(waiting, 1):
        j["queue_position"] = place
    say({"jobs": jobs})


def cmd_cancel(args):
    directory = job_dir(args)
    grace = float(opt(args, "--grace") or 10)
    doc = describe(directory, boot_token())
    if doc is None:
        raise Refusal("there is no job %s on this host" % os.path.basename(directory), "see the ids with gpurig jobs")
    if doc["state"] in FINAL:
        say({"id": doc["id"], "state": doc["state"], "changed": False, "reason": doc.get("reason", "")})
        return
    state = read_json(os.path.join(directory, "state.json"), {})
    spec = read_json(os.path.join(directory, "job.json"), {})
    if grace != float(spec.get("grace") or 10):
        spec["grace"] = grace
        write_json(os.path.join(directory, "job.json"), spec, 0o600)
    pid = (state.get("supervisor") or {}).get("pid")
    if pid:
        os.kill(int(pid), signal.SIGTERM)
    end = time.monotonic() + grace + 30
    while time.monotonic() < end:
        doc = describe(directory, boot_token())
        if doc["state"] in FINAL:
            break
        time.sleep(0.2)
    say({"id": doc["id"], "state": doc["state"], "changed": doc["state"] == "cancelled", "reason": doc.get("reason", "")})


def cmd_logs(args):
    directory = job_dir(args)
    path = os.path.join(directory, "log")
    if not os.path.exists(os.path.join(directory, "meta.json")):
        raise Refusal("there is no job %s on this host" % os.path.basename(directory), "see the ids with gpurig jobs")
    tail = int(opt(args, "--tail") or 0)
    follow = "--follow" in args
    out = sys.stdout.buffer
    with open(path, "rb") as f:
        if tail:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            start = max(0, size - 65536 * 4)
            f.seek(start)
            data = f.read()
            lines = data.split(b"\n")
            keep = lines[-(tail + 1):] if data.endswith(b"\n") else lines[-tail:]
            out.write(b"\n".join(keep))
        else:
            shutil.copyfileobj(f, out)
        out.flush()
        token = boot_token()
        waiting = None  # the pending reason last told (gpurig-job-wait on stderr): once when the job waits, again when why changes
        while follow:
            chunk = f.read(65536)
            if chunk:
                out.write(chunk)
                out.flush()
                continue
            doc = describe(directory, token)
            if doc is None or doc["state"] in FINAL:
                rest = f.read()
                out.write(rest)
                out.flush()
                break
            now_waiting = doc.get("reason", "") if doc["state"] == "pending" else None
            if now_waiting != waiting:
                sys.stderr.write("gpurig-job-wait: %s\n" % json.dumps({"state": doc["state"], "reason": doc.get("reason", "")}))
                sys.stderr.flush()
                waiting = now_waiting
            time.sleep(0.25)
    doc = describe(directory, boot_token()) or {}
    sys.stderr.write("gpurig-job-state: %s\n" % json.dumps({"state": doc.get("state"), "exit_code": doc.get("exit_code"),
                                                             "reason": doc.get("reason", "")}))


def artifact_files(directory):
    meta = read_json(os.path.join(directory, "meta.json"), {}) or {}
    work = meta.get("work") or os.path.join(directory, "work")
    files = {}
    for wanted in meta.get("artifacts") or ():
        rel = wanted.strip("/")
        if safe_member("code/" + rel, "code") is None:
            continue
        top = os.path.join(work, rel)
        if os.path.isfile(top) and not os.path.islink(top):
            files[rel] = top
        elif os.path.isdir(top) and not os.path.islink(top):
            for path, st in walk(top):
                if stat.S_ISREG(st.st_mode):
                    files[rel + "/" + path] = os.path.join(top, path)
    return work, files


def cmd_artifacts(args):
    directory = job_dir(args)
    _, files = artifact_files(directory)
    listed = {}
    for rel, path in sorted(files.items()):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        st = os.stat(path)
        listed[rel] = [st.st_size, digest.hexdigest(), stat.S_IMODE(st.st_mode), int(st.st_mtime)]
    say({"files": listed})


def cmd_pack(args):
    directory = job_dir(args)
    _, files = artifact_files(directory)
    wanted = args[args.index("--") + 1:] if "--" in args else sorted(files)
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT, bufsize=1 << 20) as tar:
        for rel in wanted:
            if rel in files:
                tar.add(files[rel], arcname=rel, recursive=False)
    sys.stdout.buffer.flush()


def cmd_samples(args):
    directory = job_dir(args)
    kept, samples = [], []
    try:
        with open(os.path.join(directory, "samples.jsonl"), "rb") as f:
            for raw in f:
                try:
                    record = json.loads(raw.decode())
                except ValueError:
                    continue
                (samples if record.get("type") == "sample" else kept).append(record)
    except OSError:
        pass
    step = max(1, (len(samples) + MAX_SAMPLES - 1) // MAX_SAMPLES)
    say({"records": kept + samples[::step], "thinned": step})


# --- the command line ---------------------------------------------------------------------------


def opt(args, name):
    if name in args:
        i = args.index(name)
        if i + 1 < len(args):
            return args[i + 1]
    return None


def many(args, name):
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]


VERBS = {"manifest": cmd_manifest, "apply": cmd_apply, "submit": cmd_submit, "list": cmd_list, "cancel": cmd_cancel,
         "logs": cmd_logs, "artifacts": cmd_artifacts, "pack": cmd_pack, "samples": cmd_samples}


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["supervise"] and len(args) == 2:
        supervise(args[1])
        return 0
    verb = VERBS.get(args[0] if args else "")
    if verb is None:
        sys.stderr.write("usage: job_agent.py {%s} ...\n" % ",".join(sorted(VERBS)))
        return 2
    try:
        verb(args)
    except Refusal as err:
        sys.stderr.write(ERROR + json.dumps({"problem": err.problem, "fix": err.fix}) + "\n")
        return REFUSED
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            refusal = disk_full(err, err.filename or "the host")
            sys.stderr.write(ERROR + json.dumps({"problem": refusal.problem, "fix": refusal.fix}) + "\n")
            return REFUSED
        sys.stderr.write(ERROR + json.dumps({"problem": "%s: %s" % (err.filename or "the host", err.strerror or err),
                                             "fix": "see the host's state; run again"}) + "\n")
        return REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
