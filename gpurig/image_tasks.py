"""Invoke tasks about images: matrix, render, lint (and, later, build)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from gpurig import compat
from gpurig.cli import task
from gpurig.errors import LintError, SpecError
from gpurig.lint import failing, lint as run_hadolint
from gpurig.render import BuildContext, render_matrix
from gpurig.report import console
from gpurig.spec import ImageSpec, find_specs, load_spec

__all__ = ["matrix", "render", "lint"]

CONTEXTS_DIR = "build-contexts"


def project_root(c) -> Path:
    return Path(c.config.get("gpurig", {}).get("root", ".")).resolve()


def load_project_spec(c, spec: str | None) -> ImageSpec:
    """--spec FILE, or the one spec in images/."""
    if spec:
        return load_spec(spec)
    files = find_specs(project_root(c) / "images")
    if len(files) > 1:
        names = ", ".join(str(f) for f in files)
        raise SpecError(f"several image specs in images/ ({names})", "pick one with --spec FILE")
    return load_spec(files[0])


def select(spec: ImageSpec, variant: str | None, torch: str | None, cuda: str | None, all_: bool):
    """(entries, variants) chosen by the flags: --all is everything, else the default entry and slim."""
    if all_:
        if torch or cuda or variant:
            raise SpecError("--all cannot be combined with --torch/--cuda/--variant", "drop --all or the others")
        return list(spec.matrix), list(spec.variants)
    if variant:
        spec.variant(variant)
    return [spec.entry(torch, cuda)], [variant or "slim"]


def render_selected(c, spec_file, variant, torch, cuda, all_) -> list[BuildContext]:
    spec = load_project_spec(c, spec_file)
    entries, variants = select(spec, variant, torch, cuda, all_)
    root = project_root(c)
    contexts, skipped = render_matrix(spec, entries, variants, root, root / CONTEXTS_DIR)
    for entry, name, reason in skipped:
        console.print(f"[yellow]skipped[/] {entry.tag}-{name}: {reason}")
    for context in contexts:
        console.print(f"rendered {context.image_ref} -> {context.path.relative_to(root)}")
    return contexts


SELECT_HELP = {
    "spec": "image spec file (default: the one in images/)",
    "variant": "slim | full | ssh | jupyter (default: slim)",
    "torch": "torch version from the matrix (default: the matrix default)",
    "cuda": "CUDA version from the matrix, or cpu (default: the matrix default)",
    "all": "every matrix entry x every variant",
}


@task(help=SELECT_HELP)
def render(c, variant=None, torch=None, cuda=None, all=False, spec=None):
    """Render Dockerfiles and their build contexts into build-contexts/."""
    render_selected(c, spec, variant, torch, cuda, all)


@task(help={"spec": SELECT_HELP["spec"]})
def lint(c, spec=None):
    """Run hadolint on every rendered Dockerfile (rules ignored, with reasons: .hadolint.yaml)."""
    root = project_root(c)
    dockerfiles = sorted((root / CONTEXTS_DIR).glob("*/*/Dockerfile"))
    if not dockerfiles:
        raise LintError("no rendered Dockerfiles in build-contexts/", "run `invoke render --all` first")
    bad = 0
    for dockerfile in dockerfiles:
        findings = run_hadolint(dockerfile, root / ".hadolint.yaml")
        failed = failing(findings)
        bad += len(failed)
        name = dockerfile.parent.relative_to(root / CONTEXTS_DIR)
        console.print(f"{'[red]FAIL[/]' if failed else '[green]ok[/]  '} {name}")
        for finding in findings:
            console.print(f"      {finding.code} line {finding.line} ({finding.level}): {finding.message}")
    if bad:
        raise LintError(f"hadolint found {bad} problem(s) in {len(dockerfiles)} Dockerfile(s)", "fix the templates")


@task(help={"spec": SELECT_HELP["spec"]})
def matrix(c, spec=None):
    """Show the versions matrix with the minimum host driver each image needs."""
    image = load_project_spec(c, spec)
    table = Table(title=f"{image.name} ({image.path}), Python {image.python}")
    for column in ("torch", "CUDA", "min driver", "compat floor", "tag", "variants"):
        table.add_column(column, no_wrap=column != "variants")
    for entry in image.matrix:
        table.add_row(
            entry.torch + (" *" if entry == image.default else ""),
            entry.cuda,
            entry.min_driver or "-",
            "-" if entry.is_cpu else compat.cuda_release(entry.cuda).compat_driver,
            entry.tag,
            " ".join(v for v in image.variants if not (entry.is_cpu and image.variants[v].kind.cuda_toolkit)),
        )
    console.print(table)
    console.print(
        "* default. min driver: what NVIDIA_REQUIRE_CUDA enforces at `docker run`; compat floor: the oldest driver that "
        "still runs the image through CUDA minor-version compatibility (features needing a newer driver fail)."
    )


