"""`gpurig deploy` / status / logs / stop / rm against the session's provisioned host, as a user runs them.

Every image moves over SSH into the host's own engine; what the containers
got is read back through the test's own `docker exec` into the host, not
through gpurig.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import paramiko
import pytest

from .gpuhost import bare


def host_ip(deploy_host) -> str:
    """The host container's address on this machine's bridge: its published ports are reachable there."""
    out = deploy_host.host.docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", deploy_host.cid)
    return out.stdout.split()[0]


def run(gpurig_cli, cpu_images, inventory, *args, check_rc: int | None = 0):
    proc = gpurig_cli(*args, "-i", str(inventory), env={"GPURIG_ROOT": str(cpu_images.project)})
    if check_rc is not None:
        assert proc.returncode == check_rc, f"gpurig {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    return proc


# dockerd here may not raise RLIMIT_MEMLOCK above its own 8 MiB (no CAP_SYS_RESOURCE): pre-flight refuses
# NVIDIA's memlock -1 with that fix, so the tests' containers ask for what the host allows.
HOST_ULIMITS = {"memlock": 8388608}


def entries(*containers: dict) -> dict:
    return {"gpurig_containers": [{"ulimits": HOST_ULIMITS, **c} for c in containers]}


def reasons(proc) -> str:
    """Every container's reason and fix (its own JSON field) from `--json -` on stdout, one per line."""
    doc = json.loads(proc.stdout)
    said = [c for h in doc["hosts"] for c in h["containers"]] + [h for h in doc["hosts"] if not h["containers"]]
    return "\n".join(f"{x['reason']} | fix: {x.get('fix') or ''}" for x in said)


def report(tmp_path, name="deploy.json") -> dict:
    return json.loads((tmp_path / name).read_text())


def containers_of(doc: dict) -> dict:
    return {c["name"]: c for h in doc["hosts"] for c in h["containers"]}


def test_slim_deploys_then_is_ok_then_a_changed_setting_recreates(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images, tmp_path):
    cpu_images["slim"]
    inv = deploy_inventory(entries({"variant": "slim", "cuda": "cpu", "shm_size": "2g"}))
    first = run(gpurig_cli, cpu_images, inv, "deploy", "--json", str(tmp_path / "deploy.json"))
    made = containers_of(report(tmp_path))["gpurig-slim"]
    assert made["status"] == "changed" and made["action"] == "create"
    assert made["delivery"] in ("forward", "present")  # present when another test of the session moved it already
    info = clean_deploy_host.inspect("gpurig-slim")
    assert info["State"]["Running"], first.stdout
    cid = info["Id"]
    # /dev/shm has the configured size, not Docker's 64 MB
    shm = clean_deploy_host.docker("exec", "gpurig-slim", "df", "-B1", "--output=size", "/dev/shm").stdout.split()[-1]
    assert int(shm) == 2 * 1024**3
    # the same again: ok, nothing moved, the container untouched
    run(gpurig_cli, cpu_images, inv, "deploy", "--json", str(tmp_path / "again.json"))
    again = containers_of(report(tmp_path, "again.json"))["gpurig-slim"]
    assert (again["status"], again["action"], again["bytes_moved"]) == ("ok", "none", 0)
    assert clean_deploy_host.inspect("gpurig-slim")["Id"] == cid
    # a changed setting: --check --diff says so and changes nothing; then deploy recreates
    inv = deploy_inventory(entries({"variant": "slim", "cuda": "cpu", "shm_size": "4g"}))
    dry = run(gpurig_cli, cpu_images, inv, "deploy", "--check", "--diff")
    assert "would recreate" in dry.stdout and "2g" in dry.stdout and "4g" in dry.stdout
    assert clean_deploy_host.inspect("gpurig-slim")["Id"] == cid
    run(gpurig_cli, cpu_images, inv, "deploy", "--json", str(tmp_path / "changed.json"))
    assert containers_of(report(tmp_path, "changed.json"))["gpurig-slim"]["action"] == "recreate"
    assert clean_deploy_host.inspect("gpurig-slim")["Id"] != cid
    # status, logs, stop, rm
    status = run(gpurig_cli, cpu_images, inv, "status")
    assert "gpurig-slim" in status.stdout and "running" in status.stdout
    stopped = run(gpurig_cli, cpu_images, inv, "stop", "--name", "gpurig-slim", "--json", "-")
    assert json.loads(stopped.stdout)["hosts"][0]["status"] == "changed"
    assert not clean_deploy_host.inspect("gpurig-slim")["State"]["Running"]
    # stopping it again changes nothing: ok, saying so (seen: `changed` on every stop)
    again = json.loads(run(gpurig_cli, cpu_images, inv, "stop", "--name", "gpurig-slim", "--json", "-").stdout)["hosts"][0]
    assert (again["status"], again["reason"]) == ("ok", "gpurig-slim: already stopped"), again
    code = clean_deploy_host.inspect("gpurig-slim")["State"]["ExitCode"]
    assert f"exited (code {code})" in run(gpurig_cli, cpu_images, inv, "status").stdout
    nameless = run(gpurig_cli, cpu_images, inv, "rm", check_rc=2)
    assert "--all" in nameless.stderr and len(nameless.stderr.strip().splitlines()) == 1
    run(gpurig_cli, cpu_images, inv, "rm", "--name", "gpurig-slim")
    assert clean_deploy_host.inspect("gpurig-slim") is None


def test_a_save_load_fallback_says_why_in_the_output_and_in_the_json(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images, tmp_path):
    # seen: `deploy -v` said nothing while the image moved, and the recorded reason for save-load reached no output
    slim = cpu_images["slim"]
    bare(clean_deploy_host)
    inv = deploy_inventory(entries({"variant": "slim", "cuda": "cpu"}))
    # no docker-registry on PATH: the forward cannot be used (the engines are reached by socket and SSH)
    proc = gpurig_cli("deploy", "-v", "-i", str(inv), "--json", str(tmp_path / "deploy.json"),
                      env={"GPURIG_ROOT": str(cpu_images.project), "PATH": "/nonexistent"})
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    host = clean_deploy_host.name
    said = [line.removeprefix(f"{host}: ") for line in proc.stderr.splitlines() if line.startswith(f"{host}: ")]
    why = next(i for i, line in enumerate(said) if "no docker-registry on this machine" in line)
    assert "docker-registry package" in said[why]
    streaming = next(i for i, line in enumerate(said) if line.startswith(f"streaming {slim} by docker save | docker load"))
    assert said.index(f"image {slim}") < why < streaming  # each phase is said, in order, with its reason
    assert any(line.startswith(f"{slim}: ") and " of " in line for line in said[streaming:])  # and the bytes move
    assert "no docker-registry on this machine" in proc.stdout  # the table says why it was slow
    made = containers_of(report(tmp_path))["gpurig-slim"]
    assert made["delivery"] == "save-load"
    assert "no docker-registry on this machine" in made["delivery_note"] and "docker-registry package" in made["delivery_note"]


HOSTILE = "a b 'c' \"d\" $(id) `id` ; rm -rf /\nsecond line"


def test_env_values_and_volume_paths_arrive_literally(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images):
    cpu_images["slim"]
    source = "/srv/odd dir/$(id) 'q'"
    clean_deploy_host.host.docker("exec", clean_deploy_host.cid, "sh", "-c", 'mkdir -p "$1" && echo data > "$1/f"', "sh", source)
    inv = deploy_inventory(entries({
        "variant": "slim", "cuda": "cpu", "env": {"ODD": HOSTILE},
        "volumes": [{"source": source, "target": "/data/odd dir", "read_only": True}],
    }))
    run(gpurig_cli, cpu_images, inv, "deploy")
    env = clean_deploy_host.docker("exec", "gpurig-slim", "printenv", "ODD").stdout
    assert env == HOSTILE + "\n"
    assert clean_deploy_host.docker("exec", "gpurig-slim", "cat", "/data/odd dir/f").stdout == "data\n"
    mounts = clean_deploy_host.inspect("gpurig-slim")["Mounts"]
    assert any(m["Source"] == source and m["RW"] is False for m in mounts)


def test_jupyter_answers_with_the_printed_token_and_refuses_without(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images):
    cpu_images["slim"], cpu_images["jupyter"]
    inv = deploy_inventory(entries({"variant": "jupyter", "cuda": "cpu", "ports": ["0.0.0.0:8888:8888"]}))
    # not a terminal: the token stays out of the output unless asked for
    quiet = run(gpurig_cli, cpu_images, inv, "deploy").stdout
    assert "token=" not in quiet and "gpurig-entrypoint token" in quiet
    out = run(gpurig_cli, cpu_images, inv, "deploy", "--show-token").stdout
    url = next(word for word in out.split() if "/lab?token=" in word)
    token = url.split("token=", 1)[1]
    assert token not in clean_deploy_host.docker("logs", "gpurig-jupyter").stdout + clean_deploy_host.docker("logs", "gpurig-jupyter").stderr
    base = f"http://{host_ip(clean_deploy_host)}:8888"
    with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=30) as ok:
        assert ok.status == 200
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{base}/api/status", timeout=30)
    assert denied.value.code in (401, 403)
    # stopped, its last health check means nothing: status says how it ended (seen: "exited (unhealthy)")
    run(gpurig_cli, cpu_images, inv, "stop")
    status = run(gpurig_cli, cpu_images, inv, "status", "--format", "tsv").stdout
    [row] = [line.split("\t") for line in status.splitlines() if "gpurig-jupyter" in line]
    assert row[2].startswith("exited (code ") and "healthy" not in status, status
    doc = json.loads(run(gpurig_cli, cpu_images, inv, "status", "--json", "-").stdout)
    assert doc["containers"][clean_deploy_host.name][0]["health"] is None


def test_ssh_container_takes_the_inventorys_key(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images, host_key):
    cpu_images["slim"], cpu_images["ssh"]
    pub = host_key.with_suffix(".pub").read_text().strip()
    inv = deploy_inventory(entries({"variant": "ssh", "cuda": "cpu", "ssh_keys": [pub], "ports": ["0.0.0.0:2222:22"]}))
    out = run(gpurig_cli, cpu_images, inv, "deploy").stdout
    assert "ssh -p 2222 gpurig@" in out and "HostName" in out
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # the test's own throwaway client
    try:
        client.connect(host_ip(clean_deploy_host), port=2222, username="gpurig", key_filename=str(host_key),
                       allow_agent=False, look_for_keys=False, timeout=30)
        _, stdout, _ = client.exec_command("whoami")
        assert stdout.read().decode().strip() == "gpurig"
    finally:
        client.close()


def gpu_image(cpu_images, docker_engine, variant: str = "labelled") -> str:
    """The CPU slim image labelled as a CUDA 13 image (no GPU exists here: only the labels pre-flight reads differ)."""
    ref = f"{cpu_images.spec_name}:gpu-{variant}"
    docker_engine("build", "-q", "-t", ref, "--label", cpu_images.label, "--label", f"io.gpurig.test.variant={variant}", "-",
                  input=f"FROM {cpu_images['slim']}\nLABEL io.gpurig.min-driver=580.65.06 io.gpurig.cuda=13.0\n")
    cpu_images.built.append(ref)
    return ref


def test_two_users_each_get_only_their_gpus_and_overlaps_are_refused(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images, docker_engine):
    image = gpu_image(cpu_images, docker_engine)
    two = [{"image": image, "variant": "slim", "user": "alice", "gpus": [0]}, {"image": image, "variant": "slim", "user": "bob", "gpus": [1]}]
    run(gpurig_cli, cpu_images, deploy_inventory(entries(*two)), "deploy")
    for name, ids in (("gpurig-slim-alice", ["0"]), ("gpurig-slim-bob", ["1"])):
        [request] = clean_deploy_host.inspect(name)["HostConfig"]["DeviceRequests"]
        assert request["DeviceIDs"] == ids and request["Capabilities"] == [["gpu"]]
    overlap = [{**two[0], "gpus": [0, 1]}, two[1]]
    proc = run(gpurig_cli, cpu_images, deploy_inventory(entries(*overlap)), "deploy", check_rc=2)
    assert "share: true" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    missing = [{**two[0], "gpus": [7]}]
    proc = run(gpurig_cli, cpu_images, deploy_inventory(entries(*missing)), "deploy", "--json", "-", check_rc=1)
    assert "7" in reasons(proc) and clean_deploy_host.inspect("gpurig-slim-alice") is not None


def test_preflight_refusals_leave_the_host_untouched(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images, docker_engine, tmp_path):
    image = gpu_image(cpu_images, docker_engine, "refused")  # an image id no other test moves to the host
    before = set(clean_deploy_host.containers())
    # an old driver: both versions named, and the fix
    clean_deploy_host.set_driver("535.216.01")
    proc = run(gpurig_cli, cpu_images, deploy_inventory(entries({"image": image, "variant": "slim"})), "deploy", "--json", "-", check_rc=1)
    why = reasons(proc)
    assert "535.216.01" in why and "580.65.06" in why and "upgrade the driver to >= 580.65.06" in why
    assert clean_deploy_host.image_id(image) is None  # nothing moved
    clean_deploy_host.set_driver("580.95.05")
    # a busy host port (sshd holds 22 on every address)
    busy_port = deploy_inventory(entries({"variant": "slim", "cuda": "cpu", "ports": ["0.0.0.0:22:22"]}))
    proc = run(gpurig_cli, cpu_images, busy_port, "deploy", "--json", "-", check_rc=1)
    assert "host port 22 is in use" in reasons(proc)
    # no nvidia runtime
    with clean_deploy_host.without_nvidia_runtime():
        proc = run(gpurig_cli, cpu_images, deploy_inventory(entries({"image": image, "variant": "slim"})), "deploy", "--json", "-", check_rc=1)
    assert "no nvidia runtime" in reasons(proc) and "invoke provision" in reasons(proc)
    assert set(clean_deploy_host.containers()) == before


def test_a_container_that_exits_at_start_reports_its_code_and_last_lines(deploy_inventory, clean_deploy_host, gpurig_cli, cpu_images):
    cpu_images["slim"]
    inv = deploy_inventory(entries({"variant": "slim", "cuda": "cpu", "command": ["sh", "-c", "echo cannot find /data/train; exit 3"]}))
    proc = run(gpurig_cli, cpu_images, inv, "deploy", "--json", "-", check_rc=1)
    assert "exited with code 3" in reasons(proc) and "cannot find /data/train" in reasons(proc)
    # its logs, and status showing how it ended
    logs = run(gpurig_cli, cpu_images, inv, "logs", "gpurig-slim")
    assert logs.stdout.splitlines()[0] == "cannot find /data/train"
    status = run(gpurig_cli, cpu_images, inv, "status", "--json", "-")
    [found] = json.loads(status.stdout)["containers"][clean_deploy_host.name]
    assert found["name"] == "gpurig-slim" and found["exit_code"] == 3
    missing = run(gpurig_cli, cpu_images, inv, "logs", "no-such", check_rc=1)
    assert "no gpurig container named no-such" in missing.stdout + missing.stderr
