"""The culprit search (gpurig/verify/culprit.py) on synthetic timings: one slow host among 3, 4 and 16, one slow link, all fine.

The fleet model: every host's NIC runs at a speed; a subset's busbw is its
slowest member's speed, or a link's own speed when the subset holds both
ends of a slow link. The search only sees busbw figures, as it would from
real all-reduces.
"""

from __future__ import annotations

from gpurig.verify.culprit import ALL_PAIRS_UP_TO, basis, culprit_record, judge, plan_pairs, search

FAST, SLOW, THRESHOLD = 11.0, 0.11, 9.0


def fleet_model(hosts, slow_hosts=(), slow_links=(), failed=()):
    calls = []

    def measure(subset):
        calls.append(subset)
        if set(subset) & set(failed):
            return None
        got = min(SLOW if h in slow_hosts else FAST for h in subset)
        ring = list(subset) + [subset[0]]
        for a, b in zip(ring, ring[1:]):
            if {a, b} in [set(link) for link in slow_links]:
                got = min(got, 0.5)
        return got

    return measure, calls


def hosts(n):
    return [f"h{i:02d}" for i in range(n)]


def found(names, threshold=THRESHOLD, **model):
    measure, calls = fleet_model(names, **model)
    tested, used = search(names, measure, threshold)
    return judge(tested, used), calls


def test_all_pairs_up_to_eight_hosts():
    assert plan_pairs(["a", "b", "c"]) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert len(plan_pairs(hosts(ALL_PAIRS_UP_TO))) == 28


def test_one_slow_host_among_three():
    result, calls = found(hosts(3), slow_hosts={"h01"})
    assert result.hosts == ("h01",) and not result.links
    assert calls == [("h00", "h01"), ("h00", "h02"), ("h01", "h02")]  # 0.11 of 9: far too slow to be noise, measured once
    r = culprit_record(result)
    assert r.status == "fail" and "h01 is slow with every partner (0.11, 0.11 GB/s)" in r.detail and "NIC, cable" in r.fix


def test_one_slow_host_among_four():
    result, _ = found(hosts(4), slow_hosts={"h03"})
    assert result.hosts == ("h03",) and not result.links and not result.unresolved


def test_one_slow_host_among_sixteen_by_halving():
    result, calls = found(hosts(16), slow_hosts={"h11"})
    assert result.hosts == ("h11",) and not result.links
    assert len(calls) < len(plan_pairs(hosts(16))) // 4  # 2 + 2 group rings, then one leaf's 6 pairs: not 120 pairs
    assert all(len(c) in (2, 4, 8) for c in calls)


def test_one_slow_link_between_two_fine_hosts():
    result, _ = found(hosts(4), slow_links=[("h00", "h02")])
    assert result.links == (("h00", "h02"),) and not result.hosts
    r = culprit_record(result)
    assert r.status == "fail" and "h00 <-> h02" in r.detail and "switch ports" in r.fix


def test_a_slow_link_across_the_halving_cut_is_found():
    result, _ = found(hosts(16), slow_links=[("h07", "h08")])  # the ring link from the first half to the second
    assert result.links == (("h07", "h08"),)


def test_all_fine_passes_or_warns_that_only_the_whole_ring_is_slow():
    result, calls = found(hosts(4))
    assert not result.hosts and not result.links and len(calls) == 6
    assert culprit_record(result, total_slow=False).status == "pass"
    r = culprit_record(result, total_slow=True)
    assert r.status == "warn" and "only with every host at once" in r.detail


def test_two_hosts_alone_cannot_tell_host_from_link():
    result, _ = found(hosts(2), slow_hosts={"h01"})
    assert result.unresolved == (("h00", "h01"),) and culprit_record(result).status == "fail"


def test_a_host_whose_pairs_fail_is_named():
    result, _ = found(hosts(3), failed={"h02"})
    assert result.hosts == ("h02",)
    assert "failed" in culprit_record(result).detail


def test_without_a_promise_a_host_far_below_its_peers_is_still_found():
    result, _ = found(hosts(5), threshold=None, slow_hosts={"h04"})
    assert result.hosts == ("h04",) and result.threshold == 0.5 * FAST


def test_without_a_promise_one_slow_host_among_three_is_found_though_two_pairs_of_three_are_slow():
    result, calls = found(hosts(3), threshold=None, slow_hosts={"h02"})
    assert result.hosts == ("h02",) and result.threshold == 0.5 * FAST and len(calls) == 3


def test_a_promise_no_pair_reaches_judges_the_pairs_against_the_best_and_says_so():
    # gloo's CPUs short of a fast link's promise: every pair under it, one host far under the others
    result, _ = found(hosts(3), threshold=100.0, slow_hosts={"h01"})
    assert result.hosts == ("h01",) and result.threshold == 0.5 * FAST
    names = hosts(3)
    measure, _ = fleet_model(names, slow_hosts={"h01"})
    tested, used = search(names, measure, 100.0)
    r = culprit_record(judge(tested, used, basis(100.0, used)))
    assert r.status == "fail" and "(half the best pair's busbw: no pair reached the links' promise, 100 GB/s)" in r.detail
    assert basis(THRESHOLD, THRESHOLD) == "" and "promise no speed" in basis(None, 5.5)


def test_a_pair_slow_once_is_measured_again_and_not_blamed_when_it_then_reaches_the_threshold():
    figures = {("h00", "h01"): [FAST], ("h00", "h02"): [FAST / 2, FAST], ("h01", "h02"): [FAST]}  # another job's burst, once

    def measure(subset):
        got = figures[subset]
        return got.pop(0) if len(got) > 1 else got[0]

    tested, used = search(hosts(3), measure, THRESHOLD)
    result = judge(tested, used)
    assert not result.hosts and not result.links and not result.unresolved
    assert culprit_record(result, total_slow=False).status == "pass"


def test_a_pair_somewhat_slow_is_measured_twice_and_one_far_too_slow_or_failed_once():
    calls = []

    def measure(subset):
        calls.append(subset)
        return {("h00", "h01"): FAST, ("h00", "h02"): 0.6 * THRESHOLD, ("h01", "h02"): 0.2 * THRESHOLD}[subset]

    search(hosts(3), measure, THRESHOLD)
    assert calls == [("h00", "h01"), ("h00", "h02"), ("h01", "h02"), ("h00", "h02")]
    calls.clear()
    measure_failing = lambda subset: calls.append(subset) or (None if "h02" in subset else FAST)  # noqa: E731
    search(hosts(3), measure_failing, THRESHOLD)
    assert calls == [("h00", "h01"), ("h00", "h02"), ("h01", "h02"), ("h00", "h02"), ("h01", "h02")]  # a failure: once more
