"""SSH targets from inventory vars + ~/.ssh/config + ProxyJump, and the hostile values that must never reach either."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import paramiko
import pytest

from gpurig.connect.connector import Connector
from gpurig.connect.ssh import SSHSettings
from gpurig.connect.target import TargetError, load_ssh_config, resolve_target
from gpurig.inventory import Host


def target(h: Host, config: Path | None = None):
    return resolve_target(h, load_ssh_config(config))


def test_ssh_config_fills_what_the_inventory_leaves_out(tmp_path):
    config = tmp_path / "config"
    config.write_text(
        "Host gpu-*\n  HostName 10.1.2.3\n  User alice\n  Port 2200\n  IdentityFile ~/.ssh/gpu_key\n  ProxyJump ops@bastion:2022\n"
        "Host bastion\n  HostName 192.0.2.10\n  IdentityFile /keys/bastion\n"
    )
    t = target(Host(name="gpu-1", groups=(), vars={}, address="gpu-1"), config)
    assert (t.hostname, t.port, t.user) == ("10.1.2.3", 2200, "alice")
    assert t.key_files == (str(Path("~/.ssh/gpu_key").expanduser()),)
    assert [(j.hostname, j.port, j.user, j.key_files) for j in t.jumps] == [("192.0.2.10", 2022, "ops", ("/keys/bastion",))]
    # Inventory vars win over the config, as ssh's command-line options do.
    t = target(Host(name="gpu-1", groups=(), vars={}, address="gpu-1", port=22, user="bob", key_file="/k"), config)
    assert (t.port, t.user, t.key_files[0]) == (22, "bob", "/k")


@pytest.mark.parametrize(
    "args,hops",
    [
        ("-J ops@b:2022", [("ops", "b", 2022)]),
        ("-o ProxyJump=b1,b2", [(None, "b1", 22), (None, "b2", 22)]),
        ("-o 'ProxyJump b'", [(None, "b", 22)]),
        ("-oProxyJump=b", [(None, "b", 22)]),
        ("-J ops@[::1]:2222", [("ops", "::1", 2222)]),
        ("-C -o Compression=yes", []),
        ("-o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=30 -q", []),
    ],
)
def test_proxy_jump_from_ansible_ssh_args(args, hops):
    t = target(Host(name="h", groups=(), vars={"ansible_ssh_common_args": args}, address="10.0.0.1", user="me"))
    assert [(j.user if "@" in args else None, j.hostname, j.port) for j in t.jumps] == hops


# --- hostile values ---------------------------------------------------------------------------

MATCH_EXEC_CONFIG = """\
Match exec "true %h"
  User matched
Host *
  IdentityFile /nonexistent/key
"""


def hostile_names(marker: Path) -> list[str]:
    """Host names each of which runs `touch MARKER` if it reaches a shell with %h expanded."""
    touch = f"touch${{IFS}}{marker}"
    return [
        f"x;{touch}",
        f"$({touch})",
        f"`{touch}`",
        f"x|{touch}",
        f"x&&{touch}",
        f"-oProxyCommand={touch}",
        f"x\n{touch}",
        f"x\x00;{touch}",
        f"x {touch}",
        f"x';{touch};'",
        f'x";{touch};"',
    ]


@pytest.fixture
def match_exec_config(tmp_path, monkeypatch) -> Path:
    # paramiko runs Match exec through invoke.run, which reads our stdin: give it an empty one under pytest.
    monkeypatch.setattr("sys.stdin", open(os.devnull))
    config = tmp_path / "ssh_config"
    config.write_text(MATCH_EXEC_CONFIG)
    return config


def test_the_match_exec_config_really_runs_commands_when_a_name_reaches_it(match_exec_config, tmp_path):
    """The oracle: paramiko's own lookup with a hostile name does run it (so the tests below can fail)."""
    marker = tmp_path / "oracle"
    paramiko.SSHConfig.from_path(str(match_exec_config)).lookup(f"x;touch${{IFS}}{marker}")
    assert marker.exists()


@pytest.mark.parametrize("var", ["ansible_host", "name", "ansible_user", "jump host", "jump user"])
def test_hostile_inventory_values_never_reach_the_ssh_config(match_exec_config, tmp_path, var):
    marker = tmp_path / "pwned"
    settings = SSHSettings(project_known_hosts=tmp_path / "kh", user_known_hosts=None, ssh_config=match_exec_config, connect_attempts=1)
    connector = Connector(settings)
    for evil in hostile_names(marker):
        if var == "ansible_host":
            h = Host(name="evil", groups=(), vars={"ansible_host": evil}, address=evil)
        elif var == "name":
            h = Host(name=evil, groups=(), vars={}, address=evil)
        elif var == "ansible_user":
            h = Host(name="evil", groups=(), vars={"ansible_user": evil}, address="127.0.0.1", user=evil)
        elif var == "jump host":
            h = Host(name="evil", groups=(), vars={"ansible_ssh_common_args": "-o " + shlex.quote(f"ProxyJump=ops@{evil}")}, address="127.0.0.1")
        else:
            h = Host(name="evil", groups=(), vars={"ansible_ssh_common_args": "-J " + shlex.quote(f"{evil}@bastion")}, address="127.0.0.1")
        with pytest.raises(TargetError) as err:
            connector.open(h).connect()
        message = str(err.value)
        assert "\n" not in message and "\x00" not in message, message
        assert message.startswith(f"{h.name}: ") or var == "name"
        expected_var = {"name": "inventory host name", "jump host": "jump host", "jump user": "user of jump host"}.get(var, var)
        assert expected_var in message, message
        rules = ("shell metacharacter", "whitespace or a control character", "starts with '-'", "is not a valid user name")
        assert any(rule in message for rule in rules), message
    assert not marker.exists()


def test_a_valid_name_still_gets_the_config(match_exec_config):
    assert target(Host(name="gpu-1", groups=(), vars={}, address="gpu-1.example.com"), match_exec_config).user == "matched"
    assert target(Host(name="v6", groups=(), vars={"ansible_host": "[2001:db8::1]"}, address="[2001:db8::1]", port=2222), None).hostname == "2001:db8::1"


def test_bad_port_names_the_var(tmp_path):
    with pytest.raises(TargetError, match=r"^h: ansible_port 0 is out of range"):
        target(Host(name="h", groups=(), vars={"ansible_port": 0}, address="10.0.0.1", port=0))
    with pytest.raises(TargetError, match=r"port of jump host 'b:99999'"):
        target(Host(name="h", groups=(), vars={"ansible_ssh_common_args": "-J b:99999"}, address="10.0.0.1"))


@pytest.mark.parametrize(
    "args,expected",
    [
        ("-o ProxyCommand='ssh -W %h:%p bastion'", "option 'ProxyCommand' is not supported"),
        ("-oProxyCommand=nc", "option 'ProxyCommand' is not supported"),
        ("-o StrictHostKeyChecking=no", "option 'StrictHostKeyChecking' is not supported"),
        ("-L 8080:localhost:80", "'-L' is not supported"),
        ("-o 'ProxyJump=b", "cannot be split into words: No closing quotation"),
        ("-J", "ends with -J and no value"),
        ("-o ProxyJump", "-o ProxyJump has no value"),
    ],
)
def test_ssh_args_gpurig_cannot_honour_are_refused_by_name(args, expected):
    for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        with pytest.raises(TargetError) as err:
            target(Host(name="h", groups=(), vars={var: args}, address="10.0.0.1"))
        assert str(err.value).startswith(f"h: {var}") and expected in str(err.value), str(err.value)


def test_a_proxy_command_in_the_ssh_config_is_refused_not_ignored(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host behind-*\n  ProxyCommand ssh -W %h:%p bastion\nHost direct\n  ProxyCommand none\n")
    with pytest.raises(TargetError, match="behind-1: the ssh config gives behind-1 a ProxyCommand"):
        target(Host(name="behind-1", groups=(), vars={}, address="behind-1"), config)
    assert target(Host(name="direct", groups=(), vars={}, address="direct"), config).hostname == "direct"
