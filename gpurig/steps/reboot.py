"""The ``reboot`` step: only with --reboot, never on the machine gpurig runs on; waits (bounded) for the host to come back.

It reboots when the facts say a reboot is due: the packages asked for one
(/var/run/reboot-required), nouveau is blacklisted but still loaded, a
driver is installed but not loaded, or the loaded module and the userspace
library differ. Coming back is proved by a new boot id, not by a timer; the
caller gathers facts again and plans the steps once more.
"""

from __future__ import annotations

import shlex
import time
from functools import partial

from gpurig.connect.connection import CommandError, Connection
from gpurig.errors import GpurigError, HostError
from gpurig.facts import Facts
from gpurig.inventory.profile import HostProfile
from gpurig.steps.commands import Call
from gpurig.steps.driver import installed_driver, mismatch
from gpurig.steps.plan import Change, Plan, Step

# Detached, so the command returns before sshd goes down with the host.
REBOOT = "nohup sh -c 'sleep 2; systemctl reboot || reboot' >/dev/null 2>&1 &"
WAIT_S = 600.0
POLL_S = 5.0


def reboot_reasons(facts: Facts) -> list[str]:
    reasons = []
    if facts.system.reboot_required:
        reasons.append("packages asked for one (/var/run/reboot-required)")
    if facts.nouveau_loaded and facts.system.nouveau_blacklisted:
        reasons.append("nouveau is blacklisted but still loaded")
    if facts.pci_gpus and not facts.driver_version and installed_driver(facts):
        reasons.append("the NVIDIA driver is installed but not loaded")
    if mismatch(facts):
        reasons.append(mismatch(facts))
    return reasons


class RebootStep(Step):
    """A reboot when one is due and --reboot allows it."""

    name = "reboot"

    def __init__(self, allowed: bool = False, local_machine_id: str | None = None, wait_s: float = WAIT_S) -> None:
        self.allowed = allowed
        self.local_machine_id = local_machine_id
        self.wait_s = wait_s

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        reasons = reboot_reasons(facts)
        if not reasons:
            return Plan.ok("no reboot needed")
        why = "; ".join(reasons)
        if not self.allowed:
            return Plan.skip(f"reboot needed ({why}); run again with --reboot to let gpurig reboot it")
        if not facts.system.machine_id or not self.local_machine_id or facts.system.machine_id == self.local_machine_id:
            # Unknown on either side (no /etc/machine-id in a container or minimal image) cannot prove it is another machine.
            return Plan.fail(f"reboot needed ({why}), but this is the machine gpurig runs on and gpurig never reboots it",
                             "reboot it by hand")
        if not facts.system.boot_id:
            return Plan.fail(f"reboot needed ({why}), but the host's boot id is unknown, so its return could not be proved",
                             "reboot it by hand")
        wait = f"reboot and wait for the host to come back (at most {self.wait_s:.0f} s)"
        return Plan.change(f"reboot needed: {why}",
                           Change(wait, (Call(wait, partial(reboot_and_wait, old_boot=facts.system.boot_id, wait_s=self.wait_s)),)))


def reboot_and_wait(conn: Connection, *, old_boot: str, wait_s: float) -> None:
    """Reboot the host, then poll (bounded) until it answers with another boot id than ``old_boot``."""
    if conn.runs_here:
        raise HostError("this is the machine gpurig runs on (ansible_connection: local); gpurig never reboots it",
                        "reboot it by hand")
    came_back = f'test "$(cat /proc/sys/kernel/random/boot_id)" != {shlex.quote(old_boot)}'
    conn.admin(REBOOT)
    end = time.monotonic() + wait_s
    while time.monotonic() < end and not conn.closed:  # closed: Ctrl-C, stop waiting
        try:
            conn.run(came_back, timeout=15)
            return
        except CommandError:
            pass  # still the old boot: the reboot has not happened yet
        except GpurigError:
            pass  # down or refusing connections while it reboots
        time.sleep(POLL_S)  # polling interval between attempts to reach the host, not a synchronisation sleep
    raise HostError(f"the host did not come back within {wait_s:.0f} s of the reboot",
                    "check its console; run provision again once it answers")
