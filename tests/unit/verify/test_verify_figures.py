"""checks/verify_torch.py's speed arithmetic: TFLOP/s and GB/s from a fixed timer and known operation counts.

The torch handed to the measurements here computes nothing and times every
operation at a fixed number of milliseconds, the way CUDA events report
them. The expected figures are worked out by hand in each test from the
operation's size (FLOPs of an n^3 matmul, bytes moved), never from the
probe's own formulas or its GPU_PEAKS table, so that a timer read in the
wrong unit, a wrong operation count or bytes/s reported as GB/s each fail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import types
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "checks" / "verify_torch.py"
# NVIDIA's H200 SXM datasheet, dense (half the "with sparsity" figures): BF16 989 TFLOP/s, TF32 494.5 TFLOP/s, HBM3e 4.8 TB/s.
H200_BF16, H200_TF32, H200_MEMBW = 989.0, 494.5, 4800.0


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("verify_torch_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Tensor:
    """Stands in for a device tensor: every operation is accepted and counted, none computed."""

    def __init__(self, owner: FixedClockTorch, value: float = 0.0) -> None:
        self.owner, self.value = owner, value

    def fill_(self, value):
        self.value = value
        return self

    def pin_memory(self):
        return self

    def copy_(self, other, non_blocking=False):
        self.owner.ops.append("copy")
        self.value = other.value
        return self

    def __eq__(self, other):  # the all-reduce's correctness check: (t == want).all()
        return types.SimpleNamespace(all=lambda: self.value == other)

    __hash__ = object.__hash__


class FixedClockTorch:
    """torch as the measurements use it, with CUDA events that say every operation took ``ms`` milliseconds."""

    bfloat16, float32, uint8 = "bfloat16", "float32", "uint8"

    def __init__(self, ms: float) -> None:
        self.ops: list[str] = []
        self.ms = ms
        owner = self

        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                pass

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return owner.took_ms()  # CUDA events report milliseconds

        def all_reduce(tensors):
            total = sum(t.value for t in tensors)
            for t in tensors:
                t.value = total

        self.cuda = types.SimpleNamespace(Event=Event, synchronize=lambda device=None: None, device=lambda d: contextlib.nullcontext(),
                                          nccl=types.SimpleNamespace(all_reduce=all_reduce))
        self.backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=False)))

    def randn(self, *shape, device=None, dtype=None):
        return Tensor(self)

    def empty(self, *shape, device=None, dtype=None):
        return Tensor(self)

    def empty_like(self, other):
        return Tensor(self)

    def full(self, shape, value, device=None):
        return Tensor(self, value)

    def matmul(self, a, b, out=None):
        self.ops.append("matmul")
        return out

    def took_ms(self) -> float:
        """What the pair of events around the last operation measured."""
        return self.ms


def test_matmul_tflops_from_a_fixed_timer(probe):
    # 8192^3 multiply-adds are 2 * 8192^3 = 1,099,511,627,776 FLOPs; at 2 ms each: 549.76 TFLOP/s
    fake = FixedClockTorch(ms=2.0)
    got = probe.measure_matmul(fake, "cuda:0", fake.bfloat16, n=8192, reps=10)
    assert got == pytest.approx(549.755813888, rel=1e-9)
    assert fake.ops.count("matmul") == 10 + 2  # ten timed runs after two warm-up runs
    # a 4096 matmul is 8x fewer FLOPs: at the same 2 ms, 8x slower
    assert probe.measure_matmul(FixedClockTorch(ms=2.0), "cuda:0", fake.bfloat16, n=4096, reps=3) == pytest.approx(68.719476736, rel=1e-9)


def test_memory_bandwidth_counts_bytes_read_and_written_in_gb_per_s(probe):
    # a 1 GiB copy reads 1 GiB and writes 1 GiB: 2 * 1,073,741,824 bytes in 0.5 ms = 4,294.97 GB/s (10^9 bytes)
    assert probe.measure_membw(FixedClockTorch(ms=0.5), "cuda:0", nbytes=1 << 30, reps=10) == pytest.approx(4294.967296, rel=1e-9)


def test_pcie_bandwidth_is_bytes_moved_once_in_gb_per_s(probe):
    # 256 MiB = 268,435,456 bytes each way in 10 ms: 26.84 GB/s
    h2d, d2h = probe.measure_pcie(FixedClockTorch(ms=10.0), "cuda:0", nbytes=256 << 20, reps=5)
    assert h2d == pytest.approx(26.8435456, rel=1e-9) and d2h == pytest.approx(26.8435456, rel=1e-9)


def test_allreduce_bus_bandwidth_from_a_fixed_clock(probe, monkeypatch):
    # NCCL's bus bandwidth for all-reduce: bytes * 2(n-1)/n / time; 16 Mi float32 (67,108,864 bytes) across 2 GPUs,
    # 5 repetitions in 50 ms (10 ms each): 67,108,864 * 2 * 1/2 / 0.010 s = 6.71 GB/s
    ticks = iter([100.0, 100.05])
    monkeypatch.setattr(probe, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    correct, busbw = probe.measure_allreduce(FixedClockTorch(ms=0.0), ["cuda:0", "cuda:1"], numel=16 << 20, reps=5)
    assert correct is True and busbw == pytest.approx(6.7108864, rel=1e-9)


def test_full_records_carry_the_figures_and_their_fraction_of_the_datasheet_peak(probe, monkeypatch):
    """The whole full level on a one-GPU H200 whose every operation takes 2 ms, the numbers checked against the datasheet by hand."""
    monkeypatch.setattr(probe, "measure_training", lambda torch, device: (1234.5, 0.97, None, "no NVML binding"))
    records = {r["id"]: r for r in probe.full_records(FixedClockTorch(ms=2.0), ["cuda:0"], ["NVIDIA H200"])}
    bf16, tf32, membw = records["matmul.bf16"], records["matmul.tf32"], records["membw"]
    # 549.76 TFLOP/s of 989 is 55.6%: a fail at the 70% bar
    assert (bf16["measured"], bf16["unit"], bf16["expected"], bf16["status"]) == (549.8, "TFLOP/s", H200_BF16, "fail")
    assert bf16["detail"].startswith("56% of the 989 TFLOP/s peak")
    # the same 2 ms against TF32's 494.5: 111%, a pass
    assert (tf32["measured"], tf32["expected"], tf32["status"]) == (549.8, H200_TF32, "pass") and tf32["detail"].startswith("111% of")
    # 2 GiB moved in 2 ms: 1,073.7 GB/s of 4,800 is 22%
    assert (membw["measured"], membw["unit"], membw["expected"], membw["status"]) == (1073.7, "GB/s", H200_MEMBW, "fail")
    assert membw["detail"].startswith("22% of the 4800 GB/s peak")
    # 256 MiB in 2 ms: 134.2 GB/s each way
    assert records["pcie.h2d"]["measured"] == 134.2 and records["pcie.d2h"]["measured"] == 134.2
    assert records["training"]["measured"] == 1234.5



class PlacedTensor(Tensor):
    """A tensor that knows where it lives (None: pinned host memory), so that a copy knows its direction."""

    def __init__(self, owner, device):
        super().__init__(owner)
        self.device = device

    def copy_(self, other, non_blocking=False):
        to_gpu, from_gpu = self.device is not None, getattr(other, "device", "gpu") is not None
        self.owner.ops.append({(True, False): "h2d", (False, True): "d2h"}.get((to_gpu, from_gpu), "copy"))
        self.value = other.value
        return self


class OneWaySlowTorch(FixedClockTorch):
    """A host whose PCIe link is slower one way: 256 MiB host to device takes ``h2d_ms``, device to host ``d2h_ms``; anything else 2 ms."""

    def __init__(self, h2d_ms: float, d2h_ms: float) -> None:
        super().__init__(ms=2.0)
        self.took = {"h2d": h2d_ms, "d2h": d2h_ms}

    def took_ms(self) -> float:
        return self.took.get(self.ops[-1] if self.ops else "", self.ms)  # the operation this pair of events bracketed

    def empty(self, *shape, device=None, dtype=None):
        return PlacedTensor(self, device)


def test_pcie_host_to_device_and_device_to_host_are_each_timed_in_their_own_direction(probe, monkeypatch):
    # a link that takes 10 ms to carry 256 MiB to the GPU and 40 ms to bring it back:
    # 268,435,456 bytes / 0.010 s = 26.84 GB/s host to device, / 0.040 s = 6.71 GB/s device to host
    h2d, d2h = probe.measure_pcie(OneWaySlowTorch(h2d_ms=10.0, d2h_ms=40.0), "cuda:0", nbytes=256 << 20, reps=5)
    assert (h2d, d2h) == (pytest.approx(26.8435456, rel=1e-9), pytest.approx(6.7108864, rel=1e-9))
    # what verify reports: the slow direction is the one named slow
    monkeypatch.setattr(probe, "measure_training", lambda torch, device: (1.0, 0.97, None, "no NVML binding"))
    records = {r["id"]: r for r in probe.full_records(OneWaySlowTorch(h2d_ms=10.0, d2h_ms=40.0), ["cuda:0"], ["NVIDIA H200"])}
    assert (records["pcie.h2d"]["measured"], records["pcie.h2d"]["detail"]) == (26.8, "256 MiB pinned host to device")
    assert (records["pcie.d2h"]["measured"], records["pcie.d2h"]["detail"]) == (6.7, "256 MiB pinned device to host")
