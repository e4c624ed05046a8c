"""promote's rule with no Docker and no host: enough proof, one entry per host, and the build report it writes into."""

from __future__ import annotations

import json

import pytest

from gpurig.image import promote as pm


def passed(host: str, time: str, level: str = "quick") -> dict:
    return {"host": host, "state": "done", "verify": "passed", "image_id": "sha256:" + "a" * 64, "level": level, "time": time}


def test_a_host_that_passed_in_two_rollouts_counts_once_with_its_latest_result():
    found = pm.proof("sha256:" + "a" * 64, [passed("b", "2026-12-01T10:00"), passed("a", "2026-12-01T09:00"),
                                            passed("b", "2026-12-02T10:00", level="full")])
    assert found.names == ["a", "b"] and found.hosts[1]["level"] == "full"


def test_too_few_hosts_is_refused_naming_them_and_the_way_on():
    found = pm.proof("sha256:" + "a" * 64, [passed("gpu01", "t")])
    with pytest.raises(pm.PromotionRefused) as err:
        pm.check_enough("ml:2.15.0-cu130-slim", found, 3, "gpurig rollout -l gpu --variant slim --to 2.15.0-cu130-slim")
    assert "passed verify on 1 host (gpu01); --min-hosts 3 asks for 3" in str(err.value)
    assert "gpurig rollout -l gpu" in err.value.fix
    with pytest.raises(pm.PromotionRefused, match="on 0 hosts;"):
        pm.check_enough("ml:x", pm.proof("sha256:b", []), 1, "")
    with pytest.raises(pm.PromotionRefused, match="at least one host"):
        pm.check_enough("ml:x", found, 0, "")
    pm.check_enough("ml:x", found, 1, "")  # enough: no error


def test_the_promotion_is_appended_to_the_newest_build_report_of_the_image(tmp_path):
    image_id = "sha256:" + "a" * 64
    builds = tmp_path / "builds" / "ml"
    builds.mkdir(parents=True)
    (builds / "old.json").write_text(json.dumps({"image_id": image_id, "built_at": "2026-11-01T00:00:00+00:00"}))
    (builds / "new.json").write_text(json.dumps({"image_id": image_id, "built_at": "2026-12-01T00:00:00+00:00", "promotions": [{"alias": "ml:beta"}]}))
    (builds / "other.json").write_text(json.dumps({"image_id": "sha256:" + "b" * 64}))
    (builds / "broken.json").write_text("{")
    report = pm.find_report(tmp_path, image_id)
    assert report == builds / "new.json"
    pm.record(report, "ml:stable", pm.proof(image_id, [passed("gpu01", "t")]), 1, "")
    promotions = json.loads(report.read_text())["promotions"]
    assert [p["alias"] for p in promotions] == ["ml:beta", "ml:stable"]
    assert promotions[1]["verified_on"] == [{"host": "gpu01", "level": "quick", "time": "t", "verify": "passed"}]
    assert pm.find_report(tmp_path, "sha256:" + "c" * 64) is None
