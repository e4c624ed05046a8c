"""The CLI's shared habits, run as a user would: config layers, -i/-l/-f, --format, bad values, pipes, init, exec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_cli import assert_one_line_error

ROOT = Path(__file__).resolve().parents[2]
CODE = "import sys; from gpurig.cli import main; main(sys.argv)"


def run(cwd: Path, *args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """`gpurig ARGS` in ``cwd`` with HOME in tmp and no GPURIG_* from the caller's shell."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPURIG_")}
    base.update({"HOME": str(cwd), "COLUMNS": "200"}, **(env or {}))
    return subprocess.run([sys.executable, "-c", CODE, *args], cwd=cwd, env=base, capture_output=True, text=True, timeout=120, **kw)


def local_inventory(path: Path, names=("l1", "l2")) -> Path:
    data = {"all": {"hosts": {n: {"ansible_connection": "local"} for n in names}, "children": {"odd": {"hosts": {names[0]: None}}}}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def example(tmp_path) -> Path:
    """A directory holding only a copy of the shipped example inventory (with ssh hosts under example.invalid)."""
    (tmp_path / "inventory").mkdir()
    (tmp_path / "inventory" / "hosts.yaml").write_text((ROOT / "inventory" / "hosts.yaml").read_text())
    (tmp_path / "gpurig.yaml").write_text("")
    return tmp_path


def test_the_shipped_inventory_never_names_a_routable_host():
    inv = yaml.safe_load((ROOT / "inventory" / "hosts.yaml").read_text())
    text = json.dumps(inv)
    assert "10.0." not in text and "example.net" not in text
    from gpurig.inventory import load_inventory

    for host in load_inventory(ROOT / "inventory" / "hosts.yaml").hosts.values():
        assert host.is_local or host.address.endswith(".example.invalid"), host
        jump = host.var("ansible_ssh_common_args", "")
        assert not jump or jump.endswith(".example.invalid")


def test_limit_narrows_and_host_group_pattern_narrow_with_it(example):
    proc = run(example, "hosts", "-l", "gpu", "--host", "h100-01", "--format", "tsv")
    assert proc.returncode == 0, proc.stderr
    assert [line.split("\t")[0] for line in proc.stdout.splitlines()[1:]] == ["h100-01"]
    proc = run(example, "hosts", "-l", "all:!a100-01", "-l", "a100*", "--format", "tsv")
    assert [line.split("\t")[0] for line in proc.stdout.splitlines()[1:]] == ["a100-02"]
    assert_one_line_error(run(example, "hosts", "-l", "a100", "--group", "h100"), "matches no host")


def test_gpurig_works_from_a_subdirectory_and_reads_the_projects_config(example):
    other = local_inventory(example / "fleet" / "lab.yaml")
    (example / "gpurig.yaml").write_text("inventory: fleet/lab.yaml\n")
    sub = example / "fleet" / "deeper"
    sub.mkdir()
    proc = run(sub, "hosts", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["inventory"] == str(other) and [r["host"] for r in doc["rows"]] == ["l1", "l2"]
    # the environment overrides the project file, and -i overrides both
    local_inventory(sub / "env.yaml", ("e1",))
    proc = run(sub, "hosts", "--format", "tsv", env={"GPURIG_INVENTORY": "env.yaml"})
    assert proc.stdout.splitlines()[1].startswith("e1\t")
    proc = run(sub, "hosts", "--format", "tsv", "-i", str(example / "inventory" / "hosts.yaml"), env={"GPURIG_INVENTORY": "env.yaml"})
    assert "a100-01" in proc.stdout


@pytest.mark.parametrize(
    "args,env,fragments",
    [
        (["facts", "--forks", "abc"], {}, ["--forks 'abc' is not a whole number"]),
        (["facts", "-f", "0"], {}, ["--forks 0 is below 1"]),
        (["facts", "--connect-timeout", "-1"], {}, ["--connect-timeout -1 is out of range"]),
        (["facts"], {"GPURIG_FORKS": "abc"}, ["$GPURIG_FORKS 'abc' is not a whole number"]),
        (["facts", "--host-key-policy", "strickt"], {}, ["did you mean 'strict'"]),
        (["hosts", "--format", "xml"], {}, ["--format 'xml' is not valid", "table, tsv, json"]),
        (["hosts", "-l", "a100-1"], {}, ["did you mean 'a100-01'"]),
        (["exec", "-l", "localhost"], {}, ["no command given", "gpurig exec -l PATTERN -- COMMAND"]),
        (["init", "."], {}, ["already has inventory, gpurig.yaml"]),
    ],
)
def test_bad_values_give_one_line_before_any_host_is_contacted(example, args, env, fragments):
    assert_one_line_error(run(example, *args, env=env), *fragments)


def test_facts_json_to_stdout_is_the_only_stdout(example):
    inv = local_inventory(example / "local.yaml")
    proc = run(example, "facts", "-i", str(inv), "--json", "-")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "gpurig.facts/1" and doc["inventory"] == str(inv) and doc["gpurig_version"]
    assert [h["host"] for h in doc["hosts"]] == ["l1", "l2"] and doc["hosts"][0]["data"]["os"]["id"] == "debian"
    assert "l1 : ok=1 changed=0 unreachable=0 failed=0 skipped=0" in proc.stderr


def test_facts_in_a_project_judge_hosts_by_the_default_image(example):
    for name in ("images", "templates"):
        (example / name).symlink_to(ROOT / name)
    inv = local_inventory(example / "local.yaml", ("l1",))
    proc = run(example, "facts", "-i", str(inv), "--format", "json")
    doc = json.loads(proc.stdout)
    assert doc["image"]["cuda"] == "13.0" and doc["lacks"]["l1"][0] == "no NVIDIA GPU"  # this machine has none
    table = run(example, "facts", "-i", str(inv), env={"COLUMNS": "80"}).stdout
    assert "verdict" in table and "NVIDIA" in table
    assert all(len(line.rstrip()) <= 80 for line in table.splitlines()) and "…" not in table


def test_exec_runs_on_each_local_host_and_fails_when_one_does(example):
    inv = local_inventory(example / "local.yaml")
    proc = run(example, "exec", "-i", str(inv), "--json", "out.json", "--", 'echo "hi from $0"; [ "$(hostname)" ] && exit 3')
    assert proc.returncode == 1
    assert "hi from" in proc.stdout and " 3 " in proc.stdout
    doc = json.loads((example / "out.json").read_text())
    assert doc["schema"] == "gpurig.exec/1" and doc["summary"]["failed"] == 2
    assert doc["hosts"][0]["data"]["rc"] == 3 and "hi from" in doc["hosts"][0]["data"]["stdout"]
    ok = run(example, "exec", "-i", str(inv), "-l", "odd", "--format", "tsv", "--", "echo", "fine")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[1:] == ["l1\tok\t0\tfine\t"]


def test_check_and_dry_run_nothing(example):
    inv = local_inventory(example / "local.yaml", ("l1",))
    marker = example / "touched"
    for flags in (["exec", "--check"], ["--dry", "exec"]):
        proc = run(example, *flags, "-i", str(inv), "--", f"touch {marker}")
        assert proc.returncode == 0, proc.stderr
        assert "skipped" in proc.stdout and not marker.exists()


def test_dry_is_refused_by_tasks_without_a_check_mode(example):
    # `--dry build` used to build (and --push to push): a task that cannot dry-run says so and does nothing.
    proc = run(example, "--dry", "build", "--push")
    assert proc.returncode != 0 and "--dry: build has no check mode" in proc.stderr
    assert not (example / "build-contexts").exists()
    assert run(example, "--dry", "init", "newproj").returncode != 0 and not (example / "newproj").exists()


def test_verbosity_levels_are_flags(example):
    inv = local_inventory(example / "local.yaml", ("l1",))
    assert run(example, "exec", "-vv", "-i", str(inv), "--", "true").returncode == 0
    help_text = run(example, "facts", "--help").stdout
    for flag in ("-i STRING, --inventory", "-l, --limit", "-f STRING, --forks", "-v, --verbose "):
        assert flag in help_text, help_text


def test_a_reader_that_goes_away_gets_no_traceback(example):
    for args in (["hosts"], ["--help"], ["hosts", "--format", "tsv"]):
        proc = subprocess.Popen(
            [sys.executable, "-c", CODE, *args], cwd=example, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "HOME": str(example)},
        )
        proc.stdout.close()  # like `| head -0`: the pipe is closed before gpurig writes
        err = proc.stderr.read().decode()
        proc.wait(timeout=60)
        assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_init_makes_a_project_that_renders(tmp_path):
    proc = run(tmp_path, "init", "newproj")
    assert proc.returncode == 0, proc.stderr
    project = tmp_path / "newproj"
    for name in ("images/pytorch.yaml", "templates/Dockerfile.j2", "checks/verify_torch.py", "inventory/hosts.yaml", ".hadolint.yaml",
                 "tasks.py", "gpurig.yaml"):
        assert (project / name).is_file(), name
    assert not (project / "inventory" / "known_hosts").exists()
    rendered = run(project / "templates", "render")  # from a subdirectory of the new project
    assert rendered.returncode == 0, rendered.stderr
    assert (project / "build-contexts/pytorch/2.14.1-cu130-slim/Dockerfile").is_file()


def test_init_makes_a_project_where_invoke_runs_the_same_tasks(tmp_path):
    # `invoke build --variant slim` in a new project said "Can't find any collection named 'tasks'": init wrote no tasks.py
    assert run(tmp_path, "init", "newproj").returncode == 0
    project = tmp_path / "newproj"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPURIG_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), COLUMNS="200")

    def invoke(*args: str, cwd: Path = project) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)

    listed = invoke("--list")
    assert listed.returncode == 0 and all(t in listed.stdout for t in ("build", "provision", "matrix", "verify")), listed.stderr
    shown = invoke("matrix", cwd=project / "inventory")  # from a subdirectory too, as gpurig
    assert shown.returncode == 0 and shown.stdout == run(project, "matrix").stdout, shown.stderr
    hosts = invoke("hosts", "--format", "tsv")
    assert hosts.returncode == 0 and "example.invalid" in hosts.stdout, hosts.stderr


def test_init_never_replaces_a_tasks_py_of_your_own(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "tasks.py").write_text("# my own tasks\n")
    proc = run(tmp_path, "init", "mine")
    assert_one_line_error(proc, "already has tasks.py", "init into a new directory")
    assert sorted(p.name for p in mine.iterdir()) == ["tasks.py"] and (mine / "tasks.py").read_text() == "# my own tasks\n"
