#!/usr/bin/env python3
"""One rank of the fabric proof: a torch.distributed all-reduce across hosts, timed per message size.

Run inside the user's image on every selected host, one rank each, all with
the same --world, --master-addr/--master-port, --sizes and --iters:
    python3 fabric_allreduce.py --json --rank R --world N --master-addr ADDR --master-port PORT
Standalone on purpose (stdlib plus torch), so it imports nothing of gpurig.
Each size's figures use nccl-tests' definitions for all-reduce: algbw =
bytes / time, busbw = algbw * 2(n-1)/n, in GB/s (1e9 bytes); the time is the
median of the iterations. A small-message latency is the median of an
8-byte all-reduce. ``--json`` prints
    {"probe": "fabric", "version": 1, "rank", "world", "backend", "host", "interface",
     "sizes": [{"bytes", "iters", "seconds", "algbw", "busbw"}], "latency_us", "records": [...]}
(every rank prints its own; rank 0's is the verdict's input). It fails
closed: a rendezvous that does not answer, a missing backend, a peer that is
gone or a collective that stalls past --timeout is a ``fail`` record naming
the phase, never a hang: a watchdog prints the document and exits when a
phase overruns. Exit status: 1 if any record failed, else 0 (2 for bad arguments).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import threading
import time

PROBE = "fabric"
VERSION = 1
DEFAULT_SIZES = tuple(4096 << (2 * i) for i in range(9))  # 4 kB, 16 kB, ... 256 MB: x4 steps, as nccl-tests' -f 4
LATENCY_BYTES = 8  # two float32: the message is all latency, no bandwidth
EXIT_WATCHDOG = 3
RENDEZVOUS_FIX = ("check that {addr} is rank 0's address as every host reaches it (a loopback or docker0/bridge address is "
                  "not) and that TCP port {port} is open to it from this host (firewall, security group); rank 0 must start too")
PEER_FIX = ("a peer rank died or its link dropped: look at that host's output; check the interface the backend uses "
            "(--interface / NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) is up and routable between the hosts")


def record(rid, status, measured=None, expected=None, unit="", detail="", fix=""):
    return {"id": rid, "status": status, "measured": measured, "expected": expected, "unit": unit, "detail": detail, "fix": fix}


# ---- decisions: pure ---------------------------------------------------------------------------


def parse_size(text):
    """'4k' / '256M' / '1G' / '4096' -> bytes (k = 1024); a whole float32 count, at least 4 bytes."""
    text = str(text).strip()
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:].lower(), 1)
    number = int(float(text[:-1] if scale > 1 else text) * scale)
    if number < 4:
        raise ValueError(f"size {text!r} is under one float32 (4 bytes)")
    return number - number % 4


def parse_sizes(text):
    return tuple(parse_size(part) for part in str(text).split(",") if part.strip())


def iters_for(nbytes, iters):
    """Fewer iterations for large messages, at least 3: a 256 MB message takes ~20 ms on 100 Gb/s, seconds on 1 Gb/s."""
    if nbytes <= 4 << 20:
        return iters
    if nbytes <= 64 << 20:
        return max(3, iters // 4)
    return max(3, iters // 8)


def algbw(nbytes, seconds):
    """nccl-tests' algorithm bandwidth, GB/s: bytes / time."""
    return nbytes / seconds / 1e9


def busbw(nbytes, seconds, world):
    """nccl-tests' bus bandwidth of an all-reduce, GB/s: algbw * 2(n-1)/n, comparable with the link's speed."""
    return algbw(nbytes, seconds) * 2 * (world - 1) / world


def size_figures(nbytes, times, world):
    seconds = statistics.median(times)
    return {"bytes": nbytes, "iters": len(times), "seconds": seconds,
            "algbw": algbw(nbytes, seconds), "busbw": busbw(nbytes, seconds, world)}  # unrounded: a slow link's figures are small


def human(nbytes):
    for unit, shift in (("GB", 30), ("MB", 20), ("kB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def pick_backend(wanted, dist_available, nccl_available, gloo_available, cuda_available):
    """(backend, None) or (None, (detail, fix)): NCCL where GPUs are present, gloo otherwise."""
    if not dist_available:
        return None, ("this torch was built without torch.distributed", "use an image whose torch has distributed support (the PyPI wheels do)")
    if wanted == "auto":
        wanted = "nccl" if cuda_available and nccl_available else "gloo"
    if wanted == "nccl" and not (nccl_available and cuda_available):
        why = "no CUDA GPU visible" if not cuda_available else "this torch has no NCCL"
        return None, (f"backend nccl asked for, but {why}", "use --backend gloo, or run in an image with CUDA torch and GPUs")
    if wanted == "gloo" and not gloo_available:
        return None, ("backend gloo asked for, but this torch has no gloo", "use a torch build with gloo (the PyPI wheels have it)")
    return wanted, None


def rendezvous_failure(err, rank, addr, port, timeout):
    text = first_line(err)
    return record("fabric.rendezvous", "fail", None, f"{addr}:{port}", "",
                  f"rank {rank} could not meet the other ranks at {addr}:{port} within {timeout:g} s: {text}",
                  RENDEZVOUS_FIX.format(addr=addr, port=port))


def first_line(err):
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


# ---- the run -----------------------------------------------------------------------------------


class Watchdog:
    """Ends the probe with its document when a phase makes no progress for its time: a dead peer must not hang verify.

    One polling thread reads the time of the last beat; the measuring loop beats after every collective (a
    float written, no thread per operation, so the latency figures are not skewed).
    """

    POLL_S = 0.25

    def __init__(self, doc, emit):
        self.doc, self.emit, self.phase, self.last, self.closed = doc, emit, None, time.monotonic(), False
        threading.Thread(target=self._watch, daemon=True).start()

    def arm(self, phase, seconds, rid, fix):
        self.last = time.monotonic()
        self.phase = (phase, seconds, rid, fix)

    def beat(self):
        self.last = time.monotonic()

    def disarm(self):
        self.phase = None

    def close(self):
        self.phase, self.closed = None, True

    def _watch(self):
        while not self.closed:
            time.sleep(self.POLL_S)
            phase = self.phase
            if phase is not None and time.monotonic() - self.last > phase[1]:
                what, seconds, rid, fix = phase
                self.doc["records"].append(record(rid, "fail", None, f"< {seconds:g} s", "",
                                                  f"{what} made no progress for {seconds:g} s: a peer stopped answering", fix))
                self.emit(self.doc)
                os._exit(EXIT_WATCHDOG)


def measure(dist, torch, device, nbytes, iters, sync, beat=lambda: None):
    """(correct, per-iteration seconds) of an in-place float32 all-reduce of ``nbytes``."""
    world, rank = dist.get_world_size(), dist.get_rank()
    tensor = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(tensor)  # warm-up, and the sum 1 + 2 + ... + n checked once
    sync()
    beat()
    want = world * (world + 1) / 2
    correct = bool(tensor[0].item() == want and tensor[-1].item() == want)
    tensor.zero_()  # zeros stay zeros however often they are summed: no overflow over the iterations
    dist.all_reduce(tensor)
    sync()
    beat()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        dist.all_reduce(tensor)
        sync()
        times.append(time.perf_counter() - start)
        beat()
    return correct, times


def run(args, doc, watchdog):
    records = doc["records"]
    try:
        import torch
        import torch.distributed as dist
    except Exception as err:  # ImportError, or a CUDA library that fails to load
        records.append(record("fabric.backend", "fail", None, args.backend, "", f"torch does not import: {first_line(err)}",
                              "run the fabric probe in the image that trains (its python3 has torch)"))
        return
    cuda = torch.cuda.is_available()
    backend, why = pick_backend(args.backend, dist.is_available(), dist.is_available() and dist.is_nccl_available(),
                                dist.is_available() and dist.is_gloo_available(), cuda)
    if backend is None:
        records.append(record("fabric.backend", "fail", None, args.backend, "", *why))
        return
    device = torch.device("cuda", args.device) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    doc["backend"], doc["device"] = backend, str(device)
    records.append(record("fabric.backend", "pass", backend, args.backend, "",
                          f"torch {torch.__version__}, {backend} on {device}" + (f" over {args.interface}" if args.interface else "")))
    start = time.monotonic()
    watchdog.arm(f"the rendezvous at {args.master_addr}:{args.master_port}", args.timeout + 5, "fabric.rendezvous",
                 RENDEZVOUS_FIX.format(addr=args.master_addr, port=args.master_port))
    try:
        dist.init_process_group(backend, init_method=f"tcp://{args.master_addr}:{args.master_port}", rank=args.rank,
                                world_size=args.world, timeout=datetime.timedelta(seconds=args.timeout))
    except Exception as err:  # connection refused or timed out, a rank missing: all the rendezvous' failure
        watchdog.disarm()
        records.append(rendezvous_failure(err, args.rank, args.master_addr, args.master_port, args.timeout))
        return
    records.append(record("fabric.rendezvous", "pass", round(time.monotonic() - start, 2), None, "s",
                          f"{args.world} ranks met at {args.master_addr}:{args.master_port}"))
    try:
        measure_all(args, doc, watchdog, dist, torch, device)
    finally:
        watchdog.disarm()
        try:
            dist.destroy_process_group()
        except Exception:  # a peer already gone: nothing left to tear down cleanly
            pass


def measure_all(args, doc, watchdog, dist, torch, device):
    records = doc["records"]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    wrong = []
    watchdog.arm("the first all-reduces (connections set up)", args.timeout, "fabric.allreduce", PEER_FIX)
    measure(dist, torch, device, LATENCY_BYTES, 5, sync, watchdog.beat)  # the first collectives open connections: not a latency
    for nbytes in (LATENCY_BYTES,) + tuple(args.sizes):
        watchdog.arm(f"the all-reduce of {human(nbytes)}", args.timeout, "fabric.allreduce", PEER_FIX)
        try:
            correct, times = measure(dist, torch, device, nbytes, iters_for(nbytes, args.iters) * (3 if nbytes == LATENCY_BYTES else 1),
                                     sync, watchdog.beat)
        except Exception as err:  # a peer gone: gloo says so at once (connection reset), NCCL as an error
            records.append(record("fabric.allreduce", "fail", None, None, "",
                                  f"the all-reduce of {human(nbytes)} failed on rank {args.rank}: {first_line(err)}", PEER_FIX))
            return
        if not correct:
            wrong.append(human(nbytes))
        if nbytes == LATENCY_BYTES:
            doc["latency_us"] = round(statistics.median(times) * 1e6, 1)
        else:
            doc["sizes"].append(size_figures(nbytes, times, args.world))
    watchdog.disarm()
    records.append(record("fabric.allreduce.correct", "fail" if wrong else "pass", not wrong, True, "",
                          f"wrong sums at {', '.join(wrong)}" if wrong else f"every size summed to 1+...+{args.world}",
                          "a rank computes wrong sums: check that host's GPU (verify --level full) and NCCL_PROTO/NCCL_ALGO overrides" if wrong else ""))
    last = doc["sizes"][-1]
    records.append(record("fabric.allreduce", "pass", float(f"{last['busbw']:.4g}"), None, "GB/s",
                          f"busbw at {human(last['bytes'])} across {args.world} ranks ({doc['backend']}); algbw {last['algbw']:.4g} GB/s"))
    records.append(record("fabric.latency", "pass", doc["latency_us"], None, "us", f"median 8-byte all-reduce across {args.world} ranks"))


# ---- output ------------------------------------------------------------------------------------


def emit(doc, as_json=True):
    if as_json:
        text = json.dumps(doc) + "\n"
    else:
        lines = [f"rank {doc['rank']}/{doc['world']} {doc.get('backend') or '-'} on {doc['host']}"]
        lines += [f"{human(s['bytes']):>8}  {s['seconds'] * 1e3:10.3f} ms  algbw {s['algbw']:8.3f}  busbw {s['busbw']:8.3f} GB/s"
                  for s in doc["sizes"]]
        if doc.get("latency_us") is not None:
            lines.append(f"latency (8 B): {doc['latency_us']} us")
        lines += [f"{r['status'].upper():5} {r['id']}: {r['detail']}" + (f"\n      fix: {r['fix']}" if r["fix"] else "")
                  for r in doc["records"]]
        text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="fabric_allreduce.py", description=__doc__.split("\n")[0])
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the document as one JSON line (the default)")
    out.add_argument("--text", action="store_true", help="print the figures and records for people")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master-addr", required=True, help="rank 0's address, reachable from every host")
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES, help="comma list: 4k,1M,256M (default 4 kB..256 MB, x4)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations for small sizes; large ones get fewer (>= 3)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds the rendezvous, and each all-reduce, may take")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument("--interface", help="network interface for the backend (sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME)")
    parser.add_argument("--device", type=int, default=0, help="the CUDA device this rank uses with nccl")
    args = parser.parse_args(argv)
    if not 0 <= args.rank < args.world or args.iters < 1 or args.timeout <= 0 or not args.sizes:
        parser.error("need 0 <= --rank < --world, --iters >= 1, --timeout > 0 and at least one size")
    if args.interface:
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = args.interface
    doc = {"probe": PROBE, "version": VERSION, "rank": args.rank, "world": args.world, "backend": None, "device": None,
           "host": socket.gethostname(), "interface": args.interface, "master": f"{args.master_addr}:{args.master_port}",
           "sizes": [], "latency_us": None, "records": []}
    lock, emitted = threading.Lock(), []

    def emit_once(d):  # the watchdog and the main thread may both end the run: one document only
        with lock:
            if not emitted:
                emitted.append(True)
                emit(d, not args.text)

    run(args, doc, Watchdog(doc, emit_once))
    emit_once(doc)
    return 1 if any(r["status"] == "fail" for r in doc["records"]) else 0


if __name__ == "__main__":
    sys.exit(main())
