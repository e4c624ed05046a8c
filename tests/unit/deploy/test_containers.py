"""gpurig_containers -> ContainerSpec: defaults per variant, every field, refusals with their fix, and the create body."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml

from gpurig.deploy import fields
from gpurig.deploy.containers import DEFAULT_SHM, ContainerSpec, assign_gpus, load_containers
from gpurig.deploy.fields import GiB, MiB, docker_size, fingerprint
from gpurig.deploy.sharing import HostGpus
from gpurig.errors import InventoryError
from gpurig.image.spec import load_spec
from gpurig.inventory import Host, load_inventory
from gpurig.strict.yamlnode import Node

ROOT = Path(__file__).resolve().parents[3]
SPEC = load_spec(ROOT / "images" / "pytorch.yaml")
INVENTORY = "inventory/hosts.yaml"
HOSTILE = "a b 'single' \"double\" $(id) `id` ${HOME} ; rm -rf / \\ \nsecond line\ttab"
UUID0 = "GPU-5f1b0c2a-1111-2222-3333-444455556666"
UUID1 = "GPU-9abcdef0-aaaa-bbbb-cccc-ddddeeeeffff"
HOST_GPUS = [(0, UUID0), (1, UUID1), (2, "GPU-00000000-0000-0000-0000-000000000002"), (3, "GPU-00000000-0000-0000-0000-000000000003")]


def pubkey(seed: str, comment: str = "alice@laptop") -> str:
    """A well-formed ssh-ed25519 public key line (its 32 key bytes derived from ``seed``)."""
    kind = b"ssh-ed25519"
    blob = len(kind).to_bytes(4, "big") + kind + (32).to_bytes(4, "big") + hashlib.sha256(seed.encode()).digest()
    return f"ssh-ed25519 {base64.b64encode(blob).decode()} {comment}"


def load(*containers: dict, variant: str | None = None, name: str | None = None, source=INVENTORY, **vars):
    if containers:
        vars["gpurig_containers"] = list(containers)
    return load_containers(Host("gpu-01", ("gpu",), vars), SPEC, variant=variant, name=name, source=source)


def one(container: dict, **vars) -> ContainerSpec:
    specs, _ = load(container, **vars)
    return specs[0]


def error(*containers: dict, **kwargs) -> str:
    with pytest.raises(InventoryError) as err:
        load(*containers, **kwargs)
    return str(err.value)


# --- defaults per variant ------------------------------------------------------------


def test_without_gpurig_containers_the_cli_variant_is_one_default_container():
    specs, warnings = load(variant="jupyter")
    (spec,) = specs
    assert spec.name == "gpurig-jupyter" and spec.image == "pytorch:2.14.1-cu130-jupyter" and spec.entry == SPEC.default
    assert [str(p) for p in spec.ports] == ["127.0.0.1:8888->8888/tcp"]  # Jupyter on loopback: reach it by SSH tunnel
    assert spec.gpus.all and not spec.share and spec.restart == "unless-stopped"
    assert [(v.source, v.target, v.read_only, v.create) for v in spec.volumes] == [("/srv/gpurig/gpurig-jupyter/workspace", "/workspace", False, True)]
    assert spec.shm_size == DEFAULT_SHM == 16 * GiB and spec.ipc == "private"
    assert {u.name: (u.soft, u.hard) for u in spec.ulimits} == {"memlock": (-1, -1), "stack": (67108864, 67108864)}
    assert warnings == []
    named, _ = load(variant="slim", name="mine")
    assert named[0].name == "mine"


@pytest.mark.parametrize(
    "variant, ports",
    [
        ("slim", []),
        ("ssh", ["0.0.0.0:2222->22/tcp"]),  # key-only sshd, reachable from other machines
        ("jupyter", ["127.0.0.1:8888->8888/tcp"]),
        ("full", ["0.0.0.0:2222->22/tcp", "127.0.0.1:8888->8888/tcp"]),
    ],
)
def test_default_ports_per_variant(variant, ports):
    spec = one({"variant": variant, "ssh_keys": [pubkey("a")]} if variant in ("ssh", "full") else {"variant": variant})
    assert sorted(str(p) for p in spec.ports) == ports


def test_user_names_the_default_container_and_is_a_label_not_a_uid():
    spec = one({"variant": "jupyter", "user": "alice"})
    assert spec.name == "gpurig-jupyter-alice" and spec.user == "alice"
    body = spec.create_body("img", None, {})
    assert body["Labels"]["io.gpurig.deploy.user"] == "alice" and "User" not in body


def test_no_gpurig_containers_and_no_variant_is_refused():
    assert "no gpurig_containers and no --variant" in error()


def test_cpu_image_defaults_to_no_gpus_and_refuses_them():
    spec = one({"variant": "slim", "cuda": "cpu"})
    assert spec.gpus.none and spec.image == "pytorch:2.13.0-cpu-slim"
    assert "DeviceRequests" not in spec.create_body("img", None, {})["HostConfig"]
    message = error({"variant": "slim", "cuda": "cpu", "gpus": 1})
    assert "the cpu image has no CUDA" in message and "gpurig_containers[0].gpus" in message
    assert one({"variant": "slim", "cuda": "cpu", "gpus": "none"}).gpus.none


def test_host_shm_size_var_is_the_hosts_default():
    assert one({"variant": "slim"}, gpurig_shm_size="32g").shm_size == 32 * GiB
    assert one({"variant": "slim", "shm_size": "8g"}, gpurig_shm_size="32g").shm_size == 8 * GiB


# --- every field -----------------------------------------------------------------


def test_every_field_is_read_into_its_type(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "bob.pub").write_text(f"# bob's keys\n{pubkey('b', 'bob@x')}\n\n{pubkey('c', 'bob@y')}\n")
    spec = one(
        {
            "name": "bob-work", "user": "bob", "variant": "full", "torch": "2.9.1", "cuda": "12.8",
            "gpus": [1, UUID0], "share": True,
            "ports": [{"host": 2223, "container": 22, "bind": "0.0.0.0"}, "127.0.0.1:8890:8888", 6006],
            "volumes": [{"source": "/data/bob", "target": "/workspace"}, {"source": "/opt/ro", "target": "/ro", "read_only": True}],
            "datasets": ["/mnt/datasets/imagenet", "/mnt/coco/"],
            "env": {"HF_HOME": "/workspace/hf", "EMPTY": ""},
            "shm_size": "8GiB", "ipc": "shareable", "ulimits": {"nofile": {"soft": 1024, "hard": 65536}, "memlock": 8388608},
            "cpus": 12.5, "memory": "64g", "restart": "on-failure:5",
            "ssh_keys": [pubkey("a"), "keys/bob.pub"],
        },
        source=tmp_path / "hosts.yaml",
    )
    assert (spec.name, spec.user, spec.variant, spec.image) == ("bob-work", "bob", "full", "pytorch:2.9.1-cu128-full")
    assert spec.gpus.ids == ("1", UUID0) and spec.share
    assert [str(p) for p in spec.ports] == ["0.0.0.0:2223->22/tcp", "127.0.0.1:8890->8888/tcp", "127.0.0.1:6006->6006/tcp"]
    assert [(v.source, v.target, v.read_only) for v in spec.volumes] == [
        ("/data/bob", "/workspace", False), ("/opt/ro", "/ro", True),
        ("/mnt/datasets/imagenet", "/datasets/imagenet", True), ("/mnt/coco/", "/datasets/coco", True),
    ]
    assert dict(spec.env) == {"HF_HOME": "/workspace/hf", "EMPTY": ""}
    assert (spec.shm_size, spec.ipc, spec.cpus, spec.memory, spec.restart) == (8 * GiB, "shareable", 12.5, 64 * GiB, "on-failure:5")
    assert {u.name: (u.soft, u.hard) for u in spec.ulimits} == {"memlock": (8388608, 8388608), "nofile": (1024, 65536), "stack": (67108864, 67108864)}
    assert [k.split()[-1] for k in spec.ssh_keys] == ["alice@laptop", "bob@x", "bob@y"]


def test_explicit_image_instead_of_matrix_versions():
    spec = one({"variant": "jupyter", "image": "registry.example.com:5000/ml/pytorch:custom"})
    assert spec.image == "registry.example.com:5000/ml/pytorch:custom" and spec.entry is None
    assert spec.gpus.all and spec.init  # a foreign image gets Docker's init; gpurig's run tini themselves
    assert "is set beside image:" in error({"variant": "jupyter", "image": "x:1", "torch": "2.14.1"})
    assert "is not an image reference" in error({"variant": "jupyter", "image": "Bad Ref"})


def test_ports_as_a_mapping_of_host_to_container_port():
    spec = one({"variant": "full", "ssh_keys": [pubkey("a")], "ports": {8890: 8888, "0.0.0.0:2223": 22, "[::1]:6006": 6006}})
    assert [str(p) for p in spec.ports] == ["127.0.0.1:8890->8888/tcp", "0.0.0.0:2223->22/tcp", "[::1]:6006->6006/tcp"]
    assert one({"variant": "jupyter", "ports": []}).ports == ()  # nothing published: docker exec only
    assert "expected HOST_PORT: CONTAINER_PORT" in error({"variant": "slim", "ports": {8888: "8888"}})


def test_gpus_zero_and_none_mean_no_gpus():
    for value in (0, "none", []):
        spec = one({"variant": "slim", "gpus": value})
        assert spec.gpus.none and "DeviceRequests" not in spec.create_body("img", (), {})["HostConfig"]
    assert "write gpus: all, gpus: none" in error({"variant": "slim", "gpus": None})


def test_ipc_host_means_no_shm_size():
    spec = one({"variant": "slim", "ipc": "host"})
    body = spec.create_body("img", None, {})["HostConfig"]
    assert spec.shm_size is None and body["IpcMode"] == "host" and "ShmSize" not in body
    assert "uses the host's /dev/shm" in error({"variant": "slim", "ipc": "host", "shm_size": "8g"})


@pytest.mark.parametrize("value, expected", [("16g", 16 * GiB), ("8GiB", 8 * GiB), ("512m", 512 * MiB), ("1.5g", int(1.5 * GiB)), (2 * GiB, 2 * GiB)])
def test_sizes_read_as_docker_reads_them(value, expected):
    assert one({"variant": "slim", "shm_size": value}).shm_size == expected


@pytest.mark.parametrize("nbytes, written", [(16 * GiB, "16g"), (1024 * MiB, "1g"), (1536 * MiB, "1536m"), (64 * 1024, "64k"), (1000, "1000 bytes")])
def test_a_size_is_echoed_as_the_spec_writes_it_and_reads_back_the_same(nbytes, written):
    # errors and diffs about shm_size and memory quote it in the spec's own notation, not as a rounded "1.07 GB"
    assert docker_size(nbytes) == written
    assert fields.size(Node("t.yml", "shm_size", written.replace(" bytes", "")), "16g") == nbytes


def test_small_shm_is_refused_below_64m_and_warned_below_1g():
    message = error({"variant": "slim", "shm_size": "32m"})
    assert "below Docker's 64m default" in message and "shm_size: 16g" in message
    _, warnings = load({"variant": "slim", "shm_size": "512m"})
    assert warnings == ["host gpu-01: container gpurig-slim: shm_size 512m is under 1g: DataLoader workers may fail with 'No space left on device'"]


def test_restart_policies():
    assert one({"variant": "slim", "restart": False}).restart == "no"  # YAML reads a bare `no` as false
    assert one({"variant": "slim", "restart": "always"}).create_body("i", None, {})["HostConfig"]["RestartPolicy"] == {"Name": "always", "MaximumRetryCount": 0}
    assert "did you mean 'always'?" in error({"variant": "slim", "restart": "alwyas"})
    assert "not a restart policy" in error({"variant": "slim", "restart": "always:3"})


def test_ssh_variant_without_keys_is_a_warning_and_keys_on_a_variant_without_sshd_are_refused():
    _, warnings = load({"variant": "ssh"})
    assert "no ssh_keys: nobody can log in" in warnings[0]
    assert "the jupyter variant runs no sshd" in error({"variant": "jupyter", "ssh_keys": [pubkey("a")]})


# --- refusals --------------------------------------------------------------------


def test_unknown_key_names_it_the_host_and_suggests():
    message = error({"variant": "jupyter", "portz": [8888]})
    assert message.startswith("inventory/hosts.yaml: host gpu-01: gpurig_containers[0]: unknown key 'portz' (did you mean 'ports'?)")
    assert "; fix: valid keys here: name, user, variant" in message


@pytest.mark.parametrize(
    "container, fragment",
    [
        ({"variant": "jupytr"}, "'jupytr' is not a variant of {spec} (did you mean 'jupyter'?)"),
        ({"name": "x"}, "missing key 'variant'"),
        ({"variant": "slim", "name": "-bad"}, "is not a container name"),
        ({"variant": "slim", "user": "a b"}, "contains whitespace"),
        (
            {"variant": "slim", "torch": "2.9.1", "cuda": "13.0"},
            "torch=2.9.1 cuda=13.0 is not in the matrix of {spec}; fix: pick one of (torch/cuda) 2.14.1/13.0",
        ),
        ({"variant": "slim", "torch": "2.14.1", "cuda": 13.0}, "13.0 is a number; fix: quote it"),
        ({"variant": "slim", "share": "yes"}, "share: expected true or false"),
        ({"variant": "slim", "gpus": "0,1"}, "is not a GPU request; fix: write gpus: all, gpus: none, a count"),
        ({"variant": "slim", "gpus": [0, 0]}, "device 0 is listed twice"),
        ({"variant": "slim", "gpus": ["0"]}, "is not a device index or GPU UUID"),
        ({"variant": "slim", "gpus": True}, "is not a GPU request"),
        ({"variant": "slim", "ports": [{"host": 70000, "container": 8888}]}, "ports[0].host: 70000 is out of range (1-65535)"),
        ({"variant": "slim", "ports": [{"host": "8888", "container": 8888}]}, "must be a whole number"),
        ({"variant": "slim", "ports": [{"container": 8888, "bind": "localhost"}]}, "is not an IPv4 or IPv6 address"),
        ({"variant": "slim", "ports": ["8888"]}, "is not HOST:CONTAINER"),
        ({"variant": "slim", "ports": [8888, "0.0.0.0:8888:80"]}, "publish the same host port"),
        ({"variant": "slim", "volumes": [{"source": "data", "target": "/data"}]}, "'data' is a relative path"),
        ({"variant": "slim", "volumes": [{"source": "/data", "target": "data"}]}, "'data' is a relative path"),
        ({"variant": "slim", "volumes": [{"source": "/data", "target": "/"}]}, "mounts over the container's root"),
        ({"variant": "slim", "volumes": [{"source": "/da\0ta", "target": "/d"}]}, "NUL byte"),
        ({"variant": "slim", "volumes": [{"source": "/a", "target": "/d"}, {"source": "/b", "target": "/d/"}]}, "both mount at"),
        ({"variant": "slim", "datasets": ["/a/imagenet", "/b/imagenet"]}, "both mount at '/datasets/imagenet'"),
        ({"variant": "slim", "datasets": ["/"]}, "has no directory name"),
        ({"variant": "slim", "env": {"1BAD": "x"}}, "'1BAD' is not an environment variable name"),
        ({"variant": "slim", "env": {"THREADS": 8}}, "env.THREADS: is a number, not a string; fix: quote the value"),
        ({"variant": "slim", "env": {"X": None}}, 'an empty one is ""'),
        ({"variant": "slim", "shm_size": "lots"}, "is not a size"),
        ({"variant": "slim", "shm_size": "99999999p"}, "is more than any host has"),
        ({"variant": "slim", "ipc": "hots"}, "did you mean 'host'?"),
        ({"variant": "slim", "ulimits": {"memlok": -1}}, "did you mean 'memlock'?"),
        ({"variant": "slim", "ulimits": {"nofile": {"soft": 10, "hard": 5}}}, "soft limit 10 is above the hard limit 5"),
        ({"variant": "slim", "cpus": "4"}, "is not a number of CPUs"),
        ({"variant": "slim", "memory": "1m"}, "below Docker's minimum of 6m"),
        ({"variant": "slim", "memory": "2g", "shm_size": "4g"}, None),  # allowed, with a warning
    ],
)
def test_bad_fields_are_one_line_naming_the_key(container, fragment):
    if fragment is None:
        _, warnings = load(container)
        assert "/dev/shm counts against the limit" in warnings[0]
        return
    message = error(container)
    assert fragment.replace("{spec}", str(SPEC.path)) in message and message.startswith("inventory/hosts.yaml: host gpu-01: gpurig_containers[0]")
    assert "\n" not in message.replace("\\n", "")


def test_env_values_are_never_quoted_in_errors():
    secret = "hf_0123456789abcdefSECRET"
    for value in (secret + "\0", secret * 2000):
        message = error({"variant": "slim", "env": {"HF_TOKEN": value}})
        assert "HF_TOKEN" in message and "SECRET" not in message


def test_private_keys_are_refused_and_never_quoted(tmp_path):
    private = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----\n"
    for value in ([private], private):
        message = error({"variant": "ssh", "ssh_keys": value})
        assert "private key" in message and "b3Blbn" not in message
    (tmp_path / "id_ed25519").write_text(private)
    message = error({"variant": "ssh", "ssh_keys": "id_ed25519"}, source=tmp_path / "hosts.yaml")
    assert "holds a private key" in message and "ssh-keygen -y" in message and "b3Blbn" not in message


@pytest.mark.parametrize(
    "keys, fragment",
    [
        (["ssh-ed25519 not-base64!"], "is not base64"),
        (["ssh-rsa " + pubkey("a").split()[1]], "whose data is not a ssh-rsa key"),
        (['command="sh" ' + pubkey("a")], "is not a public key line"),
        (["missing.pub"], "ssh_keys file"),
    ],
)
def test_bad_ssh_keys_are_refused(keys, fragment, tmp_path):
    assert fragment in error({"variant": "ssh", "ssh_keys": keys}, source=tmp_path / "hosts.yaml")


# --- several containers on one host ---------------------------------------------------


def test_two_users_each_pinned_to_their_gpus():
    specs, _ = load({"variant": "jupyter", "user": "alice", "gpus": [0]},
                    {"variant": "jupyter", "user": "bob", "gpus": [1], "ports": [{"host": 8889, "container": 8888}]})
    assert [s.name for s in specs] == ["gpurig-jupyter-alice", "gpurig-jupyter-bob"]
    devices = assign_gpus(specs, HOST_GPUS)
    assert devices == {"gpurig-jupyter-alice": ("0",), "gpurig-jupyter-bob": ("1",)}
    requests = [s.create_body("img", devices[s.name], {})["HostConfig"]["DeviceRequests"] for s in specs]
    assert [r[0]["DeviceIDs"] for r in requests] == [["0"], ["1"]] and all(r[0]["Count"] == 0 for r in requests)


def test_duplicate_names_are_refused():
    message = error({"variant": "slim"}, {"variant": "slim"})
    assert "gpurig_containers[1]: container name 'gpurig-slim' is also used by [0]" in message and "own name" in message


def test_duplicate_host_port_names_both_containers():
    message = error({"variant": "jupyter", "user": "alice", "gpus": [0]}, {"variant": "jupyter", "user": "bob", "gpus": [1]})
    assert "container gpurig-jupyter-bob publishes 127.0.0.1:8888->8888/tcp, which container gpurig-jupyter-alice already publishes" in message
    # every address (0.0.0.0) clashes with loopback on the same port; another address does not
    first, second = {"variant": "slim", "gpus": "none"}, {"variant": "ssh", "gpus": "none"}
    assert "publishes" in error({**first, "ports": ["0.0.0.0:9000:80"]}, {**second, "ports": ["127.0.0.1:9000:22"]})
    assert "publishes" in error({**first, "ports": ["[::]:9000:80"]}, {**second, "ports": ["127.0.0.1:9000:22"]})
    load({**first, "ports": ["127.0.0.1:9000:80"]}, {**second, "ports": ["127.0.0.2:9000:22"]})
    load({**first, "ports": ["0.0.0.0:9000:80"]}, {**second, "ports": ["[::1]:9000:22"]})


@pytest.mark.parametrize(
    "a, b",
    [([0, 1], [1, 2]), ([UUID0], [UUID0]), ("all", [3]), ("all", 1), ("all", "all")],
)
def test_overlapping_gpus_are_refused_unless_both_share(a, b):
    first, second = {"variant": "slim", "name": "a", "gpus": a}, {"variant": "slim", "name": "b", "gpus": b}
    message = error(first, second)
    assert "containers a and b both get" in message and "share: true on both" in message
    assert "share: true on both" in error({**first, "share": True}, second)
    specs, _ = load({**first, "share": True}, {**second, "share": True})
    assert len(assign_gpus(specs, HOST_GPUS)) == 2


def test_gpu_counts_resolve_to_free_disjoint_indexes():
    specs, _ = load({"variant": "slim", "name": "a", "gpus": 2}, {"variant": "slim", "name": "b", "gpus": [0]},
                    {"variant": "slim", "name": "c", "gpus": 1}, {"variant": "slim", "name": "d", "gpus": "none"})
    assert assign_gpus(specs, HOST_GPUS) == {"a": ("1", "2"), "b": ("0",), "c": ("3",), "d": ()}


def test_gpus_all_is_every_gpu_as_count_minus_one():
    specs, _ = load({"variant": "slim"})
    assert assign_gpus(specs, HOST_GPUS) == {"gpurig-slim": None}
    request = specs[0].create_body("img", None, {})["HostConfig"]["DeviceRequests"]
    assert request == [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}]


def test_not_enough_gpus_or_unknown_devices_are_refused_before_anything_starts():
    specs, _ = load({"variant": "slim", "name": "a", "gpus": 3}, {"variant": "slim", "name": "b", "gpus": [0, 1]})
    with pytest.raises(InventoryError, match="asks for 3 GPUs; 2 of the host's 4 are free"):
        assign_gpus(specs, HOST_GPUS)
    for ids, device in (([7], "GPU 7"), (["GPU-deadbeef-0000-0000-0000-000000000000"], "GPU GPU-deadbeef")):
        specs, _ = load({"variant": "slim", "gpus": ids})
        with pytest.raises(InventoryError, match=f"asks for {device}.*which the host does not have; fix: use one of its GPUs: 0 \\(GPU-5f1b"):
            assign_gpus(specs, HOST_GPUS)
    specs, _ = load({"variant": "slim"})
    with pytest.raises(InventoryError, match="asks for all GPUs, but the host has none"):
        assign_gpus(specs, [])


def test_an_index_and_its_uuid_are_the_same_gpu():
    specs, _ = load({"variant": "slim", "name": "a", "gpus": [0]}, {"variant": "slim", "name": "b", "gpus": [UUID0.upper().replace("GPU-", "GPU-")]})
    with pytest.raises(InventoryError, match="containers a and b both get GPU 0"):
        assign_gpus(specs, HOST_GPUS)


def test_a_count_resolved_later_must_be_resolved_before_the_body():
    specs, _ = load({"variant": "slim", "gpus": 2})
    with pytest.raises(ValueError, match="assign_gpus"):
        specs[0].create_body("img", None, {})


def test_cli_variant_and_name_choose_among_the_hosts_containers():
    both = ({"variant": "jupyter", "user": "alice"}, {"variant": "slim", "user": "alice", "gpus": "none"})
    specs, _ = load(*both, variant="slim")
    assert [s.name for s in specs] == ["gpurig-slim-alice"]
    message = error(*both, variant="ssh")
    assert "no container in gpurig_containers matches --variant ssh" in message and "gpurig-jupyter-alice (jupyter)" in message


# --- settings, hash, create body ------------------------------------------------------


def test_settings_are_canonical_and_hide_env_values_and_keys():
    spec = one({"variant": "ssh", "env": {"HF_TOKEN": "hf_SECRET", "A": "1"}, "ssh_keys": [pubkey("a")]})
    settings = spec.settings()
    text = json.dumps(settings)
    assert list(settings) == sorted(settings) and "hf_SECRET" not in text and "AAAA" not in text
    assert re.fullmatch(r"sha256:[0-9a-f]{12}", settings["env"]["HF_TOKEN"])
    assert settings["ssh_keys"] == [fingerprint(pubkey("a"))] and settings["ssh_keys"][0].startswith("SHA256:")
    assert "hf_SECRET" not in repr(spec)
    json.loads(json.dumps(settings))  # JSON-able


def test_hash_follows_the_settings_not_the_order_they_were_written_in():
    base = {"variant": "jupyter", "env": {"A": "1", "B": "2"}, "ports": [8888, 6006],
            "volumes": [{"source": "/a", "target": "/a"}, {"source": "/b", "target": "/b"}]}
    reordered = {"volumes": list(reversed(base["volumes"])), "ports": [6006, 8888], "env": {"B": "2", "A": "1"}, "variant": "jupyter"}
    assert one(base).config_hash() == one(reordered).config_hash()
    assert re.fullmatch(r"[0-9a-f]{16}", one(base).config_hash())
    assert one(base).config_hash() != one({**base, "ports": [8889, 6006]}).config_hash()
    assert one(base).config_hash() != one({**base, "env": {"A": "1", "B": "3"}}).config_hash()


def test_create_body_is_the_engine_api_request():
    spec = one({"variant": "full", "user": "alice", "gpus": [0, UUID1], "ssh_keys": [pubkey("a")], "cpus": 4,
                "memory": "32g", "ports": [{"host": 2222, "container": 22, "bind": "0.0.0.0"}, {"host": 8888, "container": 8888, "bind": "::1"}]})
    body = spec.create_body("sha256:" + "ab" * 32, None, {"io.gpurig.test": "s1", "io.gpurig.deploy.hash": "forged"})
    assert body["Image"] == "sha256:" + "ab" * 32
    assert body["Labels"] == {
        "io.gpurig.test": "s1", "io.gpurig.deploy.hash": spec.config_hash(), "io.gpurig.deploy.name": "gpurig-full-alice",
        "io.gpurig.deploy.user": "alice", "io.gpurig.deploy.variant": "full",
        "io.gpurig.deploy.settings": json.dumps(spec.settings(), sort_keys=True, separators=(",", ":")),
    }
    assert body["ExposedPorts"] == {"22/tcp": {}, "8888/tcp": {}}
    assert body["Env"] == []  # the keys go to /run/secrets/authorized_keys before start, not into the environment
    assert "Cmd" not in body
    host = body["HostConfig"]
    assert host["PortBindings"] == {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "2222"}], "8888/tcp": [{"HostIp": "::1", "HostPort": "8888"}]}
    assert host["Mounts"] == [{"Type": "bind", "Source": "/srv/gpurig/gpurig-full-alice/workspace", "Target": "/workspace", "ReadOnly": False}]
    assert (host["ShmSize"], host["IpcMode"], host["NanoCpus"], host["Memory"]) == (16 * GiB, "private", 4_000_000_000, 32 * GiB)
    assert host["Ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}, {"Name": "stack", "Soft": 67108864, "Hard": 67108864}]
    assert host["RestartPolicy"] == {"Name": "unless-stopped", "MaximumRetryCount": 0}
    assert host["DeviceRequests"] == [{"Driver": "", "Count": 0, "DeviceIDs": ["0", UUID1], "Capabilities": [["gpu"]], "Options": {}}]
    assert host["Init"] is False  # the image's own tini is PID 1
    json.dumps(body)


def test_slim_stays_up_without_a_terminal():
    assert one({"variant": "slim"}).create_body("img", None, {})["Cmd"] == ["sleep", "infinity"]


def test_hostile_env_values_and_paths_arrive_literally():
    source = "/srv/data with spaces/it's \"quoted\"/$(id)/a:b\nnext"
    spec = one({"variant": "slim", "env": {"HOSTILE": HOSTILE}, "volumes": [{"source": source, "target": "/w o:rk"}],
                "datasets": ["/mnt/$(touch x)/set`id`"]})
    body = spec.create_body("img", None, {})
    assert body["Env"] == [f"HOSTILE={HOSTILE}"]
    assert [(m["Source"], m["Target"]) for m in body["HostConfig"]["Mounts"]] == [
        (source, "/w o:rk"), ("/mnt/$(touch x)/set`id`", "/datasets/set`id`")]
    assert json.loads(json.dumps(body))["Env"][0] == f"HOSTILE={HOSTILE}"


# --- the example inventory ---------------------------------------------------------------


def test_example_inventory_hosts_load_and_its_commented_example_is_valid(tmp_path):
    inv = load_inventory(ROOT / "inventory" / "hosts.yaml")
    for host in inv.hosts.values():
        specs, _ = load_containers(host, SPEC, variant="jupyter", source=inv.path)
        assert specs[0].variant == "jupyter"
    text = (ROOT / "inventory" / "hosts.yaml").read_text()
    block = re.search(r"\n( *# gpurig_containers:.*?)\n *# --- end", text, re.S).group(1)
    example = yaml.safe_load("\n".join(line.split("#", 1)[1][1:] for line in block.splitlines()))
    (tmp_path / "keys").mkdir()
    for user in ("alice", "bob"):
        (tmp_path / "keys" / f"{user}.pub").write_text(pubkey(user, user) + "\n")
    host = Host("a100-01", ("a100",), {**inv.hosts["a100-01"].vars, **example})
    specs, warnings = load_containers(host, SPEC, source=tmp_path / "hosts.yaml")
    devices = assign_gpus(specs, [(i, f"GPU-00000000-0000-0000-0000-00000000000{i}") for i in range(8)])
    assert len(specs) >= 2 and all(devices[s.name] != () for s in specs if not s.gpus.none)


def test_command_replaces_the_images_argv_without_a_shell():
    spec = one({"variant": "slim", "cuda": "cpu", "command": ["sh", "-c", "echo $(id); exit 3"]})
    assert spec.create_body("img")["Cmd"] == ["sh", "-c", "echo $(id); exit 3"]
    assert one({"variant": "slim", "cuda": "cpu"}).create_body("img")["Cmd"] == ["sleep", "infinity"]
    assert spec.config_hash() != one({"variant": "slim", "cuda": "cpu"}).config_hash()
    for bad in ([], "python train.py", [1, 2]):
        with pytest.raises(InventoryError, match="command"):
            one({"variant": "slim", "cuda": "cpu", "command": bad})


def test_gpus_held_by_the_hosts_other_gpurig_containers_are_taken():
    # bob runs on GPU 1 from an earlier deploy; this run deploys only alice
    [alice] = load({"variant": "jupyter", "user": "alice", "gpus": 1})[0]
    assert assign_gpus([alice], HOST_GPUS, held={"gpurig-jupyter-bob": (("1",), False)}) == {"gpurig-jupyter-alice": ("0",)}
    [alice_on_1] = load({"variant": "jupyter", "user": "alice", "gpus": [1]})[0]
    with pytest.raises(InventoryError, match="running gpurig container gpurig-jupyter-bob holds"):
        assign_gpus([alice_on_1], HOST_GPUS, held={"gpurig-jupyter-bob": (("1",), False)})
    with pytest.raises(InventoryError, match="holds"):
        assign_gpus([alice_on_1], HOST_GPUS, held={"gpurig-jupyter-bob": (("all",), False)})
    [sharing] = load({"variant": "jupyter", "user": "alice", "gpus": [1], "share": True})[0]
    assert assign_gpus([sharing], HOST_GPUS, held={"gpurig-jupyter-bob": ((UUID1,), True)}) == {"gpurig-jupyter-alice": ("1",)}


def test_a_count_keeps_the_gpus_its_container_holds():
    [alice] = load({"variant": "jupyter", "user": "alice", "gpus": 2})[0]
    assert assign_gpus([alice], HOST_GPUS, current={"gpurig-jupyter-alice": ("2", "3")}) == {"gpurig-jupyter-alice": ("2", "3")}
    # no longer free: chosen afresh
    held = {"gpurig-jupyter-bob": (("3",), False)}
    assert assign_gpus([alice], HOST_GPUS, current={"gpurig-jupyter-alice": ("2", "3")}, held=held) == {"gpurig-jupyter-alice": ("0", "1")}


@pytest.mark.parametrize("entry", [
    {"variant": "slim", "gpus": 10**5000 - 1},
    {"variant": "slim", "cuda": "cpu", "shm_size": 10**5000 - 1},
    {"variant": "slim", "cuda": "cpu", "memory": 10**5000 - 1},
    {"variant": "slim", "torch": "2.14\n$(id)\0"},
    {"variant": "slim", "cuda": "13.0\n-rf"},
    {"variant": "slim", "torch": "2.9.1\n", "cuda": "13.0"},
])
def test_hostile_values_get_one_short_line(entry):
    message = error(entry)
    assert len(message.splitlines()) == 1 and len(message) < 400 and "\0" not in message


def test_a_device_id_names_a_gpu_by_index_or_by_uuid_in_either_case_of_hex():
    # the one map from a device id to a GPU index: assign_gpus and pre-flight's MIG check both read ids through it
    uuid = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
    gpus = HostGpus([(0, "GPU-ffffffff-0000-1111-2222-333344445555"), (1, uuid)])
    assert gpus.indexes == [0, 1] and gpus.pairs[1] == (1, uuid)
    assert gpus.index_of("1") == gpus.index_of(uuid) == gpus.index_of(uuid.upper()) == 1  # nvidia-smi prints lowercase hex
    assert gpus.index_of("7") == 7  # an index is as written; whether the host has it is the caller's question
    assert gpus.index_of("GPU-00000000-0000-0000-0000-000000000000") is None
    assert gpus.index_of("all") is None and gpus.index_of("MIG-0a1b2c3d-0000-1111-2222-333344445555") is None
