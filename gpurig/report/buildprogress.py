"""A build on a console: a live bar per image, one line per finished step, one line per image built.

Apart from gpurig.cli.images so that reading build's flags loads neither the build pipeline nor rich's progress bars.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpurig.errors import counted
from gpurig.files import shown
from gpurig.image.build import shorten
from gpurig.image.pipeline import BuildObserver
from gpurig.report import console, outside

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import TaskID

    from gpurig.image.render import BuildContext


class BuildProgress(BuildObserver):
    """The build on a console: a live bar per image, one line per finished step, one line per image built."""

    def __init__(self, root: Path, out: Console = console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.root, self.out = root, out
        self.progress = Progress(
            TextColumn("[bold]{task.fields[image]}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=out,
            transient=True,
        )
        self.task: TaskID | None = None  # the image being built: set by started(), which the pipeline calls first

    def __enter__(self) -> BuildProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def base(self, line: str) -> None:
        self.out.print(outside(line))

    def started(self, context: BuildContext) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task("starting", image=context.image_ref, total=None)

    def step(self, context: BuildContext, kind: str, step, parser) -> None:
        assert self.task is not None, "step() before started()"
        if kind == "start":
            self.progress.update(self.task, total=step.total, description=shorten(step.text, 60))
        elif kind == "done":
            finished = sum(1 for s in parser.steps.values() if s.state in ("cached", "done"))
            self.progress.update(self.task, completed=finished)
            outcome = "cached" if step.state == "cached" else f"{step.seconds:.1f}s" if step.state == "done" else step.state
            self.out.print(f"  \\[{step.number}/{step.total}] {outside(shorten(step.text, 80))} [dim]{outside(outcome)}[/]")

    def note(self, context: BuildContext, line: str) -> None:
        self.out.print(f"  {outside(line)}", highlight=False)

    def still_running(self, context: BuildContext, step, seconds: float) -> None:
        # the live bar is gone when the output is not a terminal: without this a long step is silence
        self.out.print(f"  still running: \\[{step.number}/{step.total}] {outside(shorten(step.text, 60))} [dim]({seconds:.0f}s)[/]")

    def pushing(self, context: BuildContext, refs: list[str]) -> None:
        self.out.print(f"pushing {', '.join(refs)}")

    def built(self, result) -> None:
        report = result.report
        steps = report["steps"]
        cache = " (full cache hit)" if not steps["ran"] else ""
        lock_file = shown(Path(report["lock_file"]), self.root) if report.get("lock_file") else ""
        # a full cache hit resolved nothing now: the lock holds what the cached layers resolved when they were built
        how = "resolved afresh" if steps["ran"] else "the cached build's versions"
        locked = f"locked (from {lock_file})" if report["locked"] else f"not locked: {how}, lock written to {lock_file}" \
            if lock_file else "not locked"
        self.out.print(
            f"[green]built[/] {result.context.image_ref} in {report['duration_s']:.1f}s: "
            f"{steps['ran']} of {counted(steps['total'], 'step')} ran{cache}; {outside(locked)}; report {result.report_path.relative_to(self.root)}"
        )
