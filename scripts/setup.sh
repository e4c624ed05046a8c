#!/usr/bin/env bash
# Prepare a fresh Debian/Ubuntu machine (as root) for gpurig: the tool, a
# running Docker engine with BuildKit, and what the test suite drives for real
# (sshd, sudo, debootstrap, a registry, hadolint). Safe to run again.
set -euo pipefail

log() { printf 'setup: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    log "run as root (it installs packages and starts dockerd)"; exit 1
fi

export DEBIAN_FRONTEND=noninteractive
packages=(docker.io openssh-server sudo debootstrap docker-registry git prometheus)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The Debian packages start services through init scripts where there is an
# init; here nothing else may hold the registry's port or sshd's, and the
# monitor tests start their own Prometheus (the packaged one would hold 9090).
systemctl disable --now docker-registry >/dev/null 2>&1 || service docker-registry stop >/dev/null 2>&1 || true
systemctl disable --now prometheus >/dev/null 2>&1 || service prometheus stop >/dev/null 2>&1 || true

log "installing gpurig and its test tools"
# A distribution's own python3 (Debian 12's) refuses pip installs (PEP 668) unless told: this
# machine is set up for gpurig and its tests, as root, so it is told.
export PIP_BREAK_SYSTEM_PACKAGES=1
python3 -m pip install -q -e '.[test]'
# The CPU build of torch, for the probe tests on this (GPU-less) machine.
python3 -m pip install -q 'torch==2.13.0' || log "torch not installed: the probe's torch tests will be skipped"

if ! docker info >/dev/null 2>&1 && ! /usr/bin/docker info >/dev/null 2>&1; then
    log "starting dockerd"
    mkdir -p /var/log
    nohup dockerd >/var/log/gpurig-dockerd.log 2>&1 &
    for _ in $(seq 1 120); do
        /usr/bin/docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    /usr/bin/docker info >/dev/null 2>&1 || { log "dockerd did not start; see /var/log/gpurig-dockerd.log"; exit 1; }
fi
log "ready"
