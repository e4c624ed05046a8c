"""Deploy's and rollout's lines on stderr while images move: every phase line (what a delivery does, and why that path), byte counts paced."""

from __future__ import annotations

from gpurig.report import err_console, outside


class ProgressPrinter:
    """Deploy's lines on stderr: every phase line (what a delivery does, and why that path), byte counts paced."""

    def __init__(self, every_s: float = 1.0) -> None:
        from gpurig.deploy.progress import CountPace

        self.pace = CountPace(every_s)

    def phase(self, host: str, text: str) -> None:
        self.pace.phase(host)
        err_console.print(f"{outside(host)}: {outside(text)}", highlight=False, soft_wrap=True)

    def count(self, host: str, done: int, total: int, text: str) -> None:
        if self.pace.allow(host, done, total):
            err_console.print(f"{outside(host)}: {outside(text)}", highlight=False, soft_wrap=True)
