"""Every reader of a file gpurig did not write itself, fed what a careless or hostile user can put there.

/dev/zero never ends, a FIFO blocks whoever opens it, a sparse 1 GiB file
costs nothing to make and everything to read, and 100,000 nested brackets
broke json's recursion. Each must cost well under a second and 200 MB and
end in the reader's one-line error; wrong types must be one line too, never
a traceback from deep inside.
"""

from __future__ import annotations

import json
import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from gpurig.deploy.rollplan import STATE_DIR, RolloutState, verified_hosts
from gpurig.errors import ConfigError, DockerError, GpurigError, SpecError
from gpurig.image import outdated as od
from gpurig.image import promote as pm
from gpurig.image.build import read_report
from gpurig.strict.reader import MAX_DEPTH, parse_json, too_deep

DEEP = "[" * 100_000 + "]" * 100_000


def _facts(path: Path):
    return od.read_facts_report(str(path))


def _rollout(path: Path):
    return RolloutState.load(path)


def _promote(path: Path):
    # promote reads every state under .gpurig/rollouts/ of the project the file is in
    return verified_hosts(path.parents[2], "sha256:" + "1" * 64)


def _report(path: Path):
    return read_report(path)


READERS = {"outdated --facts": (_facts, SpecError), "rollout state": (_rollout, ConfigError),
           "promote's states": (_promote, ConfigError), "build report": (_report, DockerError)}


def _place(tmp_path: Path) -> Path:
    folder = tmp_path / STATE_DIR
    folder.mkdir(parents=True)
    return folder / "gpu-slim.json"


def _bounded(fn) -> str:
    """fn's error line, run where a hang fails the test instead of stopping it; its time and memory checked."""
    outcome: list[str] = []

    cpu: list[float] = []

    def run() -> None:
        started = time.thread_time()  # this thread's CPU: what the input cost, which other jobs on the machine cannot move
        try:
            fn()
        except GpurigError as err:
            outcome.append(str(err))
        else:
            outcome.append("no error")
        cpu.append(time.thread_time() - started)

    tracemalloc.start()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)  # a hang (a FIFO read that blocks) uses no CPU: this bound catches it
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert not worker.is_alive(), "the reader hung"
    assert cpu[0] < 2, f"took {cpu[0]:.1f} s of CPU"  # a second is the goal; the margin is tracemalloc's own cost
    assert peak < 200 * 2**20, f"took {peak / 2**20:.0f} MB"
    assert "\n" not in outcome[0] and "; fix: " in outcome[0], outcome[0]
    return outcome[0]


@pytest.mark.parametrize("reader", READERS)
def test_a_link_to_dev_zero_is_refused_at_once(tmp_path, reader):
    path = _place(tmp_path)
    path.symlink_to("/dev/zero")
    assert "is not a regular file" in _bounded(lambda: READERS[reader][0](path))


@pytest.mark.parametrize("reader", READERS)
def test_a_fifo_is_refused_without_blocking(tmp_path, reader):
    path = _place(tmp_path)
    os.mkfifo(path)
    assert "is not a regular file" in _bounded(lambda: READERS[reader][0](path))


@pytest.mark.parametrize("reader", READERS)
def test_a_sparse_gigabyte_is_refused_by_its_size(tmp_path, reader):
    path = _place(tmp_path)
    with open(path, "wb") as f:
        f.truncate(2**30)  # sparse: nothing is written
    message = _bounded(lambda: READERS[reader][0](path))
    assert "1024.0 MiB, over the" in message and "group_vars" not in message  # the document's own fix, not an inventory's


@pytest.mark.parametrize("reader", READERS)
def test_a_hundred_thousand_levels_of_nesting_are_one_line(tmp_path, reader):
    path = _place(tmp_path)
    path.write_text(DEEP)
    assert f"nested deeper than {MAX_DEPTH} levels" in _bounded(lambda: READERS[reader][0](path))


def test_nesting_within_the_limit_reads_and_one_more_level_does_not():
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert not too_deep(json.loads(ok)) and too_deep(json.loads("[" + ok + "]"))
    assert too_deep({"a": [{"b": json.loads(ok)}]})
    assert parse_json('{"a": [1, {"b": null}]}', "f", error=SpecError, fix="x") == {"a": [1, {"b": None}]}


# --- wrong types: one line naming the file and the key --------------------------------------------------------------------


def _facts_doc(*hosts) -> str:
    return json.dumps({"schema": "gpurig.facts/1", "hosts": list(hosts)})


@pytest.mark.parametrize("doc, where, said", [
    (_facts_doc(3), "hosts[0]", "expected a host's mapping, got a number"),
    (_facts_doc({"host": "a", "status": "ok", "data": {}}, "b"), "hosts[1]", "got a string"),
    (_facts_doc({"host": "a", "status": "ok", "data": {"driver_version": ["570"]}}), "hosts[0].data.driver_version", "got a list"),
    (_facts_doc({"host": ["a"], "data": {}}), "hosts[0].host", "got a list"),
    (_facts_doc({"host": "a", "status": "ok", "data": {"driver_version": "9" * 5000, "gpus": [{}]}}), "hosts[0].data.driver_version",
     "is not a driver version"),
    (_facts_doc({"host": "a", "status": "ok", "data": {"driver_version": "abc.def"}}), "hosts[0].data.driver_version", "'abc.def' is not"),
    (_facts_doc({"host": "a", "status": "ok", "data": {"driver_version": "٥٧٠.١"}}), "hosts[0].data.driver_version", "is not a driver"),
    (_facts_doc({"host": "a", "status": "ok", "data": [1]}), "hosts[0].data", "got a list"),
    (_facts_doc({"host": "a", "status": "ok", "data": "x"}), "hosts[0].data", "got a string"),
    (_facts_doc({"host": "a", "status": "ok", "data": {"driver_version": "570.1", "gpus": 3}}), "hosts[0].data.gpus", "got a number"),
    (_facts_doc({"host": "a", "status": "ok", "data": {"pci_gpus": "x"}}), "hosts[0].data.pci_gpus", "got a string"),
    (json.dumps({"schema": "gpurig.facts/1", "hosts": {"a": 1}}), "hosts", "expected a list of hosts, got a mapping"),
    (json.dumps([1, 2]), "", "not a gpurig facts report"),
])
def test_a_facts_report_of_wrong_types_is_one_line(tmp_path, doc, where, said):
    path = tmp_path / "facts.json"
    path.write_text(doc)
    message = _bounded(lambda: _facts(path))
    assert message.startswith(f"--facts {path}: {where}") and said in message


def test_a_good_facts_report_gives_the_drivers(tmp_path):
    path = tmp_path / "facts.json"
    path.write_text(_facts_doc({"host": "a", "status": "ok", "data": {"driver_version": "570.133.20", "gpus": [{}]}},
                               {"host": "b", "status": "failed", "data": None}))
    assert od.drivers_from_facts(_facts(path)) == ({"a": "570.133.20"}, ["b"])


@pytest.mark.parametrize("doc, where", [
    ({"schema": "x", "hosts": ["gpu01"]}, "hosts"),
    ([], ""),
    ({"hosts": {"gpu01": 3}}, "hosts.gpu01"),
    ({"hosts": {"gpu01": {"state": "done", "image_id": 5}}}, "hosts.gpu01.image_id"),
    ({"hosts": {"gpu01": {"state": "started", "previous": ["train"]}}}, "hosts.gpu01.previous"),
    ({"hosts": {"gpu01": {"state": "started", "previous": {"train": "sha256:1"}}}}, "hosts.gpu01.previous.train"),
    ({"hosts": {"gpu01": {"state": "started", "previous": {"train": None}}}}, "hosts.gpu01.previous.train"),
    ({"hosts": {"gpu01": {"state": "started", "previous": {"train": {"image_id": 5}}}}}, "hosts.gpu01.previous.train.image_id"),
    ({"hosts": {"gpu01": {"state": "started", "previous": {"train": {"image_id": "sha256:1", "image_ref": ["x"]}}}}},
     "hosts.gpu01.previous.train.image_ref"),
])
@pytest.mark.parametrize("reader", ["rollout state", "promote's states"])
def test_a_state_of_wrong_types_is_one_line(tmp_path, doc, where, reader):
    path = _place(tmp_path)
    path.write_text(json.dumps(doc))
    message = _bounded(lambda: READERS[reader][0](path))
    assert message.startswith(f"the rollout state {path}: {where}".rstrip()) and "expected" in message


@pytest.mark.parametrize("reader", ["rollout state", "promote's states"])
def test_a_host_name_of_ten_thousand_characters_is_cut_in_the_error_line(tmp_path, reader):
    path = _place(tmp_path)
    path.write_text(json.dumps({"hosts": {"a" * 10_000: 3}}))
    message = _bounded(lambda: READERS[reader][0](path))
    assert "expected a host's entry" in message and len(message) < len(str(path)) + 300


def test_a_build_report_that_is_not_a_mapping_stops_the_promotion(tmp_path):
    path = tmp_path / "report.json"
    path.write_text('["built"]')
    found = pm.Proof("sha256:1", ({"host": "gpu01"},))
    assert "is not one gpurig wrote" in _bounded(lambda: pm.record(path, "p:stable", found, 1, ""))
