"""CPU seconds that child processes used: a time limit the machine's other jobs cannot move, as they move wall time.

    with ChildCPU() as cpu:
        subprocess.run([...], timeout=60)     # the timeout still bounds the wall time
    assert cpu.seconds < 1.0

Counts every child this process reaped meanwhile (and the children they
reaped): run one command inside the block.
"""

from __future__ import annotations

import resource


def children_cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


class ChildCPU:
    def __enter__(self) -> ChildCPU:
        self.seconds = 0.0
        self._start = children_cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = children_cpu_seconds() - self._start
