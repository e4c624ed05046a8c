"""Building images as `gpurig build` shows it: the rendered contexts, hadolint's verdicts, BuildKit's progress, the summary table.

The build task and the CI chain's build stage run the same code: the spec
is loaded and the flags are read by the caller; what is rendered, linted and
built, and what a person sees of it, is here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpurig.errors import LintError, SpecError, counted
from gpurig.files import shown
from gpurig.report import console, err_console, outside
from gpurig.report.tables import Column, show

if TYPE_CHECKING:
    from rich.console import Console

    from gpurig.image.render import BuildContext
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


def render_selected(spec: ImageSpec, root: Path, variant, torch, cuda, all_, out: Console = console, relock: bool = False) -> list[BuildContext]:
    """Render what the flags select: from the spec's lock where it locks them, unless ``relock`` resolves afresh."""
    from gpurig.image.lock import Locks
    from gpurig.image.render import check_renderable, render_matrix

    entries, variants = select(spec, variant, torch, cuda, all_)
    if not all_:
        # asked for by name, an impossible pair is an error; --all only skips it
        check_renderable(entries[0], spec.variant(variants[0]))
    locks = None if relock else Locks.of(spec)
    contexts, skipped = render_matrix(spec, entries, variants, root, root / CONTEXTS_DIR, locks)
    for entry, name, reason in skipped:
        out.print(f"[yellow]skipped[/] {entry.tag}-{name}: {outside(reason)}")
    for context in contexts:
        locked = f" (locked: {shown(context.lock_file, root)})" if context.lock_file else ""
        out.print(f"rendered {context.image_ref} -> {context.path.relative_to(root)}{locked}")
    return contexts


def build_images(image_spec: ImageSpec, root: Path, *, variant=None, torch=None, cuda=None, all_=False, push=False,
                 labels: dict[str, str] | None = None, fmt: str = "table", lock=False) -> None:
    """Render, lint and build what the flags select with BuildKit, a JSON report per image under ``root``'s reports/; the summary
    table on stdout in ``fmt`` (with tsv or json, the progress goes to stderr). ``lock``: resolve afresh and write the lock."""
    out = console if fmt == "table" else err_console  # stdout holds only the summary a script reads
    from gpurig.connect.engineopen import local_engine
    from gpurig.image.build import STORE_TIMEOUT_S, refuse_credentials, resolve_ca_bundle
    from gpurig.image.dockercli import find_client
    from gpurig.image.pipeline import build_all
    from gpurig.report.buildprogress import BuildProgress

    refuse_credentials(image_spec.build)
    if push and not image_spec.registry:
        raise SpecError(f"{image_spec.path}: --push, but registry is empty", "set registry: HOST[:PORT]/PATH in the spec")
    client = find_client()
    contexts = render_selected(image_spec, root, variant, torch, cuda, all_, out, relock=lock)
    lint_dockerfiles(root, [ctx.dockerfile for ctx in contexts], out)
    out.print(f"docker client {client.path} {client.version}" + (" (buildx)" if client.buildx else " (BuildKit built in)"))
    ca_bundle = resolve_ca_bundle(image_spec.build.ca_bundle)
    out.print(f"CA bundle: {ca_bundle} (passed as a build secret)" if ca_bundle else "CA bundle: none")
    with local_engine(timeout=STORE_TIMEOUT_S) as engine, BuildProgress(root, out) as observer:
        results = build_all(client, engine, image_spec, contexts, root / REPORTS_DIR, ca_bundle, labels or {}, push, observer, relock=lock)
    show(console, BUILT_COLUMNS, [built_row(result.report) for result in results], fmt, title="built", schema="gpurig.build/1")


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
