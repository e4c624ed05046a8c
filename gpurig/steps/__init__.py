"""What a host should be: steps that plan from facts and apply only the difference, and ``converge`` over them.

One module per concern (``gpus``, ``driver``, ``docker``, ``toolkit``,
``daemon``, ``python3``, ``reboot``...); the model (``Step``, ``Plan``, ``Change``,
``StepResult``) in ``plan``, what a change runs (``Shell``, ``Upload``,
``Call``) in ``commands``, the diff of a file in ``hostfiles``, the package
commands in ``apt``. ``STEPS`` lists the steps by
name, in the order they run.
"""

from __future__ import annotations

from gpurig.steps.commands import Call, Shell, Upload
from gpurig.steps.converge import converge, converge_rebooting
from gpurig.steps.daemon import DaemonStep
from gpurig.steps.docker import DockerStep
from gpurig.steps.driver import DriverStep
from gpurig.steps.gpus import GpusStep, NouveauStep, PersistenceStep
from gpurig.steps.plan import Change, Plan, Step, StepResult
from gpurig.steps.python3 import Python3Step
from gpurig.steps.reboot import RebootStep
from gpurig.steps.safeguards import DriverHoldStep, FabricManagerStep, GpuDevicesStep, MigStep
from gpurig.steps.toolkit import ToolkitStep

STEPS: dict[str, type[Step]] = {
    s.name: s
    for s in (GpusStep, NouveauStep, DriverStep, DockerStep, ToolkitStep, DaemonStep, GpuDevicesStep, DriverHoldStep, FabricManagerStep,
              MigStep, PersistenceStep, Python3Step, RebootStep)
}

__all__ = [
    "STEPS", "Call", "Change", "DaemonStep", "DockerStep", "DriverHoldStep", "DriverStep", "FabricManagerStep", "GpuDevicesStep",
    "GpusStep", "MigStep", "NouveauStep", "PersistenceStep", "Plan", "Python3Step", "RebootStep", "Shell", "Step", "StepResult",
    "ToolkitStep", "Upload", "converge", "converge_rebooting",
]
