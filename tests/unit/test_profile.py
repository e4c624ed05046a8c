"""The inventory's gpurig_* vars as a typed HostProfile: what is read, and one clear error for what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurig.errors import InventoryError
from gpurig.inventory import Host, load_inventory
from gpurig.inventory.profile import PROFILE_KEYS, DeliverySettings, DriverSettings, GpuExpectation, host_profile

ROOT = Path(__file__).resolve().parents[2]


def profile(**vars):
    return host_profile(Host("gpu-01", ("gpu",), vars), "inventory/hosts.yaml")


def error(**vars) -> str:
    with pytest.raises(InventoryError) as err:
        profile(**vars)
    return str(err.value)


def test_example_inventory_hosts_all_have_valid_profiles():
    inv = load_inventory(ROOT / "inventory" / "hosts.yaml")
    profiles = {name: host_profile(h, inv.path) for name, h in inv.hosts.items()}
    assert profiles["localhost"].gpus == GpuExpectation(count=0)
    some_gpu_host = next(p for p in profiles.values() if p.gpus.count)
    assert some_gpu_host.gpus.model and some_gpu_host.shm_size == "16g" and some_gpu_host.become
    assert some_gpu_host.container_runtime == "nvidia"


def test_every_setting_is_read_into_its_type():
    p = profile(
        ansible_become=True,
        gpurig_gpus={"count": 8, "model": "NVIDIA H100 80GB HBM3"},
        gpurig_shm_size="16g",
        gpurig_container_runtime="nvidia",
        gpurig_images=["2.14.1-cu130-slim", "registry.example.invalid/pytorch:2.14.1-cu130-jupyter"],
        gpurig_driver={"install": True, "branch": 580, "source": "nvidia"},
        gpurig_docker={"source": "docker", "users": ["alice", "bob"]},
        gpurig_toolkit={"version": "1.17.8", "packages_dir": "offline/toolkit"},
        gpurig_daemon={"log-driver": "local", "log-opts": {"max-size": "10m"}},
        gpurig_containers=[{"name": "alice", "variant": "jupyter"}],
    )
    assert p.gpus == GpuExpectation(8, "NVIDIA H100 80GB HBM3")
    assert p.driver == DriverSettings(install=True, branch="580", source="nvidia")
    assert p.docker.users == ("alice", "bob") and p.toolkit.version == "1.17.8"
    assert p.daemon["log-opts"] == {"max-size": "10m"}
    assert p.images[1].endswith("jupyter") and p.containers[0]["name"] == "alice"


def test_gpurig_delivery_is_read_and_an_unknown_key_is_one_line_with_the_valid_keys():
    p = profile(gpurig_delivery={"peer": False, "address": "10.0.0.7", "port": 2222})
    assert (p.delivery.peer, p.delivery.address, p.delivery.port) == (False, "10.0.0.7", 2222)
    assert profile().delivery == DeliverySettings() and DeliverySettings().peer
    message = error(gpurig_delivery={"peers": False})
    assert "gpurig_delivery.peers is not a known key" in message and "did you mean 'peer'?" in message
    assert "valid keys in gpurig_delivery: peer, address, port" in message and "\n" not in message


def test_a_host_without_gpurig_vars_gets_the_defaults():
    p = profile(ansible_user="ubuntu")
    assert p.daemon == {} and p.driver.install is False and p.docker.source == "distro" and not p.become


def test_unknown_key_names_file_host_key_and_suggests():
    message = error(gpurig_gpu_cuont=8)
    assert message.startswith("inventory/hosts.yaml: host gpu-01: gpurig_gpu_cuont")
    assert "did you mean 'gpurig_gpu_count'?" in message
    assert all(key in message for key in PROFILE_KEYS)


def test_unknown_nested_key_is_named_with_its_path():
    message = error(gpurig_driver={"instal": True})
    assert "gpurig_driver.instal" in message and "did you mean 'install'?" in message


@pytest.mark.parametrize(
    "vars, fragment",
    [
        ({"gpurig_gpu_count": True}, "gpurig_gpu_count must be a whole number"),  # a bool is not a count
        ({"gpurig_gpu_count": "8"}, "gpurig_gpu_count must be a whole number"),
        ({"gpurig_gpu_count": -1}, "gpurig_gpu_count must be a whole number >= 0"),
        ({"gpurig_driver": {"install": "yes"}}, "gpurig_driver.install must be true or false"),
        ({"gpurig_driver": {"source": "nvidai"}}, "did you mean 'nvidia'?"),
        ({"gpurig_driver": {"branch": "latest"}}, "gpurig_driver.branch must be a string like '550'"),
        ({"gpurig_driver": "550"}, "gpurig_driver must be a mapping, not a string"),
        ({"gpurig_shm_size": 16}, "gpurig_shm_size must be a string like '16g'"),
        ({"gpurig_shm_size": "16 gigs"}, "gpurig_shm_size must be a string like '16g'"),
        ({"gpurig_docker": {"users": "alice"}}, "gpurig_docker.users must be a list"),
        ({"gpurig_docker": {"users": ["alice; rm -rf /"]}}, "gpurig_docker.users[0]"),
        ({"gpurig_images": ["slim; rm -rf /"]}, "gpurig_images[0]"),
        ({"gpurig_daemon": ["log-driver"]}, "gpurig_daemon must be a non-empty mapping"),
        ({"gpurig_daemon": {"log-opts": {1: "x"}}}, "gpurig_daemon.log-opts.1 has a key that is not a string"),
        ({"gpurig_containers": {"name": "a"}}, "gpurig_containers must be a list"),
        ({"gpurig_containers": ["a"]}, "gpurig_containers[0] must be a mapping"),
        ({"gpurig_gpu_count": 8, "gpurig_gpus": {"count": 4}}, "gpurig_gpus.count and gpurig_gpu_count are both set"),
        ({"gpurig_delivery": {"peer": "no"}}, "gpurig_delivery.peer must be true or false"),
        ({"gpurig_delivery": {"port": 0}}, "gpurig_delivery.port must be from 1 to 65535"),
        ({"gpurig_delivery": {"address": "10.0.0.1; rm -rf /"}}, "gpurig_delivery.address must be a string like '10.0.0.11'"),
        ({"gpurig_delivery": "10.0.0.1"}, "gpurig_delivery must be a mapping, not a string"),
    ],
)
def test_wrong_values_are_one_clear_error(vars, fragment):
    message = error(**vars)
    assert fragment in message
    assert message.startswith("inventory/hosts.yaml: host gpu-01: ") and "; fix: " in message


def test_yaml_dates_cannot_reach_daemon_json():
    import datetime

    assert "JSON cannot hold" in error(gpurig_daemon={"data-root": datetime.date(2024, 1, 1)})


@pytest.mark.parametrize("value, shown", [(float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf")])
def test_nan_and_infinities_cannot_reach_daemon_json(value, shown):
    """YAML's .nan/.inf: json.dumps would write NaN/Infinity, which dockerd cannot parse."""
    message = error(gpurig_daemon={"default-ulimits": {"nofile": {"Soft": value}}})
    assert f"gpurig_daemon.default-ulimits.nofile.Soft is {shown}, which JSON cannot hold" in message


def test_a_misspelt_daemon_key_gets_the_key_dockerd_reads():
    message = error(gpurig_daemon={"log-drvier": "local"})
    assert "gpurig_daemon.log-drvier is not a daemon.json key dockerd reads (did you mean 'log-driver'?)" in message
    assert "docs.docker.com" in message


@pytest.mark.parametrize("daemon, fragment", [
    ({"log-opts": "max-size=10m"}, "gpurig_daemon.log-opts must be an object in daemon.json, not 'max-size=10m'"),
    ({"insecure-registries": "127.0.0.1:5000"}, "gpurig_daemon.insecure-registries must be a list"),
    ({"live-restore": "yes"}, "gpurig_daemon.live-restore must be a boolean"),
    ({"mtu": True}, "gpurig_daemon.mtu must be an integer"),
    ({"default-shm-size": 1024}, "gpurig_daemon.default-shm-size must be a string"),
])
def test_a_daemon_value_of_the_wrong_kind_is_refused(daemon, fragment):
    assert fragment in error(gpurig_daemon=daemon)


def test_every_documented_daemon_key_is_accepted():
    from gpurig.inventory.daemonkeys import DAEMON_KEYS

    examples = {"string": "x", "boolean": True, "integer": 3, "list": ["x"], "object": {"x": "y"}}
    daemon = {key: examples[kind] for key, kind in DAEMON_KEYS.items()}
    assert profile(gpurig_daemon=daemon).daemon == daemon


def test_other_vars_are_not_gpurig_settings():
    assert profile(ansible_port=22, my_gpurig_note="x").host == "gpu-01"
