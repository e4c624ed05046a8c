"""Fleet delivery's tree (gpurig.deploy.fanouttree): who pulls from whom, fixed in inventory order before any host is contacted."""

from __future__ import annotations

from gpurig.deploy.fanouttree import Member, chain, descendants, describe, plan_tree


def hosts(n: int, **kw) -> list[Member]:
    return [Member(f"h{i}", **kw) for i in range(n)]


def test_the_first_host_pulls_from_the_build_machine_and_each_next_joins_the_earliest_with_room():
    parents = plan_tree(hosts(14))
    assert parents["h0"] is None
    assert [parents[f"h{i}"] for i in range(1, 14)] == ["h0"] * 3 + ["h1"] * 3 + ["h2"] * 3 + ["h3"] * 3 + ["h4"]
    assert list(parents) == [f"h{i}" for i in range(14)]  # inventory order kept


def test_k_is_the_number_of_children_a_host_serves():
    assert list(plan_tree(hosts(4), k=1).values()) == [None, "h0", "h1", "h2"]
    assert list(plan_tree(hosts(5), k=2).values()) == [None, "h0", "h0", "h1", "h1"]


def test_a_host_prefers_a_parent_of_its_own_group_and_all_says_nothing():
    members = [Member("a0", ("all", "rack-a")), Member("b0", ("all", "rack-b")), Member("a1", ("all", "rack-a")),
               Member("b1", ("all", "rack-b")), Member("b2", ("all", "rack-b"))]
    parents = plan_tree(members)
    assert parents == {"a0": None, "b0": "a0", "a1": "a0", "b1": "b0", "b2": "b0"}


def test_without_room_in_its_group_a_host_joins_the_earliest_with_room():
    members = [Member("a0", ("rack-a",)), *[Member(f"b{i}", ("rack-b",)) for i in range(2)], Member("a1", ("rack-a",))]
    assert plan_tree(members, k=1) == {"a0": None, "b0": "a0", "b1": "b0", "a1": "b1"}


def test_a_host_with_peer_false_is_never_a_parent():
    members = [Member("h0", peer=False), Member("h1"), Member("h2", peer=False), Member("h3"), Member("h4")]
    parents = plan_tree(members, k=1)
    assert parents == {"h0": None, "h1": None, "h2": "h1", "h3": None, "h4": "h3"}  # h1 and h3: no one may serve them
    assert all(p not in ("h0", "h2") for p in parents.values())


def test_chains_descendants_and_the_lines_a_person_reads():
    parents = plan_tree(hosts(6), k=2)
    assert chain(parents, "h5") == ["h2", "h0", None]
    assert descendants(parents, "h1") == ["h3", "h4"] and descendants(parents, "h0") == ["h1", "h2", "h3", "h4", "h5"]
    assert describe(parents) == ["h0 <- the build machine", "h1, h2 <- h0", "h3, h4 <- h1", "h5 <- h2"]
    assert describe(parents, 1_100_000_000) == [
        "h0 <- the build machine: sends 1.10 GB once", "h1, h2 <- h0: serves 2.20 GB (1.10 GB to each of 2)",
        "h3, h4 <- h1: serves 2.20 GB (1.10 GB to each of 2)", "h5 <- h2: serves 1.10 GB once",
        "the build machine sends 1.10 GB in all for 6 hosts (the image is 1.10 GB; 6.60 GB without fan-out)"]


def test_members_are_the_hosts_running_an_image_built_here_with_where_their_peers_reach_them():
    from types import SimpleNamespace

    from gpurig.deploy.fanoutwire import members
    from gpurig.inventory import Host

    built, registry_only = SimpleNamespace(id="sha256:1"), None
    hosts = [Host("a", ("gpu", "all"), {"gpurig_delivery": {"address": "10.0.0.1"}}, address="a.example", port=2200),
             Host("b", ("gpu",), {"gpurig_delivery": {"peer": False, "port": 2222}}, address="b.example"),
             Host("c", ("gpu",), {}, address="", port=None),
             Host("d", ("gpu",), {})]
    t = lambda ref, image: SimpleNamespace(image_ref=ref, image=image)  # noqa: E731
    targets = {"a": [t("img:1", built), t("img:1", built)], "b": [t("img:1", built)], "c": [t("img:1", built), t("reg:1", registry_only)],
               "d": [t("other:1", built)]}
    found = members(hosts, targets, "inventory/hosts.yaml")
    assert list(found) == ["img:1"]  # other:1 runs on one host only; reg:1 only a registry has
    assert found["img:1"] == [Member("a", ("gpu", "all"), True, "10.0.0.1", 2200), Member("b", ("gpu",), False, "b.example", 2222),
                              Member("c", ("gpu",), True, "c", 22)]
