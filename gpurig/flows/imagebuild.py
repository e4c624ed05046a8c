"""Building images as `gpurig build` shows it: the rendered contexts, hadolint's verdicts, BuildKit's progress, the summary table.

The build task and the CI chain's build stage run the same code: the spec
is loaded and the flags are read by the caller; what is rendered, linted and
built, and what a person sees of it, is here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpurig.errors import LintError, SpecError, counted
from gpurig.report import console, outside
from gpurig.report.tables import Column

if TYPE_CHECKING:
    from rich.console import Console

    from gpurig.image.spec import ImageSpec

# The project's folders a build writes: the rendered contexts, and each image's build report (under builds/).
CONTEXTS_DIR = "build-contexts"
REPORTS_DIR = "reports"


def select(spec: ImageSpec, variant: str | None, torch: str | None, cuda: str | None, all_: bool):
    """(entries, variants) chosen by the flags: --all is everything, else the default entry and slim."""
    if all_:
        if torch or cuda or variant:
            raise SpecError("--all cannot be combined with --torch/--cuda/--variant", "drop --all or the others")
        return list(spec.matrix), list(spec.variants)
    if variant:
        spec.variant(variant)
    return [spec.entry(torch, cuda)], [variant or "slim"]

def lint_dockerfiles(root: Path, dockerfiles: list[Path], out: Console = console) -> None:
    """hadolint each Dockerfile; a LintError if any has a finding at or above the threshold."""
    from gpurig.image.lint import failing
    from gpurig.image.lint import lint as run_hadolint

    bad = 0
    for dockerfile in dockerfiles:
        findings = run_hadolint(dockerfile, root / ".hadolint.yaml")
        failed = failing(findings)
        bad += len(failed)
        name = dockerfile.parent.relative_to(root / CONTEXTS_DIR)
        out.print(f"{'[red]FAIL[/]' if failed else '[green]ok[/]  '} {name}")
        for finding in findings:
            out.print(f"      {outside(finding.code)} line {finding.line} ({outside(finding.level)}): {outside(finding.message)}")
    if bad:
        raise LintError(f"hadolint found {counted(bad, 'problem')} in {counted(len(dockerfiles), 'Dockerfile')}", "fix the templates")

def built_row(r: dict) -> tuple[str, ...]:
    """One built image's row of the build summary, from its build report."""
    from gpurig.deploy.progress import human_size

    return (" ".join([r["image"], *r["aliases"]]), r["torch"], r["cuda"], human_size(r["size_bytes"]), str(r["layers"]),
            f"{r['steps']['ran']}/{r['steps']['total']}", f"{r['duration_s']:.1f}s", r["digest"] or "-",
            "yes" if r.get("locked") else "no")

# The tables every task prints (gpurig.report.tables): at 80 columns the least needed go first, --format tsv has all.
BUILT_COLUMNS = (Column("image"), Column("torch"), Column("CUDA", key="cuda"), Column("size", drop=1), Column("layers", drop=4),
                 Column("steps run", drop=3), Column("time", drop=2), Column("digest", drop=5), Column("locked", drop=6))
