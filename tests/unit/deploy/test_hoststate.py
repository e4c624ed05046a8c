"""The one-command host read of deploy (listeners, volume sources, dockerd's limits) and the memlock pre-flight."""

from __future__ import annotations

from gpurig.deploy.fields import Ulimit
from gpurig.deploy.hoststate import SCRIPT, check_memlock, parse_host_state
from gpurig.facts.parsers import Disk

# The sections as the script prints them on a host whose dockerd lacks CAP_SYS_RESOURCE (a container host here).
OUTPUT = """\

@@gpurig-fact tcp
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 20531 1 0 100 0 0 10 0

@@gpurig-rc 0

@@gpurig-fact paths
y
n

@@gpurig-rc 0

@@gpurig-fact dockerd
Max locked memory         8388608              8388608              bytes
CapEff:\ta80425fb

@@gpurig-rc 0

@@gpurig-fact home
Filesystem     1024-blocks     Used Available Capacity Mounted on
overlay          264212084 58678084  47712828      56% /

@@gpurig-rc 0
"""


class Spec:
    name = "gpurig-slim"

    def __init__(self, *ulimits):
        self.ulimits = ulimits


def test_sections_are_read_in_order():
    state = parse_host_state(OUTPUT, ["/data/in", "/data/odd\nname"])
    assert state.listening == {("0.0.0.0", 22)}
    assert state.exists == {"/data/in": True, "/data/odd\nname": False}
    assert (state.memlock_hard, state.can_raise_limits) == (8388608, False)


def test_memlock_above_dockerds_limit_is_refused_only_when_dockerd_cannot_raise_it():
    state = parse_host_state(OUTPUT, [])
    [refusal] = check_memlock(Spec(Ulimit("memlock", -1, -1)), state)
    assert "8388608" in refusal.problem and "CAP_SYS_RESOURCE" in refusal.problem
    assert "memlock: 8388608" in refusal.fix and "LimitMEMLOCK=infinity" in refusal.fix
    assert check_memlock(Spec(Ulimit("memlock", 8388608, 8388608)), state) == []
    capable = parse_host_state(OUTPUT.replace("a80425fb", "000001ffffffffff"), [])
    assert capable.can_raise_limits is True and check_memlock(Spec(Ulimit("memlock", -1, -1)), capable) == []
    unlimited = parse_host_state(OUTPUT.replace("8388608              8388608", "unlimited            unlimited"), [])
    assert check_memlock(Spec(Ulimit("memlock", -1, -1)), unlimited) == []


def test_no_dockerd_section_means_unknown_not_refused():
    state = parse_host_state("\n@@gpurig-fact paths\n\n@@gpurig-rc 0\n\n@@gpurig-fact dockerd\n\n@@gpurig-rc 0\n", [])
    assert (state.memlock_hard, state.can_raise_limits) == (None, None)
    assert check_memlock(Spec(Ulimit("memlock", -1, -1)), state) == []


def test_the_script_names_no_path_itself():
    assert "$@" in SCRIPT and "echo \"$p\"" not in SCRIPT


def test_the_script_run_by_sh_reads_a_hostile_path_as_one_argument(tmp_path):
    import subprocess

    there = tmp_path / "odd\nname $(touch pwned)"
    there.mkdir()
    out = subprocess.run(["sh", "-c", SCRIPT, "sh", str(there), str(tmp_path / "missing")], capture_output=True, text=True, timeout=30).stdout
    assert parse_host_state(out, [str(there), "missing"]).exists == {str(there): True, "missing": False}
    assert not (tmp_path / "pwned").exists()


def test_the_login_users_homes_disk_is_read_where_a_serving_host_keeps_its_layer_cache():
    assert parse_host_state(OUTPUT, []).home == Disk("/", 264212084 * 1024, 47712828 * 1024)
    assert 'getent passwd "${SUDO_USER:-$(id -un)}"' in SCRIPT
    assert parse_host_state(OUTPUT.split("@@gpurig-fact home")[0], []).home is None  # an older answer: not known
