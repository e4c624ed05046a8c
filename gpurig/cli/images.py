"""Invoke tasks about images: matrix, render, lint, build, images."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurig.cli.base import load_project_spec, project_root, project_spec_files, refuse_dry, task
from gpurig.config import choice
from gpurig.errors import LintError, SpecError
from gpurig.report import console, err_console
from gpurig.report.tables import FORMATS, Column, show

if TYPE_CHECKING:
    from gpurig.connect.engineinfo import ImageInfo

__all__ = ["matrix", "render", "lint", "build", "images"]

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
    from gpurig.flows.imagebuild import render_selected

    render_selected(load_project_spec(c, spec), project_root(c), variant, torch, cuda, all)


@task(help={"spec": SELECT_HELP["spec"]})
def lint(c, spec=None):
    """Run hadolint on every rendered Dockerfile (rules ignored, with reasons: .hadolint.yaml)."""
    from gpurig.flows.imagebuild import CONTEXTS_DIR, lint_dockerfiles

    root = project_root(c)
    dockerfiles = sorted((root / CONTEXTS_DIR).glob("*/*/Dockerfile"))
    if not dockerfiles:
        raise LintError("no rendered Dockerfiles in build-contexts/", "run `invoke render --all` first")
    lint_dockerfiles(root, dockerfiles)


FORMAT_HELP = "table (default) | tsv | json: how to print the result"


@task(help={"spec": SELECT_HELP["spec"], "format": FORMAT_HELP})
def matrix(c, spec=None, format="table"):
    """Show the versions matrix with the minimum host driver each image needs."""
    from gpurig.image import compat

    fmt = choice(format, FORMATS, "--format")
    image = load_project_spec(c, spec)
    columns = [
        Column("torch"), Column("CUDA", key="cuda"), Column("min driver"), Column("compat floor", drop=2), Column("tag", drop=1), Column("variants", drop=3)
    ]
    rows = []
    for entry in image.matrix:
        rows.append([
            entry.torch + (" *" if entry == image.default else ""),
            entry.cuda,
            entry.min_driver or "-",
            "-" if entry.is_cpu else compat.cuda_release(entry.cuda).compat_driver,
            entry.tag,
            " ".join(v for v in image.variants if not (entry.is_cpu and image.variants[v].kind.cuda_toolkit)),
        ])
    show(console, columns, rows, fmt, title=f"{image.name} ({image.path}), Python {image.python}", schema="gpurig.matrix/1")
    if fmt == "table":
        console.print(
            "* default. min driver: what NVIDIA_REQUIRE_CUDA enforces at `docker run`; compat floor: the oldest driver that "
            "still runs the image through CUDA minor-version compatibility (features needing a newer driver fail).",
            soft_wrap=False,
        )


BUILD_HELP = {
    **SELECT_HELP,
    "format": FORMAT_HELP + " (with tsv or json, the build's progress goes to stderr)",
    "push": "push every tag to the spec's registry and record the digest in the report",
    "label": "extra image label KEY=VALUE (repeatable), e.g. to find test images again",
    "lock": "resolve afresh and lock what each image installed (wheels with sha256, apt versions, the base) into "
            "the spec's .lock file beside it (images/pytorch.yaml.lock); without it, a locked image is built exactly from its lock",
}


@task(help=BUILD_HELP, iterable=["label"])
def build(c, variant=None, torch=None, cuda=None, all=False, push=False, spec=None, label=None, format="table", lock=False):
    """Render, lint and build images with BuildKit; write a JSON report per image under reports/ (and the lock with --lock)."""
    from gpurig.flows.imagebuild import build_images

    refuse_dry(c, "build", "run `gpurig render` and `gpurig lint` to see what would be built")
    fmt = choice(format, FORMATS, "--format")
    labels = parse_labels(label or [])
    build_images(load_project_spec(c, spec), project_root(c), variant=variant, torch=torch, cuda=cuda, all_=all, push=push, labels=labels,
                 fmt=fmt, lock=lock)


def parse_labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError(f"--label {pair!r} is not KEY=VALUE", "write e.g. --label team=ml")
        labels[key] = value
    return labels


IMAGE_COLUMNS = (Column("image"), Column("variant", drop=1), Column("torch"), Column("CUDA", key="cuda"), Column("size", drop=2),
                 Column("created", drop=3), Column("base", drop=4))


def image_row(image: ImageInfo) -> tuple[str, ...]:
    """One image's row of `gpurig images`, from the engine's inspect of it."""
    from gpurig.deploy.progress import human_size

    labels = image.labels
    origin = labels.get("io.gpurig.image.baseimage.source", "")
    base = labels.get("org.opencontainers.image.base.name", "?")
    return (" ".join(image.tags), labels.get("io.gpurig.variant", "?"), labels.get("io.gpurig.torch", "?"),
            labels.get("io.gpurig.cuda", "?"), human_size(image.size), image.created[:10],
            f"{base} ({BASE_ORIGINS.get(origin, origin or 'unknown')})")


# How each base came to be, as `gpurig images` explains it (the io.gpurig.image.baseimage.source label).
BASE_ORIGINS = {
    "pulled": "pulled",
    "local": "local",
    "bootstrapped": "bootstrapped stand-in",
}


@task(help={"spec": "image spec file (default: every spec in images/)", "format": FORMAT_HELP})
def images(c, spec=None, format="table"):
    """List this project's images in the local store: tags, variant, versions, size, and where the base came from."""
    from gpurig.config import project_id
    from gpurig.connect.engineopen import local_engine
    from gpurig.image.build import STORE_TIMEOUT_S, project_images, unowned
    from gpurig.image.spec import load_spec

    fmt = choice(format, FORMATS, "--format")
    specs = [load_spec(spec)] if spec else [load_spec(f) for f in project_spec_files(c)]
    projects = sorted({s.name for s in specs})
    with local_engine(timeout=STORE_TIMEOUT_S) as engine:
        found = project_images(engine, projects, project_id(project_root(c)))
    if not found and fmt == "table":
        console.print(f"no images of {', '.join(projects)} in the local store; build one with `gpurig build`")
        return
    rows = [image_row(image) for image in found]
    show(console, IMAGE_COLUMNS, rows, fmt, title=f"images of {', '.join(projects)}", schema="gpurig.images/1")
    if any("bootstrapped" in row[-1] for row in rows) and fmt == "table":
        console.print("bootstrapped stand-in: no registry answered, so the base was made here with debootstrap "
                      "under the registry's name; `docker rmi` it to build on the registry's image.")
    old = [" ".join(i.tags) or i.id[:19] for i in unowned(found)]
    if old and fmt == "table":
        err_console.print(f"no project id on {', '.join(old)}: built before gpurig labelled images with the project's id "
                          "(io.gpurig.project-id), so it may be another project's of the same name; build it again to label it",
                          markup=False, highlight=False)

