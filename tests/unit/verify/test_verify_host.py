"""checks/verify_host.py run as hosts run it (a subprocess), replaying recorded nvidia-smi, NVML and kernel-log outputs.

The nvidia-smi inputs are real `nvidia-smi -q -x` captures (tests/fixtures/verify/README.md
names their sources) and minimal edits of them for the faults; the NVML path runs against
fake_nvml/pynvml.py, which replays the same captures' values as NVML returns them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cputime import ChildCPU

ROOT = Path(__file__).resolve().parents[3]
PROBE = ROOT / "checks" / "verify_host.py"
FIX = ROOT / "tests" / "fixtures" / "verify"
FAKE_NVML = Path(__file__).resolve().parent / "fake_nvml"
KEYS = {"id", "status", "measured", "expected", "unit", "detail", "fix"}
GPU_CHECKS = ("persistence", "ecc_uncorrected", "retired_pages", "remapped_rows", "throttle", "pcie", "temperature",
              "processes")


def run_probe(*args, nvml: str | None = None, fmt: str = "--json") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FAKE_NVML")}
    if nvml:
        env.update(PYTHONPATH=str(FAKE_NVML), FAKE_NVML=str(FIX / nvml))
    proc = subprocess.run([sys.executable, str(PROBE), fmt, *map(str, args)], capture_output=True, text=True,
                          timeout=30, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def records(*args, nvml: str | None = None) -> list[dict]:
    proc = run_probe(*args, nvml=nvml)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["probe"] == "host" and doc["version"] == 1
    for r in doc["records"]:
        assert set(r) == KEYS and r["status"] in ("pass", "warn", "fail", "skip"), r
        assert isinstance(r["detail"], str) and (r["fix"] is None or r["fix"])
    return doc["records"]


def by_id(recs: list[dict]) -> dict[str, dict]:
    return {r["id"]: r for r in recs}


@pytest.fixture
def host(tmp_path):
    """Replay options for one capture: its nvidia-smi XML, a matching /proc/driver/nvidia/version, a clean dmesg."""

    def options(xml: str, dmesg: str = "dmesg-clean.txt", driver: str = "535.54.03") -> list:
        proc = tmp_path / "version"
        proc.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Tue Mar  5 22:42:15 UTC 2024\n"
                        "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04) \n")
        return ["--smi-xml", FIX / xml, "--proc-version", proc, "--dmesg", FIX / dmesg]

    return options


def test_help_names_the_options_and_record_ids():
    proc = run_probe(fmt="--help")
    assert proc.returncode == 0
    for word in ("--expect-gpus", "--expect-model", "--source", "--smi-xml", "--proc-version", "--dmesg", "--text",
                 "host.driver", "host.xid", "ecc_uncorrected"):
        assert word in proc.stdout


def pci_bus(bus: Path, *devices: tuple[str, str]) -> Path:
    """A replayed /sys/bus/pci/devices at ``bus``: one folder per (vendor, class), as sysfs writes them."""
    bus.mkdir()
    for i, (vendor, klass) in enumerate(devices):
        dev = bus / f"0000:{i:02x}:00.0"
        dev.mkdir()
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "class").write_text(klass + "\n")
    return bus


def nvidia_on_this_pci_bus() -> bool:
    devices = Path("/sys/bus/pci/devices")
    return any((d / "vendor").read_text().strip() == "0x10de" for d in devices.iterdir()) if devices.is_dir() else False


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists() or nvidia_on_this_pci_bus(),
                    reason="this machine has an NVIDIA GPU or driver")
def test_cpu_only_host_gets_a_verdict_for_real():
    """This machine has no GPU, no driver and no nvidia-smi (nvidia-ml-py is installed but finds no libnvidia-ml).

    Seen: the fix said to install a driver with provision, whose driver step skips a host without a GPU.
    """
    recs = records("--expect-gpus", "8", "--expect-model", "H100")
    assert [r["id"] for r in recs] == ["host.driver", "host.gpu_count", "host.gpu_model", "host.xid"]
    driver = recs[0]
    assert driver["status"] == "fail" and driver["detail"].startswith("no NVIDIA GPU on this host: none on its PCI bus")
    assert "provision skips the driver on a host without an NVIDIA GPU" in driver["fix"]
    assert "gpurig_driver.install" not in driver["fix"]
    for r in recs[1:]:
        assert r["status"] == "skip" and r["detail"] == "skipped: driver not loaded"
    assert by_id(recs)["host.gpu_count"]["expected"] == 8


def test_a_gpu_without_its_driver_is_told_to_install_one_and_no_gpu_is_not(tmp_path):
    bus = pci_bus(tmp_path / "gpu", ("0x8086", "0x060000"), ("0x10de", "0x030200"), ("0x10de", "0x068000"))  # a GPU, an NVSwitch
    [driver] = [r for r in records("--smi-xml", FIX / "nvidia-smi-no-driver.txt", "--proc-version", tmp_path / "absent",
                                   "--pci-devices", bus) if r["id"] == "host.driver"]
    assert driver["detail"].startswith("no NVIDIA driver loaded") and "gpurig_driver.install: true" in driver["fix"]
    switch_only = pci_bus(tmp_path / "switch", ("0x10de", "0x068000"))  # a bridge, not a GPU: provision skips its driver
    [driver] = [r for r in records("--smi-xml", FIX / "nvidia-smi-no-driver.txt", "--proc-version", tmp_path / "absent",
                                   "--pci-devices", switch_only) if r["id"] == "host.driver"]
    assert driver["detail"].startswith("no NVIDIA GPU on this host") and "provision skips the driver" in driver["fix"]


def test_host_with_nvidia_smi_but_no_driver_loaded(tmp_path):
    recs = by_id(records("--smi-xml", FIX / "nvidia-smi-no-driver.txt", "--proc-version", tmp_path / "absent"))
    assert recs["host.driver"]["status"] == "fail"
    assert "couldn't communicate with the NVIDIA driver" in recs["host.driver"]["detail"]
    assert recs["host.gpu_model"]["status"] == recs["host.xid"]["status"] == "skip"


def test_healthy_a100_with_its_real_quirks(host):
    recs = records(*host("a100-sxm4-mig-535.xml"), "--expect-gpus", "1", "--expect-model", "NVIDIA A100-SXM4-80GB")
    assert [r["id"] for r in recs] == ["host.driver", "host.gpu_count", "host.gpu_model",
                                       *(f"host.gpu0.{c}" for c in GPU_CHECKS), "host.xid"]
    got = {r["id"]: r["status"] for r in recs}
    assert got == {"host.driver": "pass", "host.gpu_count": "pass", "host.gpu_model": "pass",
                   "host.gpu0.persistence": "warn", "host.gpu0.ecc_uncorrected": "pass",
                   "host.gpu0.retired_pages": "skip", "host.gpu0.remapped_rows": "skip", "host.gpu0.throttle": "pass",
                   "host.gpu0.pcie": "pass", "host.gpu0.temperature": "pass", "host.gpu0.processes": "pass",
                   "host.xid": "pass"}
    r = by_id(recs)
    assert r["host.driver"]["measured"] == "535.54.03" and "nvidia-smi" in r["host.driver"]["detail"]
    assert "nvidia-smi -pm 1" in r["host.gpu0.persistence"]["fix"] and "invoke provision" in r["host.gpu0.persistence"]["fix"]
    assert (r["host.gpu0.temperature"]["measured"], r["host.gpu0.temperature"]["unit"]) == (27, "C")
    assert r["host.gpu0.pcie"]["measured"] == "gen4 x16"


def test_a_gpu_model_other_than_the_inventorys_fails_naming_both(host):
    r = by_id(records(*host("a100-sxm4-mig-535.xml"), "--expect-model", "NVIDIA H100 80GB HBM3"))["host.gpu_model"]
    assert r["status"] == "fail" and r["measured"] == ["NVIDIA A100-SXM4-80GB"]
    assert "GPU 0 is NVIDIA A100-SXM4-80GB" in r["detail"] and "H100" in r["detail"]
    assert "gpurig_gpus.model" in r["fix"]
    assert by_id(records(*host("a100-sxm4-mig-535.xml"), "--expect-model", "a100"))["host.gpu_model"]["status"] == "pass"


def test_fewer_gpus_than_the_inventory_says(host):
    r = by_id(records(*host("dual-rtx-a5000-590.xml", driver="590.44.01"), "--expect-gpus", "4"))["host.gpu_count"]
    assert (r["status"], r["measured"], r["expected"]) == ("fail", 2, 4)
    assert "gpurig_gpus.count" in r["fix"]


def test_ecc_errors_and_a_pending_page_retirement_fail_with_a_reset(host):
    r = by_id(records(*host("tesla-t4-ecc-pending.xml", driver="515.105.01")))
    ecc, pages = r["host.gpu0.ecc_uncorrected"], r["host.gpu0.retired_pages"]
    assert (ecc["status"], ecc["measured"], ecc["expected"]) == ("fail", 2, 0)
    assert "nvidia-smi -r -i 0" in ecc["fix"] and "RMA" in ecc["fix"]
    assert pages["status"] == "fail" and pages["measured"] == 2 and "pending" in pages["detail"]
    assert "reset" in pages["fix"]


def test_older_gpu_reports_retired_pages_instead_of_remapped_rows(host):
    r = by_id(records(*host("tesla-t4-515.xml", driver="515.105.01")))
    assert (r["host.gpu0.retired_pages"]["status"], r["host.gpu0.retired_pages"]["measured"]) == ("pass", 0)
    assert r["host.gpu0.remapped_rows"]["status"] == "skip"


def test_pending_row_remap_fails_only_on_its_gpu(host):
    r = by_id(records(*host("dual-rtx-a5000-remap-pending.xml", driver="590.44.01")))
    assert r["host.gpu0.remapped_rows"]["status"] == "fail" and "nvidia-smi -r -i 0" in r["host.gpu0.remapped_rows"]["fix"]
    assert r["host.gpu1.remapped_rows"]["status"] == "pass"
    assert r["host.gpu0.ecc_uncorrected"]["detail"].endswith("ECC is disabled on this GPU")


def test_thermal_throttling_fails_with_a_cooling_fix(host):
    r = by_id(records(*host("a100-thermal-throttle.xml")))
    throttle, temp = r["host.gpu0.throttle"], r["host.gpu0.temperature"]
    assert throttle["status"] == "fail" and throttle["measured"] == ["hw_thermal_slowdown", "sw_thermal_slowdown"]
    assert "HW thermal slowdown" in throttle["detail"] and "cooling" in throttle["fix"]
    assert (temp["status"], temp["measured"]) == ("fail", 91) and "slowdown at 89 C" in temp["detail"]


def test_idle_reasons_are_fine_and_an_idle_link_downshift_only_says_so(host):
    r = by_id(records(*host("dual-rtx-a5000-590.xml", driver="590.44.01")))
    assert (r["host.gpu0.throttle"]["status"], r["host.gpu0.throttle"]["measured"]) == ("pass", ["gpu_idle"])
    link = r["host.gpu0.pcie"]
    assert (link["status"], link["measured"], link["expected"]) == ("pass", "gen1 x16", "gen4 x16")
    assert "idle" in link["detail"] and "under load" in link["detail"]


def test_narrow_link_at_p0_warns(host):
    link = by_id(records(*host("tesla-t4-515.xml", driver="515.105.01")))["host.gpu0.pcie"]
    assert (link["status"], link["measured"], link["expected"]) == ("warn", "gen3 x8", "gen3 x16")
    assert "recheck under load" in link["detail"] and "LnkSta" in link["fix"]


def test_foreign_compute_processes_are_named_with_pid_and_memory(host):
    r = by_id(records(*host("tesla-t4-515.xml", driver="515.105.01")))["host.gpu0.processes"]
    assert r["status"] == "warn" and r["measured"] == [{"pid": 5762, "name": "python", "used_mib": 1005}]
    assert "pid 5762 python (1005 MiB)" in r["detail"] and "Xorg" not in r["detail"]  # a graphics client is not compute


def test_na_heavy_vgpu_skips_what_it_cannot_tell(host):
    r = by_id(records(*host("grid-p4-vgpu-513.xml", driver="513.46")))
    for check in ("persistence", "ecc_uncorrected", "retired_pages", "remapped_rows", "throttle", "pcie"):
        assert r[f"host.gpu0.{check}"]["status"] == "skip", check
    procs = r["host.gpu0.processes"]
    assert procs["status"] == "warn" and "13 compute process(es)" in procs["detail"] and "and 8 more" in procs["detail"]
    assert procs["measured"][0] == {"pid": 1188, "name": "?", "used_mib": None}


def test_uncorrectable_ecc_errors_in_the_pre_v12_schema_fail(host):
    """Before schema v12 the volatile counts are ``single_bit`` (corrected) and ``double_bit`` (uncorrectable).

    grid-p4-vgpu-513-ecc-dbe.xml is grid-p4-vgpu-513.xml with only its counts
    changed (tests/fixtures/verify/README.md): 5 corrected and 2 uncorrectable
    volatile errors, 41 and 3 since the counters were last reset, so reading
    the corrected or the aggregate counts gives another number than 2.
    """
    ecc = by_id(records(*host("grid-p4-vgpu-513-ecc-dbe.xml", driver="513.46")))["host.gpu0.ecc_uncorrected"]
    assert (ecc["status"], ecc["measured"]) == ("fail", 2)


def test_module_library_mismatch_from_nvidia_smi():
    recs = records("--source", "smi", "--smi-xml", FIX / "nvidia-smi-mismatch.txt",
                   "--proc-version", FIX / "proc-version-550-open.txt", "--dmesg", FIX / "dmesg-clean.txt")
    r = by_id(recs)
    driver = r["host.driver"]
    assert driver["status"] == "fail" and driver["measured"] == "550.54.15"
    assert "Driver/library version mismatch" in driver["detail"]
    assert "kernel module 550.54.15" in driver["detail"] and "library 550.90" in driver["detail"]
    assert driver["fix"].startswith("reboot, or reload the nvidia kernel modules")
    assert r["host.gpu_count"]["detail"] == "skipped: driver/library version mismatch"
    assert not [i for i in r if i.startswith("host.gpu0")]


def test_module_library_mismatch_from_nvml():
    driver = records("--source", "nvml", "--proc-version", FIX / "proc-version-550-open.txt",
                     "--dmesg", FIX / "dmesg-clean.txt", nvml="nvml-mismatch.json")[0]
    assert driver["status"] == "fail" and "NVML_ERROR_LIB_RM_VERSION_MISMATCH" in driver["detail"]
    assert "kernel module 550.54.15" in driver["detail"]
    assert driver["fix"].startswith("reboot, or reload the nvidia kernel modules")


@pytest.mark.parametrize("capture, driver", [("tesla-t4-515", "515.105.01"), ("dual-rtx-a5000-590", "590.44.01")])
def test_nvml_and_nvidia_smi_give_the_same_records(host, capture, driver):
    replay = host(f"{capture}.xml", driver=driver)
    from_smi = records(*replay)
    from_nvml = records("--source", "nvml", *replay[2:], nvml=f"nvml-{capture}.json")
    assert from_smi[0]["detail"].endswith("read through nvidia-smi")
    assert from_nvml[0]["detail"].endswith("read through NVML")
    from_smi[0]["detail"] = from_nvml[0]["detail"] = "(the source)"
    assert from_nvml == from_smi


def test_auto_source_prefers_a_working_nvml(host):
    driver = records("--proc-version", FIX / "proc-version-535.txt", "--dmesg", FIX / "dmesg-clean.txt",
                     nvml="nvml-tesla-t4-515.json")[0]
    assert driver["status"] == "pass" and driver["detail"].endswith("read through NVML")


@pytest.mark.parametrize("dmesg, status", [("dmesg-xid.txt", "fail"), ("dmesg-xid-app.txt", "warn"),
                                           ("dmesg-clean.txt", "pass"), ("dmesg-nonroot.txt", "skip")])
def test_xid_errors_from_the_kernel_log(host, dmesg, status):
    r = by_id(records(*host("a100-sxm4-mig-535.xml", dmesg=dmesg)))["host.xid"]
    assert r["status"] == status
    if dmesg == "dmesg-xid.txt":
        assert r["measured"] == {"13": ["GPU 0 (0000:01:00)"], "48": ["0000:3b:00"], "63": ["0000:3b:00"],
                                 "79": ["0000:b7:00"]}
        assert "Xid 79 (GPU has fallen off the bus) on 0000:b7:00" in r["detail"]
        assert "Xid 48 (double-bit ECC error)" in r["detail"] and "RMA" in r["fix"]
        assert "application" not in r["fix"]  # the fix speaks to the worst errors
    if dmesg == "dmesg-xid-app.txt":
        assert "Xid 13 (graphics engine exception)" in r["detail"] and "application" in r["fix"]
    if dmesg == "dmesg-nonroot.txt":
        assert "root" in r["detail"] and "Operation not permitted" in r["detail"] and "sudo" in r["fix"]


def test_text_is_a_table_and_json_is_json(host):
    replay = host("tesla-t4-ecc-pending.xml", driver="515.105.01")
    text = run_probe(*replay, fmt="--text")
    assert text.returncode == 0 and text.stdout.startswith("STATUS")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.stdout)
    recs = records(*replay)
    lines = text.stdout.splitlines()
    for r in recs:
        assert any(line.split()[:2] == [r["status"].upper(), r["id"]] for line in lines), r["id"]
    assert sum(line.lstrip().startswith("fix:") for line in lines) == sum(1 for r in recs if r["fix"])


def test_bad_replay_input_is_one_clear_line(tmp_path):
    proc = run_probe("--smi-xml", tmp_path / "missing.xml")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].endswith(f"no such file: {tmp_path / 'missing.xml'}")
    broken = tmp_path / "cut.xml"
    broken.write_text((FIX / "tesla-t4-515.xml").read_text()[:3000])
    driver = records("--smi-xml", broken, "--dmesg", FIX / "dmesg-clean.txt")[0]
    assert driver["status"] == "fail" and "does not parse" in driver["detail"]


def test_a_replayed_probe_finishes_well_under_a_second(host):
    replay = host("dual-rtx-a5000-590.xml", driver="590.44.01")
    for _ in range(3):
        with ChildCPU() as cpu:  # CPU time: the machine's other jobs cannot stretch it
            assert run_probe(*replay).returncode == 0
        assert cpu.seconds < 1.0


def _restricted_kernel_log() -> bool:
    try:
        return os.geteuid() == 0 and Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1"
    except OSError:
        return False


@pytest.mark.skipif(not (_restricted_kernel_log() and Path("/usr/bin/setpriv").exists()
                         and Path("/usr/bin/python3").exists()), reason="needs root, setpriv and dmesg_restrict=1")
def test_kernel_log_for_real_as_root_and_as_nobody():
    """No replayed dmesg: root reads the real kernel log (no Xid on this machine), nobody is refused and told why."""
    replay = ["--smi-xml", FIX / "tesla-t4-515.xml", "--proc-version", FIX / "proc-version-535.txt"]
    assert by_id(records(*replay))["host.xid"]["status"] == "pass"
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                           str(PROBE), "--json", *map(str, replay)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    xid = by_id(json.loads(proc.stdout)["records"])["host.xid"]
    assert xid["status"] == "skip" and "not readable as nobody" in xid["detail"] and "sudo" in xid["fix"]


def test_a_lost_gpu_is_missing_from_the_count_and_named():
    recs = by_id(records("--source", "nvml", "--expect-gpus", "2", "--proc-version", FIX / "proc-version-535.txt",
                         "--dmesg", FIX / "dmesg-clean.txt", nvml="nvml-dual-rtx-a5000-gpu-lost.json"))
    count = recs["host.gpu_count"]
    assert (count["status"], count["measured"], count["expected"]) == ("fail", 1, 2)
    assert "GPU 1: GPU is lost" in count["detail"] and "host.gpu1.pcie" not in recs


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None,
                    reason="this machine has NVIDIA's tools")
@pytest.mark.parametrize("source, said", [("smi", "neither NVML (nvidia-ml-py) nor nvidia-smi is available"),
                                          ("nvml", "NVML is not usable here")])
def test_a_loaded_module_without_tools_to_query_it(source, said):
    """For real: this machine has no nvidia-smi and no libnvidia-ml; only the module's /proc file is replayed."""
    recs = records("--source", source, "--proc-version", FIX / "proc-version-535.txt", "--dmesg", FIX / "dmesg-clean.txt")
    driver = recs[0]
    assert (driver["status"], driver["measured"]) == ("fail", "535.161.08") and said in driver["detail"]
    assert "nvidia-utils" in driver["fix"] and "nvidia-ml-py" in driver["fix"]
    assert by_id(recs)["host.gpu_count"]["detail"] == "skipped: no NVML or nvidia-smi to query the GPUs"


def test_model_expectation_matches_whole_words_only():
    import importlib.util

    spec = importlib.util.spec_from_file_location("verify_host", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.same_model("A100", "NVIDIA A100-SXM4-80GB") and module.same_model("H100", "NVIDIA H100 NVL")
    assert not module.same_model("A100", "NVIDIA A10") and not module.same_model("L4", "NVIDIA L40S")
