"""What a host should be: steps that plan from facts and apply only the difference, and ``converge`` over them.

One module per concern (``daemon``...); the model (``Step``, ``Plan``,
``Change``, ``StepResult``) in ``model``, the file helper every step writes
with in ``files``. ``STEPS`` lists the steps by name, in the order they run.
"""

from __future__ import annotations

from gpurig.steps.converge import converge
from gpurig.steps.daemon import DaemonStep
from gpurig.steps.model import STEP_STATUSES, Admin, Change, Plan, Step, StepResult

STEPS: dict[str, type[Step]] = {"daemon": DaemonStep}

__all__ = ["STEPS", "STEP_STATUSES", "Admin", "Change", "DaemonStep", "Plan", "Step", "StepResult", "converge"]
