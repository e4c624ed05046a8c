"""One host's verification over its Connection: the host probe, the container toolkit, then the container probe.

The probes travel inside the command line (gpurig.connect.launcher, as the
monitor's agent does), so nothing is written on the host and no stdin is
needed: the host probe runs as ``python3 -c ...`` on the host, the container
probe through the host's engine (``open_engine``), as an exec in a deployed
container or as the command of a throwaway container of an image, removed
after. Between them, the host's GPUs and NVIDIA hook come from one small
shell probe, and Docker's runtimes and the target container or image from
the engine too.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpurig.connect.connection import CommandTimeout, Connection, Result
from gpurig.connect.engine import Engine, EngineError
from gpurig.connect.engineinfo import NVIDIA_RUNTIME, ContainerInfo, ImageInfo, has_nvidia_runtime
from gpurig.connect.engineopen import open_engine
from gpurig.connect.launcher import embedded
from gpurig.errors import GpurigError, last_line
from gpurig.facts import gather_complete
from gpurig.facts.parsers import NVIDIA_VERSION
from gpurig.facts.probes import Probe, facts_script, read, split_sections
from gpurig.skeleton import shipped_text
from gpurig.strict.validate import whole_number
from gpurig.verify.records import HostVerdict, Record, unchecked
from gpurig.verify.traps import trap_records, trap_records_without_gpu

HOST_PROBE = "checks/verify_host.py"  # as shipped (gpurig.skeleton.shipped finds them in a wheel as in a checkout)
TORCH_PROBE = "checks/verify_torch.py"
REINSTALL = "reinstall gpurig from a wheel or sdist built by its setup.py (pip install --force-reinstall gpurig)"
LEVELS = ("quick", "full")
# /dev/shm of a throwaway --image run: the size gpurig_containers recommends, so the image is judged, not Docker's default
IMAGE_SHM_BYTES = 16 << 30  # 16g, as `docker run --shm-size 16g` counts it
VERIFY_LABEL = "io.gpurig.verify"
_UUID = re.compile(r"^GPU \d+: .*\(UUID: (GPU-[0-9A-Za-z-]+)\)", re.MULTILINE)  # GPUs only: MIG lines would shift the indexes
# The host's side of docker_facts, declared like the host facts (gpurig/facts/probes.py) and sent as one script.
HOST_PROBES = (
    Probe("gpu_uuids", "nvidia-smi -L", lambda s: tuple(_UUID.findall(s.text))),
    Probe("nvidia_hook", "command -v nvidia-container-runtime-hook nvidia-container-runtime 2>/dev/null", lambda s: bool(s.text.strip())),
    NVIDIA_VERSION,
)
HOST_SCRIPT = facts_script(HOST_PROBES)


@dataclass(frozen=True)
class VerifyPlan:
    """What to verify on every selected host: the level, and a deployed container or an image (or neither)."""

    level: str = "quick"
    container: str | None = None
    image: str | None = None
    host_probe: str | None = None  # the probes' source text; None: that probe is not available
    torch_probe: str | None = None
    container_timeout_s: float | None = None  # None: 120 s quick, 600 s full
    host_probe_error: str = ""  # why host_probe is None, where known
    torch_probe_error: str = ""
    traps: bool = False  # also gather facts once for the GPU-host traps (gpurig.verify.traps)

    @classmethod
    def from_checks(cls, level: str = "quick", container: str | None = None, image: str | None = None) -> VerifyPlan:
        """The plan with the probes this gpurig ships; a probe it lacks or cannot read is None, with the reason kept."""
        host, host_error = read_probe(HOST_PROBE)
        torch, torch_error = read_probe(TORCH_PROBE)
        return cls(level, container, image, host, torch, host_probe_error=host_error, torch_probe_error=torch_error, traps=True)

    @property
    def target(self) -> str:
        return f"container {self.container}" if self.container else f"image {self.image}" if self.image else ""

    @property
    def timeout_s(self) -> float:
        if self.container_timeout_s is not None:
            return self.container_timeout_s
        return 600.0 if self.level == "full" else 120.0


def read_probe(path: str) -> tuple[str | None, str]:
    """(source text, "") of a probe gpurig ships, or (None, why it cannot be had): missing, unreadable or empty."""
    try:
        return shipped_text(path), ""
    except GpurigError as err:
        return None, err.problem


def verify_host(conn: Connection, plan: VerifyPlan, expect_gpus: int | None = None, expect_model: str | None = None,
                expect_mig: bool | None = None) -> HostVerdict:
    """Every record for one host; a probe that cannot run is a record saying why, never an exception.

    Fails closed: a level that checked nothing (a probe missing, silent, or
    skipping every record) gets a ``fail`` record saying so (records.unchecked).
    """
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    records, on_pci = host_records(conn, plan, expect_gpus, expect_model)
    if plan.traps and not any(r.id == "host.probe" for r in records):  # a host probe that could not run already failed the host
        # the traps are a GPU host's: where the probe counted no NVIDIA GPU on the PCI bus, no second round trip asks for them
        records += trap_records_without_gpu() if on_pci == 0 else host_trap_records(conn, expect_mig)
    seconds["host"] = time.monotonic() - t0
    if plan.container or plan.image:
        t0 = time.monotonic()
        facts = docker_facts(conn, plan)
        toolkit = toolkit_records(facts, plan)
        seconds["toolkit"] = time.monotonic() - t0
        t0 = time.monotonic()
        container = container_records(conn, plan, facts, toolkit)
        seconds["container"] = time.monotonic() - t0
        host_uuids = list(facts.host_uuids)
        assigned = assigned_gpus(host_uuids, facts.container) if plan.container else None
        records += toolkit + [uuid_record(host_uuids, container, assigned)] + container
    records += unchecked(records, plan.target)
    return HostVerdict(conn.name, tuple(records), plan.level, plan.target, {k: round(v, 3) for k, v in seconds.items()})


def host_trap_records(conn: Connection, expect_mig: bool | None) -> list[Record]:
    """The traps' records from one facts round trip; facts that did not all arrive are one ``fail`` saying so."""
    try:
        facts = gather_complete(conn)
    except GpurigError as err:
        return [Record("host", "host.traps", "fail", detail=f"the GPU-host traps could not be checked: {err.problem}", fix=err.fix)]
    return trap_records(facts, expect_mig)


def parse_document(result: Result, probe: str) -> list[Record] | None:
    """The records of a probe's JSON document on stdout (the whole output, else its last JSON line), or None."""
    doc = probe_document(result)
    raw = doc.get("records") if doc is not None else None
    if not isinstance(raw, list):
        return None
    return [Record.from_probe(probe, r) for r in raw if isinstance(r, dict)]


def probe_document(result: Result) -> dict | None:
    """A probe's JSON document on stdout (the whole output, else its last JSON line), or None."""
    doc = None
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        for line in reversed(result.stdout.splitlines()):
            if line.startswith("{"):
                try:
                    doc = json.loads(line)
                except ValueError:
                    pass
                break
    return doc if isinstance(doc, dict) else None


def host_records(conn: Connection, plan: VerifyPlan, expect_gpus: int | None,
                 expect_model: str | None) -> tuple[list[Record], int | None]:
    """(the host probe's records, the NVIDIA GPUs it counted on the PCI bus: None where not known)."""
    if plan.host_probe is None:
        why = plan.host_probe_error or f"{HOST_PROBE} is not in this gpurig"
        return [Record("host", "host.probe", "fail", detail=f"the host could not be checked: {why}", fix=REINSTALL)], None
    args = ["--json"]
    if expect_gpus is not None:
        args += ["--expect-gpus", str(expect_gpus)]
    if expect_model:
        args += ["--expect-model", expect_model]
    try:
        result = conn.admin(embedded(plan.host_probe, "verify_host.py", args), warn=True, timeout=120)
    except CommandTimeout:
        return [Record("host", "host.probe", "fail", detail="the host probe did not finish within 120 s (a hung nvidia-smi or NVML?)",
                       fix="run nvidia-smi on the host; a GPU that hangs it needs a reset or a reboot")], None
    records = parse_document(result, "host")
    if records:
        on_pci = (probe_document(result) or {}).get("nvidia_gpus_on_pci")
        return records, on_pci if isinstance(on_pci, int) and not isinstance(on_pci, bool) and on_pci >= 0 else None
    if result.exited == 127:
        return [Record("host", "host.probe", "fail", detail="no python3 on the host to run the host probe",
                       fix="install python3 on the host (apt-get install python3)")], None
    return [silent_probe(result, "host", "run checks/verify_host.py --text on the host to see why", records)], None


def silent_probe(result: Result, probe: str, fix: str, records: list[Record] | None) -> Record:
    """The fail record of a probe that printed nothing, something that is not its document, or a document without records."""
    said = last_line(result.stderr, result.stdout)
    if records is not None:
        what = "a document with no records"
    elif said:
        what = f"no records: {said}"
    else:
        what = "nothing"
    return Record(probe, f"{probe}.probe", "fail", detail=f"the {probe} probe printed {what} (exit {result.exited}): nothing was checked", fix=fix)


@dataclass(frozen=True)
class DockerFacts:
    """What the toolkit records and the container probe need to know of the host's GPUs and Docker."""

    host_uuids: tuple[str, ...] = ()  # nvidia-smi -L, GPUs only
    hook: bool = False  # NVIDIA's runtime hook is installed (docker run --gpus works through it)
    driver: str | None = None  # the loaded kernel module's version
    runtimes: tuple[str, ...] = ()  # the engine's
    docker_error: str | None = None  # why the engine could not be used; None when it answered
    container: ContainerInfo | None = None  # the deployed container verified, when found
    image: ImageInfo | None = None  # the image verified, when found
    inspect_error: str = ""  # why neither was found

    @property
    def found(self) -> bool:
        return self.container is not None or self.image is not None

    @property
    def labels(self) -> dict:
        target = self.container or self.image
        return dict(target.labels) if target is not None else {}

    @property
    def gpu_flag(self) -> bool:
        """Whether a throwaway run can and should ask for GPUs: the host has some and Docker can hand them over."""
        return bool(self.host_uuids) and (has_nvidia_runtime(self.runtimes) or self.hook)


def docker_facts(conn: Connection, plan: VerifyPlan) -> DockerFacts:
    """The host's GPUs, NVIDIA hook and driver (one shell round trip), then Docker's runtimes and the target from its engine."""
    host = parse_host_gpus(conn.admin(["sh", "-c", HOST_SCRIPT], warn=True, timeout=60).stdout)
    try:
        engine = open_engine(conn, timeout=60)
    except EngineError as err:
        return DockerFacts(*host, docker_error=err.problem)
    with engine:
        try:
            runtimes = engine.info().runtimes
        except EngineError as err:
            return DockerFacts(*host, docker_error=err.problem)
        try:
            if plan.container:
                container = engine.container(plan.container)
                return DockerFacts(*host, runtimes, container=container, inspect_error="" if container else f"No such container: {plan.container}")
            image = engine.image(plan.image or "")
            return DockerFacts(*host, runtimes, image=image, inspect_error="" if image else f"No such image: {plan.image}")
        except EngineError as err:
            return DockerFacts(*host, runtimes, inspect_error=err.reason)


def parse_host_gpus(output: str) -> tuple[tuple[str, ...], bool, str | None]:
    """Pure: (GPU UUIDs, the hook installed, the driver version) from HOST_SCRIPT's sections; a missing one reads as absent."""
    values = read(HOST_PROBES, split_sections(output))
    return values["gpu_uuids"], values["nvidia_hook"], values["nvidia_version"][0]


def toolkit_records(facts: DockerFacts, plan: VerifyPlan) -> list[Record]:
    """Docker usable, the nvidia runtime present and (for a deployed container) actually used."""
    if facts.docker_error is not None:
        return [Record("toolkit", "toolkit.docker", "fail", detail=f"Docker is not usable on the host: {facts.docker_error}",
                       fix="gpurig provision -l HOST (installs and starts Docker; the login user needs become or the docker group)")]
    if not facts.host_uuids:
        return [Record("toolkit", "toolkit.runtime", "skip", detail="no NVIDIA GPU visible on the host (nvidia-smi -L): no runtime to check")]
    if not facts.gpu_flag:
        return [Record("toolkit", "toolkit.runtime", "fail", ", ".join(facts.runtimes) or "-", "nvidia",
                       detail="the nvidia runtime is missing: Docker cannot give containers the host's GPUs "
                              "(could not select device driver \"\" with capabilities: [[gpu]])",
                       fix="gpurig provision -l HOST (installs the NVIDIA Container Toolkit and configures Docker)")]
    if plan.image:
        return [Record("toolkit", "toolkit.runtime", "pass", "nvidia", "nvidia", detail="throwaway run started with --gpus all")]
    container = facts.container
    if container is None:
        return [Record("toolkit", "toolkit.runtime", "skip", detail=f"container {plan.container} not found")]
    runtime = container.runtime
    if runtime == NVIDIA_RUNTIME or container.device_ids is not None:
        how = "the nvidia runtime" if runtime == NVIDIA_RUNTIME else "a GPU device request (--gpus)"
        return [Record("toolkit", "toolkit.runtime", "pass", runtime, "nvidia", detail=f"container {plan.container} started through {how}")]
    return [Record("toolkit", "toolkit.runtime", "fail", runtime, "nvidia",
                   detail=f"container {plan.container} was started without GPUs (runtime {runtime}, no --gpus)",
                   fix="add gpus: to its gpurig_containers entry (or docker run --gpus) and redeploy")]


def probe_argv(plan: VerifyPlan, facts: DockerFacts) -> list[str]:
    """``python3 -c PROBE --json ...``: the torch probe's command, with the CUDA the target's label names."""
    labels = facts.labels
    args = ["--json", "--level", plan.level]
    if labels.get("io.gpurig.cuda"):
        args += ["--expect-cuda", labels["io.gpurig.cuda"]]
    return embedded(plan.torch_probe or "", "verify_torch.py", args)


def run_body(plan: VerifyPlan, facts: DockerFacts) -> dict:
    """The image's throwaway container (never pulled): the probe as its command, labelled, 16g /dev/shm, GPUs where the host has them."""
    python, *args = probe_argv(plan, facts)
    host_config: dict = {"ShmSize": IMAGE_SHM_BYTES}
    if facts.gpu_flag:
        host_config["DeviceRequests"] = [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}]
    return {"Image": plan.image or "", "Entrypoint": [python], "Cmd": args, "Labels": {VERIFY_LABEL: "1"}, "HostConfig": host_config}


def run_probe(engine: Engine, plan: VerifyPlan, facts: DockerFacts) -> Result | None:
    """The container probe's exit code and output through the host's engine; None when it overran the plan's timeout.

    A refused request (the container gone, GPUs the engine cannot give) is a result too: the engine's words as stderr.
    """
    name = plan.container or f"gpurig-verify-{secrets.token_hex(4)}"
    try:
        if plan.container:
            ended = engine.exec(plan.container, probe_argv(plan, facts), plan.timeout_s)
        else:
            ended = engine.run(run_body(plan, facts), name, plan.timeout_s)
    except EngineError as err:
        return Result(engine.name, f"verify {plan.target}", 1 if plan.container else 125, "", err.reason + "\n")
    if ended is None:
        return None
    return Result(engine.name, f"verify {plan.target}", ended.code, ended.stdout, ended.stderr)


def container_records(conn: Connection, plan: VerifyPlan, facts: DockerFacts, toolkit: list[Record],
                      engine_of: Callable[[Connection, float], Engine] = open_engine) -> list[Record]:
    """The container probe's records; ``engine_of`` opens the host's engine (a recorded one in tests)."""
    if plan.torch_probe is None:
        why = plan.torch_probe_error or f"{TORCH_PROBE} is not in this gpurig"
        return [Record("container", "container.probe", "fail", detail=f"{plan.target} could not be checked: {why}", fix=REINSTALL)]
    if any(r.id == "toolkit.docker" for r in toolkit):
        return [Record("container", "container.probe", "skip", detail="skipped: needs toolkit.docker")]
    if not facts.found:
        return [not_found(plan, facts.inspect_error)]
    container = facts.container
    if plan.container and container is not None and not container.running:
        return [Record("container", "container.probe", "fail", container.status, "running",
                       detail=f"container {plan.container} is not running ({container.status}, exit code {container.exit_code})",
                       fix=f"look at docker logs {plan.container}, then gpurig deploy again")]
    try:
        with engine_of(conn, 60) as engine:
            result = run_probe(engine, plan, facts)
    except EngineError as err:
        result = Result(conn.name, f"verify {plan.target}", 125, "", err.problem + "\n")
    if result is None:
        return [Record("container", "container.probe", "fail", detail=f"the container probe did not finish within {plan.timeout_s:g} s",
                       fix="run it by hand with --text to see which record hangs: docker exec -i NAME python3 - --text < checks/verify_torch.py")]
    records = parse_document(result, "container")
    if records:
        return records
    if records is not None:  # a document, but no records in it
        return [silent_probe(result, "container", "run it by hand: docker exec -i NAME python3 - --text < checks/verify_torch.py", records)]
    return [probe_failed(result, plan, facts)]


def not_found(plan: VerifyPlan, error: str) -> Record:
    if plan.container:
        return Record("container", "container.probe", "fail", detail=f"no container {plan.container} on this host: {error}",
                      fix="check the name (docker ps / gpurig status), or deploy it: gpurig deploy")
    return Record("container", "container.probe", "fail", detail=f"image {plan.image} is not on this host: {error}",
                  fix="deploy it first (gpurig deploy), or give the tag of an image the host has")


def probe_failed(result: Result, plan: VerifyPlan, facts: DockerFacts | None = None) -> Record:
    """Why the container probe gave no records, from Docker's or the shell's own words."""
    text = last_line(result.stderr, result.stdout) or f"exit {result.exited}"
    facts = facts or DockerFacts()
    labels = facts.labels
    low = text.lower()
    if "could not select device driver" in low:
        return Record("container", "container.probe", "fail", detail=f"Docker could not start the container with GPUs: {text}",
                      fix="gpurig provision -l HOST (installs the NVIDIA Container Toolkit)")
    if "python3" in low and ("not found" in low or "no such file" in low):
        return Record("container", "container.probe", "fail", detail=f"no python3 in {plan.target}: {text}",
                      fix="verify an image built by gpurig (its python3 is /opt/venv/bin/python3)")
    if "requirement error" in low or "unsatisfied condition" in low:
        driver, needed, cuda = facts.driver or "?", labels.get("io.gpurig.min-driver") or "?", labels.get("io.gpurig.cuda") or "?"
        return Record("container", "container.probe", "fail", driver, f">= {needed}",
                      detail=f"host driver {driver} too old for the image's CUDA {cuda} (needs >= {needed}): the container toolkit refused it: {text}",
                      fix=f"upgrade the host driver to >= {needed} (gpurig provision), or use an image built for an older CUDA")
    if "nvidia-container-cli" in low:
        return Record("container", "container.probe", "fail", detail=f"the container toolkit could not start the container: {text}",
                      fix="run nvidia-smi on the host; gpurig verify without --image/--container shows the driver's state")
    return silent_probe(result, "container", "run it by hand: docker exec -i NAME python3 - --text < checks/verify_torch.py", None)


def assigned_gpus(host_uuids: list[str], container: ContainerInfo | None) -> list[str] | None:
    """The UUIDs a container was given (--gpus / NVIDIA_VISIBLE_DEVICES), in the host's terms; None: all of them or unknown."""
    if container is None or container.device_ids == ("all",):
        return None
    wanted = list(container.device_ids or ())
    if not wanted:
        visible = container.env.get("NVIDIA_VISIBLE_DEVICES", "")
        if visible in ("", "all", "void", "none"):
            return None
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
    out = []
    for ident in wanted:
        index = whole_number(ident)
        if index is not None:
            if index >= len(host_uuids):
                return None  # an index the host does not have: the toolkit would have refused; nothing to compare
            out.append(host_uuids[index])
        else:
            out.append(ident)
    return out


def uuid_record(host_uuids: list[str], container: list[Record], assigned: list[str] | None = None) -> Record:
    """The toolkit handed the container the host's own GPUs (the ones it was assigned, where it was assigned some)."""
    seen = next((r.measured for r in container if r.id == "cuda.devices" and r.status != "skip"), None)
    if not host_uuids:
        return Record("toolkit", "toolkit.uuids", "skip", detail="no NVIDIA GPU visible on the host (nvidia-smi -L)")
    if not isinstance(seen, list) or not seen:
        return Record("toolkit", "toolkit.uuids", "skip", detail="skipped: needs cuda.devices (the container saw no GPU)")
    foreign = [u for u in seen if u not in host_uuids]
    if foreign:
        return Record("toolkit", "toolkit.uuids", "fail", seen, host_uuids,
                      detail=f"the container sees GPUs the host does not list: {', '.join(map(str, foreign))}",
                      fix="check NVIDIA_VISIBLE_DEVICES and the toolkit's config (nvidia-ctk), then redeploy")
    if assigned is not None and sorted(seen) != sorted(assigned):
        return Record("toolkit", "toolkit.uuids", "fail", seen, assigned,
                      detail="the container sees other GPUs than it was assigned: another user's GPUs, or fewer than asked",
                      fix="check the container's gpus: in gpurig_containers and NVIDIA_VISIBLE_DEVICES in its image/env, then redeploy")
    mine = f"its {len(assigned)} assigned" if assigned is not None else f"{len(seen)} of the host's {len(host_uuids)}"
    return Record("toolkit", "toolkit.uuids", "pass", len(seen), len(assigned) if assigned is not None else len(host_uuids), "GPUs",
                  detail=f"the container sees {mine} {'GPU' if len(seen) == 1 else 'GPUs'}, with the host's UUIDs")
