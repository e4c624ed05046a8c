"""The ``python3`` step: the interpreter gpurig's own probes run with, on every host it provisions.

verify's host probe and monitor's sampler are Python files handed to the
host's ``python3`` on the command line (gpurig/connect/launcher.py); a
minimal Debian or Ubuntu server has none, so a host provision called
converged could not be verified or monitored. The step installs the
distribution's ``python3`` (nothing else: the probes need only its standard
library) where the facts found no python3 on the login user's PATH.
"""

from __future__ import annotations

from gpurig.facts import Facts
from gpurig.inventory.profile import HostProfile
from gpurig.steps.apt import install_command
from gpurig.steps.commands import Shell
from gpurig.steps.plan import Change, Plan, Step

WHY = "gpurig's verify and monitor run their probes with it"


class Python3Step(Step):
    """python3 on the host's PATH, for gpurig's probes."""

    name = "python3"

    def plan(self, facts: Facts, wanted: HostProfile) -> Plan:
        version = facts.system.python3
        if version:
            return Plan.ok(f"python3 {version} ({WHY})")
        return Plan.change(f"no python3 on the host ({WHY})",
                           Change("install python3 from the distribution", (Shell(install_command("python3")),)))
