"""What a built image holds, read by running a script in a throwaway container of it (no network): the versions pip and
dpkg resolved (``resolved_versions``), and, for locks, the files its build steps left (``gpurig.image.lock``)."""

from __future__ import annotations

import secrets

from gpurig.connect.engine import Engine, EngineError
from gpurig.connect.engineinfo import Exited
from gpurig.errors import DockerError

PROBE_LABEL = "io.gpurig.probe"
# Run inside a built image (no value from outside reaches it): what pip and dpkg resolved.
FREEZE_SCRIPT = "/opt/venv/bin/pip freeze --all; echo '--- dpkg'; dpkg-query -W -f '${Package}=${Version}\\n'"
PROBE_TIMEOUT_S = 300


def run_probe(engine: Engine, image_id: str, script: str, labels: dict[str, str]) -> Exited:
    """``script`` run by /bin/sh as root in a throwaway container of the image, with no network, labelled with ``labels``.

    The engine's refusal (the image cannot start) is an exit of 125 with its reason, as ``docker run`` gives it;
    a script still running after PROBE_TIMEOUT_S is a DockerError (its container is removed, as on every way out).
    """
    body = {"Image": image_id, "Entrypoint": ["/bin/sh"], "Cmd": ["-c", script], "User": "0", "Labels": dict(labels),
            "NetworkDisabled": True, "HostConfig": {"NetworkMode": "none"}}
    try:
        ended = engine.run(body, f"gpurig-probe-{secrets.token_hex(4)}", PROBE_TIMEOUT_S)
    except EngineError as err:
        return Exited(125, "", err.reason)
    if ended is None:
        raise DockerError(f"a probe in {image_id[:19]} gave no answer within {PROBE_TIMEOUT_S} s", "check that the daemon is healthy")
    return ended


def resolved_versions(engine: Engine, image_id: str, labels: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(pip freeze, dpkg package=version) as resolved inside the image; the probe container has no network."""
    ended = run_probe(engine, image_id, FREEZE_SCRIPT, {PROBE_LABEL: "freeze", **labels})
    if ended.code != 0:
        raise DockerError(f"cannot list the versions inside {image_id[:19]}: {ended.stderr.strip()[:200]}", "run the image by hand")
    return parse_freeze(ended.stdout)


def parse_freeze(text: str) -> tuple[list[str], dict[str, str]]:
    pip_part, _, dpkg_part = text.partition("--- dpkg")
    freeze = [line.strip() for line in pip_part.splitlines() if line.strip()]
    dpkg = {}
    for line in dpkg_part.splitlines():
        name, sep, version = line.strip().partition("=")
        if sep:
            dpkg[name] = version
    return freeze, dpkg
