#!/usr/bin/env bash
# Prepare a fresh Debian/Ubuntu machine (as root) for gpurig: the tool, a
# running Docker engine with BuildKit, and what the test suite drives for real
# (sshd, sudo, debootstrap, a registry, hadolint, headless Chromium and its driver
# for the dashboard's browser test). Safe to run again.
set -euo pipefail

log() { printf 'setup: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    log "run as root (it installs packages and starts dockerd)"; exit 1
fi

export DEBIAN_FRONTEND=noninteractive
packages=(docker.io openssh-server sudo debootstrap docker-registry git prometheus python3-venv chromium chromium-driver)
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
# The CPU build of torch, for the probe tests on this (GPU-less) machine. Without it those tests would
# skip and the suite would pass having checked nothing of the torch probe: stop here instead.
if ! python3 -m pip install -q 'torch==2.13.0' || ! python3 -c 'import torch' >/dev/null 2>&1; then
    log "torch 2.13.0 could not be installed or imported (see pip's message above): the torch probe's tests need it; fix the index or the network and run this again"
    exit 1
fi
# ansible-core, the version tests/fixtures/inventory/ansible/ was recorded with, in its own venv (system packages
# visible, so only ansible-core and resolvelib are fetched): `gpurig inventory` is compared with it live, which
# proves the recorded outputs are ansible-inventory's own. .bench-venv is git-ignored; bench/ uses it too.
ansible_version=$(.bench-venv/bin/ansible-inventory --version 2>/dev/null || true)
if [[ "$ansible_version" != *"core 2.19.14"* ]]; then
    log "installing ansible-core 2.19.14 into .bench-venv"
    python3 -m venv --system-site-packages .bench-venv
    if ! .bench-venv/bin/python -m pip install -q 'ansible-core==2.19.14'; then
        log "ansible-core 2.19.14 could not be installed into .bench-venv: the live ansible-inventory comparisons need it; fix the index or the network and run this again"
        exit 1
    fi
fi

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
