"""A real Prometheus scrapes the exporter: series under dcgm-exporter and node-exporter names, Slurm job labels, and every dashboard panel has data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpurig.monitor.exporter import DCGM_GAUGES, serve
from gpurig.monitor.record import load_run
from gpurig.skeleton import shipped

ROOT = Path(__file__).resolve().parents[3]
RUNS = ROOT / "tests" / "fixtures" / "monitor" / "runs"
DASHBOARD = shipped("gpurig/monitor/grafana-dashboard.json")  # where this gpurig keeps it, as users find it
NODE = (
    "node_cpu_seconds_total",
    "node_memory_MemTotal_bytes",
    "node_memory_MemAvailable_bytes",
    "node_disk_read_bytes_total",
    "node_network_receive_bytes_total",
)
PLAIN = "gpu-healthy|gpu-throttling"  # the hosts without Slurm


@pytest.fixture(scope="module")
def scraped(prometheus):
    """An exporter fed three recorded GPU hosts (one a Slurm node whose GPUs jobs hold), scraped by a real Prometheus until every target is up."""
    run = load_run(RUNS / "healthy")
    for case in ("throttling", "slurm_jobs"):
        for line in (RUNS / case / "samples.jsonl").read_text().splitlines():
            record = json.loads(line)
            run.add(record.pop("host"), record)
    exporter = serve(run, "127.0.0.1", 0)
    try:
        prom = prometheus([f"127.0.0.1:{exporter.port}"])
        prom.wait_up()
        yield prom
    finally:
        exporter.close()


def test_prometheus_has_the_series_by_their_dcgm_names(scraped):
    util = scraped.poll(lambda: scraped.query(f'DCGM_FI_DEV_GPU_UTIL{{Hostname=~"{PLAIN}"}}'), "DCGM_FI_DEV_GPU_UTIL")
    labels = {r["metric"]["Hostname"]: r["metric"] for r in util}
    assert set(labels) == {"gpu-healthy", "gpu-throttling"}
    healthy = labels["gpu-healthy"]
    assert (healthy["gpu"], healthy["modelName"], healthy["device"]) == ("0", "NVIDIA H100 80GB HBM3", "nvidia0")
    assert healthy["UUID"].startswith("GPU-")
    values = {r["metric"]["Hostname"]: float(r["value"][1]) for r in util}
    assert values == {"gpu-healthy": 97.0, "gpu-throttling": 97.0}
    sm = scraped.query("DCGM_FI_PROF_SM_ACTIVE")
    assert [(r["metric"]["Hostname"], float(r["value"][1])) for r in sm] == [("gpu-healthy", 0.86)]  # only GPM GPUs report it
    for name, _, _ in DCGM_GAUGES:
        if name != "DCGM_FI_PROF_SM_ACTIVE" and name != "DCGM_FI_PROF_SM_OCCUPANCY":
            assert scraped.query(name), name
    for name in NODE:
        assert scraped.query(name), name
    modes = {r["metric"]["mode"] for r in scraped.query('node_cpu_seconds_total{Hostname="gpu-healthy"}')}
    assert modes == {"user", "system", "idle", "iowait"}


def test_every_dashboard_panel_query_returns_series(scraped):
    dashboard = json.loads(DASHBOARD.read_text())
    variable = dashboard["templating"]["list"][0]
    hosts = scraped.api("series", **{"match[]": variable["definition"].split("(")[1].split(",")[0]})["data"]
    assert {s["Hostname"] for s in hosts} == {"gpu-healthy", "gpu-throttling", "gpu-slurm-jobs"}
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 12
    for expr in exprs:
        concrete = expr.replace("$Hostname", variable["allValue"]).replace("$__rate_interval", "1m")
        # rate() needs two scrapes: poll until the panel would draw.
        got = scraped.poll(lambda concrete=concrete: scraped.query(concrete), f"series for {concrete}", deadline_s=15)
        assert got, expr


def test_prometheus_answers_which_job_holds_the_idle_gpu(scraped):
    idle = scraped.poll(lambda: scraped.query('DCGM_FI_DEV_GPU_UTIL{hpc_job!=""} < 10'), "an idle GPU a job holds")
    assert [({k: r["metric"].get(k) for k in ("Hostname", "gpu", "hpc_job", "hpc_user")}, float(r["value"][1])) for r in idle] == [
        ({"Hostname": "gpu-slurm-jobs", "gpu": "0", "hpc_job": "42", "hpc_user": "alice"}, 2.0)
    ]
    by_job = scraped.query('count by (hpc_job, hpc_user) (DCGM_FI_DEV_GPU_UTIL{hpc_job!=""})')
    assert sorted((r["metric"]["hpc_job"], r["metric"].get("hpc_user")) for r in by_job) == [("42", "alice"), ("43", "bob"), ("44", None)]
    shared = scraped.query('DCGM_FI_DEV_FB_USED{Hostname="gpu-slurm-jobs", gpu="1"}')
    assert sorted(r["metric"]["hpc_job"] for r in shared) == ["43", "44"]  # a shared GPU: a series per job, as dcgm-exporter has it
    free = scraped.query('DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-slurm-jobs", hpc_job=""}')  # no label: what PromQL matches as empty
    assert [r["metric"]["gpu"] for r in free] == ["2"] and "hpc_job" not in free[0]["metric"]
    assert not scraped.query(f'DCGM_FI_DEV_GPU_UTIL{{Hostname=~"{PLAIN}", hpc_job!=""}}')
    (panel,) = [p for p in json.loads(DASHBOARD.read_text())["panels"] if "hpc_job" in p["targets"][0]["expr"]]
    rows = scraped.query(panel["targets"][0]["expr"].replace("$Hostname", ".*"))
    assert sorted(r["metric"]["hpc_job"] for r in rows) == ["42", "43", "44"]
    assert (rows[0]["metric"]["hpc_job"], rows[0]["metric"]["hpc_user"]) == ("42", "alice")  # the dashboard's table: the idle one first
