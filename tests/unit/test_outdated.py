"""`outdated`'s reasoning with no index and no host: what pip said, recorded facts, and a base's source."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpurig.facts import parse_facts
from gpurig.image import outdated as od
from gpurig.image.basecheck import base_state, split_ref
from gpurig.image.baseimage import BaseImage
from gpurig.image.pkgindex import Listing, fetch_problem, index_source, parse_versions
from gpurig.image.spec import Bootstrap, MatrixEntry

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
# What pip 23's `index versions` printed against a folder index and against nothing listening (seen here).
PIP_LISTED = "torch (2.15.0+cu130)\nAvailable versions: 2.15.0+cu130, 2.14.1+cu130\n  LATEST:    2.15.0+cu130\n"
PIP_REFUSED = (
    "WARNING: pip index is currently an experimental command.\n"
    "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by "
    "'NewConnectionError('<pip._vendor.urllib3.connection.HTTPConnection object at 0x7f>: Failed to establish a new "
    "connection: [Errno 111] Connection refused')': /cu999/torch/\nERROR: No matching distribution found for torch\n"
)
CUDA = MatrixEntry("2.14.1", "13.0")
CPU = MatrixEntry("2.13.0", "cpu")


def fleet(**named: str) -> dict[str, str | None]:
    """host -> driver, from the recorded facts of real hosts (fixture names)."""
    hosts = [{"host": host, "status": "ok", "data": parse_facts((FACTS / f"{name}.txt").read_text()).to_dict()} for host, name in named.items()]
    return od.drivers_from_facts(hosts)[0]


def offered(*builds: tuple[str, str]) -> od.Offers:
    return od.Offers(frozenset(builds), (), {}, frozenset(c for _, c in builds))


def test_pip_output_gives_the_versions_and_a_refused_index_is_a_problem_not_an_empty_index():
    assert parse_versions(PIP_LISTED) == ("2.15.0+cu130", "2.14.1+cu130")
    assert fetch_problem(PIP_REFUSED) == "[Errno 111] Connection refused"
    assert fetch_problem("ERROR: No matching distribution found for torch\n") == ""  # a 404: the index has no such flavour


def test_a_newer_cuda_build_names_the_driver_it_needs_and_the_hosts_below_it():
    drivers = fleet(**{"h100-01": "h100-driver535-docker-nvidia", "a100-01": "a100-driver550-open-docker-stopped",
                       "a100-02": "a100-fresh-nouveau", "web": "debian12-root"})
    assert drivers == {"h100-01": "535.161.08", "a100-01": "550.54.15", "a100-02": None}  # no GPU, not in the fleet
    found = offered(("2.14.1", "13.0"), ("2.15.0", "13.0"), ("2.15.0", "12.6"), ("2.15.0", "cpu"))
    rows = od.newer_rows(MatrixEntry("2.9.1", "12.8"), found, drivers)
    assert [(r.newer, r.needs, r.fleet) for r in rows] == [
        ("2.15.0 cu130", "driver >= 580.65.06", "3 of 3 hosts older: a100-[01:02],h100-01"),
    ]  # cu126 is older than the entry's CUDA; the same-minor patch does not exist
    assert od.newer_rows(CPU, found, drivers)[0].newer == "2.15.0 cpu"


def test_an_entry_with_nothing_newer_is_current_and_one_missing_from_the_index_is_said():
    found = offered(("2.14.1", "13.0"))
    assert od.newer_rows(CUDA, found, {}) == [od.Newer("2.14.1 cu130")]
    assert "offers no torch 2.13.0 cpu" in od.own_build_missing(CPU, found)


def test_a_patch_of_the_own_minor_is_shown_beside_the_newest_release():
    found = offered(("2.14.1", "13.0"), ("2.14.2", "13.0"), ("2.15.0", "13.2"))
    rows = od.newer_rows(CUDA, found, None)
    assert [(r.newer, r.fleet) for r in rows] == [("2.15.0 cu132", "cannot tell"), ("2.14.2 cu130", "not checked")]
    assert "unknown to gpurig" in rows[0].needs  # CUDA 13.2 has no driver row yet: never a made-up minimum


def test_versions_without_a_label_are_pypis_own_build_and_failures_are_grouped():
    good = Listing(index_source("https://pypi.example/simple"), ("2.14.1", "2.13.0"))
    bad = [Listing(index_source(f"https://idx.example/{t}"), error="Name or service not known") for t in ("cu126", "cu130")]
    found = od.offers([(good, ""), *((b, "") for b in bad)])
    assert ("2.14.1", "13.0") in found.builds and ("2.13.0", "13.0") in found.builds  # PyPI's build of 2.13/2.14 is CUDA 13.0
    assert found.problems == ("pip could not read https://idx.example/cu126 and 1 more indexes: Name or service not known",)


def test_a_row_whose_index_was_not_read_is_unknown_with_the_reason_never_current():
    refused = [(Listing(index_source(f"http://idx.example/{t}"), error="[Errno 111] Connection refused"), c)
               for t, c in (("cu130", "13.0"), ("cpu", "cpu"))]
    found = od.offers([*refused, (Listing(index_source(od.PYPI), ("2.14.1",)), "")])
    for entry in (CUDA, CPU):
        (row,) = od.newer_rows(entry, found, {})
        assert row.newer == "" and "Connection refused" in row.unknown, row
    # every index read, the CUDA one has nothing newer: current; a newer CUDA's index that failed makes it unknown
    read = od.offers([(Listing(index_source("http://idx.example/cu130"), ("2.14.1+cu130",)), "13.0")])
    assert od.newer_rows(CUDA, read, {}) == [od.Newer("2.14.1 cu130")]
    newer_failed = od.offers([(Listing(index_source("http://idx.example/cu130"), ("2.14.1+cu130",)), "13.0"),
                              (Listing(index_source("http://idx.example/cu132"), error="timed out"), "13.2")])
    assert "timed out" in od.newer_rows(CUDA, newer_failed, {})[0].unknown
    assert od.newer_rows(MatrixEntry("2.14.1", "13.2"), newer_failed, {})[0].unknown  # its own index


def test_with_the_torch_index_off_no_cpu_index_is_asked_and_the_cpu_row_says_so(tmp_path):
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text('name: p\npython: "3.11"\nmatrix:\n  - {torch: "2.14.1", cuda: "13.0"}\n  - {torch: "2.13.0", cuda: cpu}\n'
                         'build:\n  torch_index: ""\n')
    from gpurig.image.spec import load_spec

    places = od.sources(load_spec(spec_file))
    assert [(s.label, c) for s, c in places] == [(od.PYPI, "")]  # no index at the URL ''
    found = od.offers([(Listing(places[0][0], ("2.14.1", "2.13.0")), "")])
    assert od.newer_rows(CUDA, found, {}) == [od.Newer("2.14.1 cu130")]  # PyPI's own build is CUDA 13.0: it was read
    (cpu,) = od.newer_rows(CPU, found, {})
    assert cpu.newer == "" and "no index offering cpu builds was read" in cpu.unknown


@pytest.mark.parametrize(("names", "text"), [
    (["a100-01", "a100-02", "a100-03"], "a100-[01:03]"),
    (["a100-03", "a100-01", "gpu", "a100-02", "h100-7"], "gpu,a100-[01:03],h100-7"),
    (["n9", "n10"], "n9,n10"),  # different widths are not one Ansible range
])
def test_host_lists_fold_into_ansible_ranges(names, text):
    assert od.compact_names(names) == text


def test_reference_parts_follow_dockers_rules():
    assert split_ref("debian:bookworm-slim") == ("registry-1.docker.io", "library/debian", "bookworm-slim")
    assert split_ref("localhost:5000/ml/base") == ("localhost:5000", "ml/base", "latest")
    assert split_ref("nvidia/cuda:13.0.0-base") == ("registry-1.docker.io", "nvidia/cuda", "13.0.0-base")


def test_a_base_is_judged_by_its_registry_digest_or_its_mirrors_date():
    pulled = BaseImage("debian:bookworm", "local", "sha256:1", ("debian@sha256:" + "a" * 64,))
    assert base_state("debian:bookworm", pulled, "", None, digest_of=lambda ref: "sha256:" + "a" * 64).state == "current"
    newer = base_state("debian:bookworm", pulled, "", None, digest_of=lambda ref: "sha256:" + "b" * 64)
    assert newer.state == "newer" and "docker pull debian:bookworm" in newer.detail
    made = BaseImage("debian:bookworm", "local", "sha256:1", (), bootstrap="debootstrap bookworm")
    boot = Bootstrap("bookworm", "http://mirror.example/debian")
    created = (datetime.now(timezone.utc) - timedelta(days=40)).isoformat()
    later = base_state("debian:bookworm", made, created, boot, mirror_of=lambda b: datetime.now(timezone.utc))
    assert later.state == "newer" and "bootstrapped 40 days ago" in later.detail
    assert base_state("debian:bookworm", made, created, boot, mirror_of=lambda b: datetime(2020, 1, 1, tzinfo=timezone.utc)).state == "current"

    def unreachable(b):
        raise OSError("connection refused")

    assert base_state("debian:bookworm", made, created, boot, mirror_of=unreachable).state == "unknown"
    assert base_state("debian:bookworm", None, "", boot).state == "absent"
    assert base_state("x:1", BaseImage("x:1", "local", "sha256:1", ()), "", None).state == "unknown"  # loaded by hand: no digest


def test_the_exit_code_says_current_newer_or_cannot_tell():
    """0: all current; 1: something newer (a script's cue to rebuild); 2: an index or base could not be read, whatever else is newer."""
    found = offered(("2.14.1", "13.0"), ("2.15.0", "13.0"))
    current, newer = od.newer_rows(CUDA, offered(("2.14.1", "13.0")), None), od.newer_rows(CUDA, found, None)
    assert od.exit_code(any(r.newer for r in current), []) == 0
    assert od.exit_code(any(r.newer for r in newer), []) == 1
    refused = ["https://download.pytorch.org/whl/cu130: [Errno 111] Connection refused"]
    assert od.exit_code(False, refused) == 2  # not "current": it could not look
    assert od.exit_code(any(r.newer for r in newer), refused) == 2  # nor only "newer": part of it went unread
    assert od.exit_code(False, [], unknown=True) == 2  # a row no index was asked for (torch_index: "" for the CPU build)
