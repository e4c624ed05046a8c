"""gpurig's peer tunnel: on a host that pulls layers, an SSH local forward to a serving host's loopback, for one run.

Standalone (Python 3.7+, stdlib and the host's own OpenSSH client), started by gpurig over its SSH connection:

    python3 peer_tunnel.py --address ADDR --ssh-port 22 --login USER --target-port N --host-key 'ssh-ed25519 AAAA...'

stdin first carries the one-time private key (OpenSSH format, up to its END line): it never appears in a command
line, a process list or a log. It is written into a private temporary folder beside a known_hosts file that holds
only the serving host's key as gpurig checked it, and `ssh -N -L 127.0.0.1:PORT:127.0.0.1:N` runs with both, host
key checking strict, no agent and no other identity. On a CPU with AES instructions it offers AES-GCM first (the
layers cross the link at about half the CPU of OpenSSH's default chacha20-poly1305; every cipher the client knows stays
offered, so a server that allows fewer still agrees on one). Once the forward answers, one JSON line: ``{"event": "ready",
"port": PORT}`` (or ``{"event": "failed", "why": ...}``, exit 3). When stdin ends (gpurig is done, interrupted or
gone: its channel closed), ssh is stopped and the folder removed: nothing of the run is left on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

READY_TIMEOUT_S = 20


def read_key(stream) -> bytes:
    lines = []
    while True:
        line = stream.readline()
        if not line:
            raise ValueError("stdin ended before the key's END line")
        lines.append(line)
        if line.startswith(b"-----END ") and len(lines) > 1:
            return b"".join(lines)
        if len(lines) > 200:
            raise ValueError("no key on stdin")


# AES-GCM first where the CPU has AES instructions (2 GiB through a forward here: 3.5 core-s for ssh and sshd together
# against 6.3 with chacha20-poly1305, OpenSSH's first choice), then OpenSSH's own order
AES_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr")


def preferred_ciphers(cpuinfo: str, known: list[str]) -> str | None:
    """The Ciphers option for a CPU whose /proc/cpuinfo is ``cpuinfo`` and an ssh that knows ``known`` (``ssh -Q cipher``):
    AES-GCM first where the CPU has AES instructions (x86's "aes" flag, Arm's "aes" feature); None: OpenSSH's default."""
    aes = any(key.strip() in ("flags", "Features") and "aes" in value.split()
              for key, _, value in (line.partition(":") for line in cpuinfo.splitlines()))
    offered = [c for c in AES_FIRST if c in known]
    return ",".join(offered) if aes and offered and offered[0].startswith("aes") and offered[0].endswith("-gcm@openssh.com") else None


def cipher_options() -> list[str]:
    try:
        with open("/proc/cpuinfo") as info:
            cpuinfo = info.read()
        known = subprocess.run(["ssh", "-Q", "cipher"], capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return []
    chosen = preferred_ciphers(cpuinfo, known)
    return ["-o", f"Ciphers={chosen}"] if chosen else []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def say(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="an SSH local forward to a peer's loopback for one gpurig run")
    parser.add_argument("--address", required=True)
    parser.add_argument("--ssh-port", type=int, default=22)
    parser.add_argument("--login", required=True)
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--host-key", required=True, help="the serving host's key: TYPE BASE64")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="gpurig-peer-")  # 0700
    ssh = None
    try:
        try:
            key = read_key(sys.stdin.buffer)
        except ValueError as err:
            say("failed", why=str(err))
            return 3
        key_file = os.path.join(folder, "key")
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(key)
        key_type = args.host_key.split()[0]
        name = args.address if args.ssh_port == 22 else f"[{args.address}]:{args.ssh_port}"
        known = os.path.join(folder, "known_hosts")
        with open(known, "w") as out:
            out.write(f"{name} {args.host_key}\n")
        port = free_port()
        argv = ["ssh", "-N", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", f"IdentityFile={key_file}",
                "-o", "IdentityAgent=none", "-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=yes", "-o", f"HostKeyAlgorithms={key_type}", "-o", "ExitOnForwardFailure=yes",
                "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR",
                *cipher_options(), "-L", f"127.0.0.1:{port}:127.0.0.1:{args.target_port}", "-p", str(args.ssh_port), "--", f"{args.login}@{args.address}"]
        try:
            ssh = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except OSError as err:
            say("failed", why=f"cannot start ssh on this host: {err.strerror or err}")
            return 3
        end = time.monotonic() + READY_TIMEOUT_S
        while not answers(port):
            if ssh.poll() is not None or time.monotonic() > end:
                if ssh.poll() is None:
                    ssh.terminate()
                why = (ssh.communicate(timeout=10)[1] or b"").decode(errors="replace").strip().splitlines()
                say("failed", why=why[-1] if why else f"ssh to {args.address}:{args.ssh_port} gave no forward within {READY_TIMEOUT_S} s")
                return 3
            time.sleep(0.1)  # polling the forward's port with a deadline, not a synchronisation sleep
        say("ready", port=port)
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        return 0
    finally:
        if ssh is not None and ssh.poll() is None:
            ssh.send_signal(signal.SIGTERM)
            try:
                ssh.wait(timeout=10)
            except subprocess.TimeoutExpired:
                ssh.kill()
                ssh.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
