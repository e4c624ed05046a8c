"""Why is the GPU idle (or slow)? Rules over a run's samples, each finding with its evidence and the fix.

Each rule looks at one GPU's series beside its host's CPU series and fires
when its pattern holds for a large share of the samples, never on a single
spike. Thresholds are module constants so the rules read as plain sentences.

Under MIG, NVML reports no utilisation: each MIG device is judged on its own,
with GPM's engine activity (GRAPHICS_UTIL, DCGM's GR_ENGINE_ACTIVE) standing
in for utilisation, and every finding says which metric it read (``source``).
The GPU holding the MIG devices is only judged on its clocks (throttling):
its memory and processes are its devices'.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from statistics import mean

from gpurig.errors import counted
from gpurig.monitor.samples import HEAT_OR_POWER, GpuSample, Sample
from gpurig.monitor.session import Run

MIN_SAMPLES = 3
IDLE_UTIL = 30.0  # % GPU utilisation under which the GPU is "mostly idle"
BUSY_CORE = 90.0  # % of one core: saturated
QUIET_CORE = 50.0  # % the busiest core stays under when the CPU is "idle" too
QUIET_CPU = 20.0  # % of all cores
BUSY_UTIL = 80.0
LOW_SM_ACTIVE = 0.5
MEM_FULL = 0.95
SHARE = 0.5  # the share of samples a pattern must hold for
THROTTLE_SHARE = 0.1
HELD_MIB = 1024  # memory a job holds on a GPU it is using


# What a rule read, as its evidence names it.
UTIL = "utilisation (NVML utilization.gpu)"
ENGINE = "engine activity (NVML GPM GRAPHICS_UTIL: MIG reports no utilisation)"
SM = "SM activity (NVML GPM SM_UTIL)"
OCCUPANCY = "SM occupancy (NVML GPM SM_OCCUPANCY)"


@dataclass(frozen=True)
class Finding:
    rule: str  # input_bound | small_kernels | oom_risk | throttling | waiting | contention
    host: str
    gpu: int | None
    title: str
    evidence: str
    fix: str
    mig: int | None = None  # a MIG device of GPU ``gpu``: its index there
    source: str = ""  # the metrics the rule read

    @property
    def where(self) -> str:
        gpu = "" if self.gpu is None else f" GPU {self.gpu}" + ("" if self.mig is None else f":{self.mig}")
        return self.host + gpu


def _share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def diagnose(run: Run) -> list[Finding]:
    """Every finding of every rule, host by host, GPU by GPU."""
    found: list[Finding] = []
    for host in run.hosts():
        series = run.series(host)
        if len(series) < MIN_SAMPLES:
            continue
        for key in sorted({g.key for s in series for g in s.gpus}):
            pairs = [(s, g) for s in series for g in s.gpus if g.key == key]
            holds_mig = any(g.mig_mode and g.mig is None for _, g in pairs)
            for rule in (throttling,) if holds_mig else RULES:
                finding = rule(host, key[0], pairs)
                if finding:
                    mig = pairs[0][1].mig
                    found.append(replace(finding, mig=mig) if mig is not None else finding)
    return found


Pairs = list[tuple[Sample, GpuSample]]


def _busy(g: GpuSample) -> float | None:
    """How busy the GPU was, in %: its utilisation, or for a MIG device (which has none) GPM's engine activity."""
    if g.util_gpu is not None:
        return g.util_gpu
    return None if g.gr_active is None else 100 * g.gr_active


def _busy_name(pairs: Pairs) -> str:
    return UTIL if any(g.util_gpu is not None for _, g in pairs) else ENGINE


def _label(pairs: Pairs) -> str:
    g = pairs[0][1]
    return g.label + (f" (MIG {g.profile})" if g.profile else "")


def input_bound(host: str, index: int, pairs: Pairs) -> Finding | None:
    known = [(s, busy) for s, g in pairs if (busy := _busy(g)) is not None]
    idle = [(s, util) for s, util in known if util < IDLE_UTIL]
    if len(known) < MIN_SAMPLES or len(idle) / len(known) < SHARE:
        return None
    saturated = [s for s, _ in idle if s.max_core >= BUSY_CORE]
    if len(saturated) / len(idle) < SHARE:
        return None
    what = _busy_name(pairs)
    return Finding(
        "input_bound", host, index, "input-pipeline bound: the GPU waits for data the CPU prepares",
        f"GPU {_label(pairs)} under {IDLE_UTIL:.0f}% {what} in {_pct(len(idle) / len(known))} of {counted(len(known), 'sample')} "
        f"(mean {mean(util for _, util in known):.0f}%), while one CPU core was at >= {BUSY_CORE:.0f}% in "
        f"{_pct(len(saturated) / len(idle))} of those (busiest core mean {mean(s.max_core for s, _ in idle):.0f}%, "
        f"all cores {mean(s.cpu_percent for s, _ in idle):.0f}%)",
        "load data in parallel: DataLoader(num_workers=<cores>, pin_memory=True, persistent_workers=True, prefetch_factor=4); "
        "move decoding/augmentation to the GPU; find the busy process with 'top -H'", source=what,
    )  # fmt: skip


def small_kernels(host: str, index: int, pairs: Pairs) -> Finding | None:
    rows = [g for _, g in pairs if (b := _busy(g)) is not None and b >= BUSY_UTIL and g.sm_active is not None]
    busy = [g.sm_active for g in rows if g.sm_active is not None]
    if len(busy) < MIN_SAMPLES or len(busy) / len(pairs) < SHARE:
        return None
    low = [active for active in busy if active < LOW_SM_ACTIVE]
    if len(low) / len(busy) < SHARE:
        return None
    occupancy = [g.sm_occupancy for g in rows if g.sm_occupancy is not None]
    occupied = f"; {OCCUPANCY} averaged {_pct(mean(occupancy))}" if occupancy else ""
    what = _busy_name(pairs)
    return Finding(
        "small_kernels", host, index, "kernels too small: the GPU is 'busy' but most SMs idle",
        f"GPU {_label(pairs)} {what} >= {BUSY_UTIL:.0f}% in {_pct(len(busy) / len(pairs))} of samples, yet {SM} "
        f"averaged {_pct(mean(busy))} (under {_pct(LOW_SM_ACTIVE)} in {_pct(len(low) / len(busy))} of them){occupied}",
        "give each kernel more work: raise the batch size, use AMP (torch.autocast), capture the step with CUDA graphs "
        "or torch.compile(mode='reduce-overhead')", source=", ".join([what, SM] + ([OCCUPANCY] if occupancy else [])),
    )  # fmt: skip


def oom_risk(host: str, index: int, pairs: Pairs) -> Finding | None:
    # (fraction, used, total) where both are known: GpuSample.mem_fraction's condition, kept with its operands
    full = [(used / total, used, total) for _, g in pairs if (used := g.mem_used_mib) is not None and (total := g.mem_total_mib)]
    if not full:
        return None
    peak, peak_used, peak_total = max(full, key=lambda x: x[0])
    if peak < MEM_FULL:
        return None
    return Finding(
        "oom_risk", host, index, "GPU memory nearly full: out-of-memory risk",
        f"GPU {_label(pairs)} memory peaked at {peak_used / 1024:.1f} of {peak_total / 1024:.1f} GiB ({_pct(peak)}); "
        f">= {_pct(MEM_FULL)} in {_pct(_share([f >= MEM_FULL for f, _, _ in full]))} of samples",
        "leave headroom: smaller batch, activation checkpointing, bf16/AMP, "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or a GPU with more memory", source="NVML memory used/total",
    )  # fmt: skip


def throttling(host: str, index: int, pairs: Pairs) -> Finding | None:
    known = [g for _, g in pairs if g.throttle is not None]
    hit = [g for g in known if HEAT_OR_POWER.intersection(g.throttle_reasons)]
    if not known or len(hit) / len(known) < THROTTLE_SHARE:
        return None
    reasons = sorted({r for g in hit for r in g.throttle_reasons if r in HEAT_OR_POWER})
    temps = [g.temp_c for g in known if g.temp_c is not None]
    powers = [(g.power_w, g.power_limit_w) for g in known if g.power_w is not None and g.power_limit_w]
    detail = f"; max {max(temps):.0f} C" if temps else ""
    if powers:
        draw, limit = max(powers)
        detail += f"; power up to {draw:.0f} of {limit:.0f} W"
    thermal = any("thermal" in r or r == "hw_slowdown" for r in reasons)
    fix = (
        "check cooling: fans, airflow, inlet temperature, dust (nvidia-smi -q -d TEMPERATURE,PERFORMANCE)"
        if thermal
        else "the GPU is power capped: check the limit (nvidia-smi -q -d POWER; nvidia-smi -pl) and PSU/BMC caps"
    )
    if thermal and any("power" in r for r in reasons):
        fix += "; it is also power capped: check nvidia-smi -q -d POWER"
    return Finding(
        "throttling", host, index, "clocks throttled by heat or power",
        f"GPU {index} throttled ({', '.join(reasons)}) in {_pct(len(hit) / len(known))} of samples{detail}", fix,
        source="NVML clock throttle reasons",
    )  # fmt: skip


def waiting(host: str, index: int, pairs: Pairs) -> Finding | None:
    known = [(s, g, busy) for s, g in pairs if (busy := _busy(g)) is not None]
    held = [(s, g, util) for s, g, util in known if g.processes or (g.mem_used_mib or 0) >= HELD_MIB]
    idle = [(s, g) for s, g, util in held if util < IDLE_UTIL]
    if len(known) < MIN_SAMPLES or len(idle) / len(known) < SHARE:
        return None
    quiet = [s for s, _ in idle if s.max_core < QUIET_CORE and s.cpu_percent < QUIET_CPU]
    if len(quiet) / len(idle) < SHARE:
        return None
    iowait = _iowait_share(quiet)
    io = f"; iowait {_pct(iowait)} of CPU time" if iowait is not None else ""
    what = _busy_name(pairs)
    return Finding(
        "waiting", host, index, "GPU and CPU both idle: the job waits on I/O or synchronisation",
        f"GPU {_label(pairs)} holds a job (memory {max(g.mem_used_mib or 0 for _, g in idle) / 1024:.1f} GiB) but is under "
        f"{IDLE_UTIL:.0f}% {what} in {_pct(len(idle) / len(known))} of samples while the CPU idles too "
        f"(all cores {mean(s.cpu_percent for s in quiet):.0f}%, busiest {mean(s.max_core for s in quiet):.0f}%){io}",
        "find what it waits for: storage or network reads (iostat -x 1; cache or prefetch the data set), a straggler rank "
        "in a collective (NCCL_DEBUG=INFO), or host syncs in the loop (.item(), .cpu(), torch.cuda.synchronize)", source=what,
    )  # fmt: skip


def _iowait_share(samples: list[Sample]) -> float | None:
    with_times = [s for s in samples if s.cpu_seconds.get("iowait")]
    if len(with_times) < 2:
        return None
    first, last = with_times[0], with_times[-1]
    spent = {m: sum(last.cpu_seconds.get(m, ())) - sum(first.cpu_seconds.get(m, ())) for m in last.cpu_seconds}
    total = sum(spent.values())
    return spent.get("iowait", 0.0) / total if total > 0 else None


def contention(host: str, index: int, pairs: Pairs) -> Finding | None:
    users: dict[str, tuple[int, int]] = {}  # user -> (pid, most MiB seen)
    for _, g in pairs:
        for p in g.processes:
            if p.user:
                pid, mib = users.get(p.user, (p.pid, 0))
                users[p.user] = (pid, max(mib, p.used_mib or 0))
    if len(users) < 2:
        return None
    shared = _share([len({p.user for p in g.processes if p.user}) >= 2 for _, g in pairs])
    shown = ", ".join(f"{u} (pid {pid}, {mib / 1024:.1f} GiB)" for u, (pid, mib) in sorted(users.items()))
    return Finding(
        "contention", host, index, "GPU shared with another user's process",
        f"GPU {_label(pairs)} ran processes of {counted(len(users), 'user')}: {shown}; shared at once in {_pct(shared)} of samples",
        "give each job its own GPU: a scheduler (Slurm, Kubernetes), CUDA_VISIBLE_DEVICES per user, or MIG partitions",
        source="NVML compute processes",
    )  # fmt: skip


RULES = (input_bound, small_kernels, oom_risk, throttling, waiting, contention)
