"""What a finished job's GPUs did: utilisation and SM activity over its run, from the monitor's sampler, and the monitor's diagnosis.

The host's agent ran gpu_sampler.py beside the job and kept its records in
the job's folder; here they become a monitor ``Run`` (the same parsing as
`gpurig monitor`), cut to the job's own GPUs and to the time it ran, and the
monitor's rules say why the GPU sat idle when it did. A job that ran on no
GPU, or whose host had no driver for the sampler, says so instead of 0%.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean

from gpurig.jobs.views import JobView
from gpurig.monitor.diagnose import Finding, diagnose
from gpurig.monitor.samples import Sample
from gpurig.monitor.session import Run


@dataclass(frozen=True)
class GpuUse:
    samples: int
    util_mean: float | None  # % (NVML utilization.gpu), over the job's GPUs and run
    sm_active_mean: float | None  # 0..1 (NVML GPM SM_UTIL), where the GPU has GPM
    findings: tuple[Finding, ...] = ()
    note: str = ""  # why there are no figures

    def line(self) -> str:
        if self.note:
            return self.note
        parts = [f"GPU utilisation {self.util_mean:.0f}%" if self.util_mean is not None else "GPU utilisation not reported"]
        parts.append(f"SM activity {100 * self.sm_active_mean:.0f}%" if self.sm_active_mean is not None
                     else "SM activity not measured (no GPM before Hopper)")
        return f"{', '.join(parts)} over {self.samples} samples"

    def to_dict(self) -> dict:
        return {"samples": self.samples, "util_mean": self.util_mean, "sm_active_mean": self.sm_active_mean, "note": self.note,
                "findings": [{"rule": f.rule, "gpu": f.gpu, "title": f.title, "evidence": f.evidence, "fix": f.fix} for f in self.findings]}


def gpu_use(job: JobView, records: list[dict]) -> GpuUse:
    """The job's GPU use from the sampler's ``records`` (as the agent's ``samples`` verb returns them)."""
    devices = {int(d) for d in job.gpus if d.isdecimal()}
    if not devices and job.mode != "exec":
        return GpuUse(0, None, None, note="no GPU was given to the job, so none was sampled")
    windows = [(a.get("started_at") or 0, a.get("ended_at") or float("inf")) for a in job.attempts] or [(job.started_at or 0, float("inf"))]
    run = Run()
    for record in records:
        if record.get("type") == "sample" and not any(lo - 1 <= float(record.get("t") or 0) <= hi + 1 for lo, hi in windows):
            continue
        run.add(job.host, record)
    notes = run.state(job.host).notes
    series = [_only(s, devices) for s in run.series(job.host)]
    gpus = [g for s in series for g in s.gpus]
    if not gpus:
        why = f" ({notes[0]})" if notes else ""
        return GpuUse(len(series), None, None, note=f"no GPU samples were taken{why}")
    utils = [g.util_gpu for g in gpus if g.util_gpu is not None]
    sms = [g.sm_active for g in gpus if g.sm_active is not None]
    findings = tuple(f for f in diagnose(_run_of(job.host, series)) if f.gpu is None or not devices or f.gpu in devices)
    return GpuUse(len(series), mean(utils) if utils else None, mean(sms) if sms else None, findings)


def _only(sample: Sample, devices: set[int]) -> Sample:
    from dataclasses import replace

    if not devices:
        return sample
    return replace(sample, gpus=tuple(g for g in sample.gpus if g.index in devices))


def _run_of(host: str, series: list[Sample]) -> Run:
    """A Run holding ``series`` as it is (the monitor's rules read runs)."""
    run = Run()
    state = run.state(host)
    state.samples.extend(series)
    return run
