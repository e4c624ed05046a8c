"""Verification: run the probes in checks/ on hosts and in their containers, and turn their records into verdicts.

``runner.verify_host(conn, plan)`` is one host's run (host probe, toolkit,
container probe) as a ``HostVerdict``; ``junit.junit_xml`` writes a fleet's
verdicts for CI. The probes themselves are standalone scripts (checks/
verify_host.py, checks/verify_torch.py) that import nothing of gpurig.
"""

from gpurig.verify.records import STATUS_ORDER, HostVerdict, Record, worst_status
from gpurig.verify.runner import VerifyPlan, verify_host

__all__ = ["Record", "HostVerdict", "STATUS_ORDER", "worst_status", "VerifyPlan", "verify_host"]
