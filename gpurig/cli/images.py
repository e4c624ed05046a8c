"""Invoke tasks about images: matrix, render, lint, build, images."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpurig.cli.base import load_project_spec, project_root, project_spec_files, refuse_dry, task
from gpurig.config import choice
from gpurig.errors import LintError, SpecError
from gpurig.files import shown
from gpurig.report import console, err_console, outside
from gpurig.report.tables import FORMATS, Column, show

if TYPE_CHECKING:
    from rich.console import Console

    from gpurig.image.render import BuildContext

__all__ = ["matrix", "render", "lint", "build", "images"]

def render_selected(c, spec_file, variant, torch, cuda, all_, out: Console = console, relock: bool = False) -> list[BuildContext]:
    """Render what the flags select: from the spec's lock where it locks them, unless ``relock`` resolves afresh."""
    from gpurig.flows.imagebuild import CONTEXTS_DIR, select
    from gpurig.image.lock import Locks
    from gpurig.image.render import check_renderable, render_matrix

    spec = load_project_spec(c, spec_file)
    entries, variants = select(spec, variant, torch, cuda, all_)
    if not all_:
        # asked for by name, an impossible pair is an error; --all only skips it
        check_renderable(entries[0], spec.variant(variants[0]))
    root = project_root(c)
    locks = None if relock else Locks.of(spec)
    contexts, skipped = render_matrix(spec, entries, variants, root, root / CONTEXTS_DIR, locks)
    for entry, name, reason in skipped:
        out.print(f"[yellow]skipped[/] {entry.tag}-{name}: {outside(reason)}")
    for context in contexts:
        locked = f" (locked: {shown(context.lock_file, root)})" if context.lock_file else ""
        out.print(f"rendered {context.image_ref} -> {context.path.relative_to(root)}{locked}")
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
    from gpurig.flows.imagebuild import BUILT_COLUMNS, REPORTS_DIR, built_row, lint_dockerfiles

    refuse_dry(c, "build", "run `gpurig render` and `gpurig lint` to see what would be built")
    fmt = choice(format, FORMATS, "--format")
    out = console if fmt == "table" else err_console  # stdout holds only the summary a script reads
    from gpurig.image.build import refuse_credentials, resolve_ca_bundle
    from gpurig.image.dockercli import find_client
    from gpurig.image.pipeline import build_all
    from gpurig.report.buildprogress import BuildProgress

    labels = parse_labels(label or [])
    image_spec = load_project_spec(c, spec)
    refuse_credentials(image_spec.build)
    if push and not image_spec.registry:
        raise SpecError(f"{image_spec.path}: --push, but registry is empty", "set registry: HOST[:PORT]/PATH in the spec")
    client = find_client()
    contexts = render_selected(c, spec, variant, torch, cuda, all, out, relock=lock)
    root = project_root(c)
    lint_dockerfiles(root, [ctx.dockerfile for ctx in contexts], out)
    out.print(f"docker client {client.path} {client.version}" + (" (buildx)" if client.buildx else " (BuildKit built in)"))
    ca_bundle = resolve_ca_bundle(image_spec.build.ca_bundle)
    out.print(f"CA bundle: {ca_bundle} (passed as a build secret)" if ca_bundle else "CA bundle: none")
    with BuildProgress(root, out) as observer:
        results = build_all(client, image_spec, contexts, root / REPORTS_DIR, ca_bundle, labels, push, observer, relock=lock)
    show(console, BUILT_COLUMNS, [built_row(result.report) for result in results], fmt, title="built", schema="gpurig.build/1")


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

def image_row(image: dict) -> tuple[str, ...]:
    """One image's row of `gpurig images`, from the engine's inspect of it."""
    from gpurig.deploy.progress import human_size

    labels = (image.get("Config") or {}).get("Labels") or {}
    origin = labels.get("io.gpurig.image.baseimage.source", "")
    base = labels.get("org.opencontainers.image.base.name", "?")
    return (" ".join(image.get("RepoTags") or []), labels.get("io.gpurig.variant", "?"), labels.get("io.gpurig.torch", "?"),
            labels.get("io.gpurig.cuda", "?"), human_size(int(image.get("Size") or 0)), image.get("Created", "")[:10],
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
    from gpurig.image.build import project_images, unowned
    from gpurig.image.dockercli import find_client
    from gpurig.image.spec import load_spec

    fmt = choice(format, FORMATS, "--format")
    specs = [load_spec(spec)] if spec else [load_spec(f) for f in project_spec_files(c)]
    projects = sorted({s.name for s in specs})
    found = project_images(find_client(), projects, project_id(project_root(c)))
    if not found and fmt == "table":
        console.print(f"no images of {', '.join(projects)} in the local store; build one with `gpurig build`")
        return
    rows = [image_row(image) for image in found]
    show(console, IMAGE_COLUMNS, rows, fmt, title=f"images of {', '.join(projects)}", schema="gpurig.images/1")
    if any("bootstrapped" in row[-1] for row in rows) and fmt == "table":
        console.print("bootstrapped stand-in: no registry answered, so the base was made here with debootstrap "
                      "under the registry's name; `docker rmi` it to build on the registry's image.")
    old = [" ".join(i.get("RepoTags") or []) or i.get("Id", "?")[:19] for i in unowned(found)]
    if old and fmt == "table":
        err_console.print(f"no project id on {', '.join(old)}: built before gpurig labelled images with the project's id "
                          "(io.gpurig.project-id), so it may be another project's of the same name; build it again to label it",
                          markup=False, highlight=False)

