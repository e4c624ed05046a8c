"""Jinja templates + an ImageSpec -> one build-context directory per (matrix entry, variant)."""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from gpurig.config import project_id
from gpurig.errors import CompatError, RenderError
from gpurig.image import aliases, compat, lock, quoting
from gpurig.image.lock import Locks
from gpurig.image.spec import ImageSpec, MatrixEntry, Variant
from gpurig.strict.reader import read_text
from gpurig.strict.validate import excerpt, strip_userinfo

TEMPLATE_MAX_BYTES = 1024 * 1024  # the shipped templates are a few kB each

CONTEXT_META = "gpurig-context.json"
# Which project an image belongs to: the spec's name, the same in every copy of the project and with or
# without a registry (a build for --push must give the image id of the local build).
PROJECT_LABEL = "io.gpurig.project"
# Which project, where two chose the same spec name: the id `gpurig init` writes into gpurig.yaml (config.py).
# Not the project's path, which differs between clones of the same sources and would change the image id.
PROJECT_ID_LABEL = "io.gpurig.project-id"
# Variant files rendered from templates/files/<name>.j2 (or copied as they are), per feature.
_FILES = {
    "entrypoint.sh": "always",
    "profile.sh": "always",
    "sshd_config": "ssh",
    "jupyter_server_config.py": "jupyter",
    "healthcheck.py": "jupyter",
}


@dataclass(frozen=True)
class BuildContext:
    """A rendered build context: what `docker build` gets, and what the image will be called."""

    path: Path
    spec: ImageSpec
    entry: MatrixEntry
    variant: Variant
    image_ref: str
    aliases: tuple[str, ...]
    labels: dict
    wheelhouse: bool
    aliases_left: tuple[str, ...] = ()  # why an alias this build makes the tag of stays on another entry
    lock: lock.LockedImage | None = None  # what this build installs exactly (gpurig.image.lock), when locked
    lock_file: Path | None = None
    lock_inputs: dict = field(default_factory=dict)  # what decides what gets installed: a lock records it

    @property
    def dockerfile(self) -> Path:
        return self.path / "Dockerfile"


def environment(templates_dir: Path) -> jinja2.Environment:
    if not templates_dir.is_dir():
        raise RenderError(f"no templates directory at {templates_dir}", "run from the project root (where templates/ is)")
    return _environment(str(templates_dir.resolve()))


@functools.lru_cache(maxsize=8)
def _environment(templates_dir: str) -> jinja2.Environment:
    """One environment per templates/ folder: it keeps compiled templates (recompiled when a file changes)."""
    env = jinja2.Environment(
        loader=_BoundedLoader(templates_dir),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        # values are sealed (gpurig.image.quoting): they reach the output only through | sh, | dq or | word
        finalize=quoting.finalize,
    )
    env.filters.update(quoting.FILTERS)
    return env


class _BoundedLoader(jinja2.FileSystemLoader):
    """Jinja's file loader, reading each template through the bounded reader: a huge file is one line, not a read of it whole."""

    def get_source(self, environment: jinja2.Environment, template: str):
        pieces = jinja2.loaders.split_template_path(template)  # refuses ".." as Jinja's own loader does
        for folder in self.searchpath:
            filename = os.path.join(folder, *pieces)
            if os.path.isfile(filename):
                break
        else:
            raise jinja2.TemplateNotFound(template)
        mtime = os.path.getmtime(filename)
        text = read_text(filename, error=RenderError, what="template", fix_missing="restore it from the gpurig project",
                         limit=TEMPLATE_MAX_BYTES, kind="a template file", fix_large="a template is text: keep data out of it")
        return text, os.path.normpath(filename), lambda: os.path.isfile(filename) and os.path.getmtime(filename) == mtime


def _on_pypi(entry: MatrixEntry) -> bool:
    """Whether this is the build plain `pip install torch` gets from PyPI."""
    return entry.cuda == compat.torch_release(entry.torch).pypi_cuda


def torch_requirement(entry: MatrixEntry) -> str:
    """torch==X for the build PyPI serves by default, torch==X+cuXYZ (or +cpu) for the others."""
    if _on_pypi(entry):
        return f"torch=={entry.torch}"
    return f"torch=={entry.torch}+{entry.cuda_tag}"


def cuda_toolkit_requirement(entry: MatrixEntry) -> str:
    """NVIDIA's pip meta-package for nvcc, headers and the runtime of this CUDA release."""
    return f"cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]=={entry.cuda}.*"


def pip_options(spec: ImageSpec, wheelhouse: bool) -> list[str]:
    """pip's index and find-links options as words (the template quotes them): every pip install gets them.

    An offline build names no index at all (--no-index): pip reads only the
    wheelhouse and find_links URLs, so it never waits on an index it cannot reach.
    """
    build = spec.build
    options: list[str] = ["--no-index"] if build.offline else []
    if build.pip_index:
        options += ["--index-url", build.pip_index]
    for url in build.pip_extra_index:
        options += ["--extra-index-url", url]
    if wheelhouse:
        options += ["--find-links", "/wheelhouse"]
    for link in build.find_links:
        if "://" in link:
            options += ["--find-links", link]
    return options


def _git(project: Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(project), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def image_inputs(spec: ImageSpec, project: Path) -> list[str]:
    """What an image is made of, as paths in the project: templates/, checks/ and the spec file (when inside it)."""
    paths = ["templates", "checks"]
    try:
        paths.append(str(spec.path.resolve().relative_to(project.resolve())))
    except ValueError:
        pass
    return paths


def source_revision(spec: ImageSpec, project: Path) -> tuple[str, str]:
    """(revision, created) of the last commit that changed the image's inputs; ('', '') outside a git checkout.

    Not HEAD and not now: a commit elsewhere in the project, a copy of the
    checkout or a rebuild tomorrow give the same labels, so the image keeps
    its id. Uncommitted changes to the inputs mark the revision ``-dirty``.
    """
    paths = image_inputs(spec, project)
    revision, _, created = _git(project, "log", "-1", "--format=%H %cI", "--", *paths).partition(" ")
    if revision and _git(project, "status", "--porcelain", "--", *paths):
        revision += "-dirty"
    return revision, created


def image_labels(spec: ImageSpec, entry: MatrixEntry, variant: Variant, project: Path) -> dict[str, str]:
    """OCI and gpurig labels: the same for the same content, wherever the project lies (see source_revision).

    A value that is not known (no git checkout, no remote) is left out rather than made up from the
    machine or the directory, which would change the image id of identical content.
    """
    revision, created = source_revision(spec, project)
    if os.environ.get("SOURCE_DATE_EPOCH"):
        created = _epoch_to_iso(int(os.environ["SOURCE_DATE_EPOCH"]))
    # a remote's user:token@ must not be published with the image; an unprintable one is left out
    source = strip_userinfo(_git(project, "remote", "get-url", "origin"))
    optional = {
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.source": source if source.isprintable() else "",
    }
    return {
        "org.opencontainers.image.title": spec.name,
        "org.opencontainers.image.version": f"{entry.tag}-{variant.name}",
        **{key: value for key, value in optional.items() if value},
        "org.opencontainers.image.base.name": variant.base,
        PROJECT_LABEL: spec.name,
        **({PROJECT_ID_LABEL: ident} if (ident := project_id(project)) else {}),
        "io.gpurig.variant": variant.name,
        "io.gpurig.torch": entry.torch,
        "io.gpurig.cuda": entry.cuda,
        "io.gpurig.python": spec.python,
        "io.gpurig.min-driver": entry.min_driver or "none",
    }


def _epoch_to_iso(epoch: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat()


def check_renderable(entry: MatrixEntry, variant: Variant) -> None:
    """Raise CompatError for a (entry, variant) pair that cannot exist."""
    if not variant.builds_on(entry):
        raise CompatError(
            f"variant {variant.name} needs a CUDA build but {entry} has none",
            f"choose a CUDA entry for {variant.name}, e.g. --cuda 13.0",
        )


def local_wheelhouses(spec: ImageSpec) -> list[Path]:
    """find_links entries that are local directories (URLs are passed to pip as they are)."""
    dirs = []
    for link in spec.build.find_links:
        if "://" in link:
            continue
        path = Path(os.path.expanduser(link))
        if not path.is_dir():
            raise RenderError(
                f"{spec.path}: build.find_links names {excerpt(link)}, which is not a directory", "fix the path or remove it"
            )
        dirs.append(path)
    return dirs


def _fill_wheelhouse(target: Path, sources: list[Path]) -> None:
    """Hard-link (or copy) the wheels into the context: the build mounts them, no layer keeps them."""
    target.mkdir()
    for source in sources:
        for wheel in sorted(source.glob("*.whl")):
            dest = target / wheel.name
            if dest.exists():
                continue
            try:
                os.link(wheel, dest)
            except OSError:
                shutil.copy2(wheel, dest)


def render(
    spec: ImageSpec, entry: MatrixEntry, variant_name: str, project: Path, out_root: Path, locks: Locks | None = None
) -> BuildContext:
    """Render one build context into out_root/<name>/<tag>-<variant>, replacing any earlier one whole.

    With ``locks`` (the spec's lock file, read), a locked (entry, variant) installs what it locks, and a lock the
    spec no longer matches is refused before anything is written.
    """
    variant = spec.variant(variant_name)
    check_renderable(entry, variant)
    env = environment(project / "templates")
    wheelhouses = local_wheelhouses(spec)
    labels = image_labels(spec, entry, variant, project)
    image_ref = spec.image_ref(entry, variant.name)
    values = {
        "spec": spec,
        "build": spec.build,
        "entry": entry,
        "variant": variant,
        "image_ref": image_ref,
        # the shared part's packages are the same for every variant; a variant's own come after torch
        "apt_packages": ["ca-certificates", "python3", "python3-venv", "tini"],
        "variant_apt": list(variant.apt),
        "extra_pip": list(variant.pip),
        "torch_requirement": torch_requirement(entry),
        "torch_index": _torch_index(spec, entry, wheelhouses),
        "cuda_toolkit_requirement": None if entry.is_cpu else cuda_toolkit_requirement(entry),
        "require_cuda": compat.require_cuda(entry.cuda),
        "labels": labels,
        "services": [s for s, on in (("sshd", variant.kind.ssh), ("jupyterlab", variant.kind.jupyter)) if on],
        "pip_options": pip_options(spec, bool(wheelhouses)),
        "wheelhouse": bool(wheelhouses),
    }
    inputs = lock.inputs_of({**values, "python": spec.python, "base": variant.base})
    locked = locks.select(spec, entry, variant.name, inputs) if locks else None
    values.update(lock.template_values(locked, variant.base))
    final = out_root / spec.name / f"{entry.tag}-{variant.name}"
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        sealed = {name: quoting.seal(value) for name, value in values.items()}
        dockerfile = _render(env, f"{variant.name}.Dockerfile.j2", sealed)
        if locked and lock.IN_MOUNT not in dockerfile:  # a project's own templates from before locked builds
            raise RenderError(f"{locks.path if locks else 'the lock'} locks {entry.tag}-{variant.name}, but {project / 'templates'} "
                              "does not install from a lock", "take the lock-aware templates from `gpurig init NEWDIR`, or delete the lock")
        _write(staging / "Dockerfile", dockerfile)
        for name, feature in _FILES.items():
            if feature == "always" or getattr(variant.kind, feature):
                _write_file(env, project / "templates" / "files", name, staging, sealed)
        checks = project / "checks"
        if not checks.is_dir():
            raise RenderError(f"no checks directory at {checks}", "run from the project root (where checks/ is)")
        shutil.copytree(checks, staging / "checks", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if wheelhouses:
            _fill_wheelhouse(staging / "wheelhouse", wheelhouses)
        if locked:
            lock.write_context_files(staging / lock.IN_CONTEXT, locked)
        context = BuildContext(
            path=final,
            spec=spec,
            entry=entry,
            variant=variant,
            image_ref=image_ref,
            aliases=aliases.alias_refs(spec, entry, variant.name),
            aliases_left=aliases.aliases_left(spec, entry, variant.name),
            labels=labels,
            wheelhouse=bool(wheelhouses),
            lock=locked,
            lock_file=locks.path if locked and locks else None,
            lock_inputs=inputs,
        )
        meta = {
            "image": context.image_ref,
            "aliases": list(context.aliases),
            "aliases_left": list(context.aliases_left),
            "variant": variant.name,
            "torch": entry.torch,
            "cuda": entry.cuda,
            "labels": labels,
            "wheelhouse": context.wheelhouse,
            "locked": bool(locked),
        }
        _write(staging / CONTEXT_META, json.dumps(meta, indent=2) + "\n")
        _replace_dir(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return context


def _torch_index(spec: ImageSpec, entry: MatrixEntry, wheelhouses: list[Path]) -> str:
    """The extra index torch comes from; none when a local wheelhouse holds this torch wheel (pip would ask the
    index anyway, and wait on it where it cannot be reached), for an offline build, or for PyPI's own build."""
    if _on_pypi(entry) or not spec.build.torch_index or spec.build.offline:
        return ""
    wheel = torch_requirement(entry).replace("==", "-")
    if any(next(folder.glob(f"{glob.escape(wheel)}-*.whl"), None) for folder in wheelhouses):
        return ""
    return spec.build.torch_index.format(cuda_tag=entry.cuda_tag, cuda=entry.cuda)


def _render(env: jinja2.Environment, name: str, values: dict) -> str:
    try:
        return env.get_template(name).render(**values)
    except jinja2.TemplateNotFound as err:
        raise RenderError(f"template {err.name} not found in templates/", "restore it from the gpurig project") from None
    except jinja2.UndefinedError as err:
        raise RenderError(f"template {name}: {err.message}", "define the value or fix the template") from None
    except jinja2.TemplateSyntaxError as err:
        raise RenderError(f"template {err.name or name} line {err.lineno}: {err.message}", "fix the template") from None
    except RenderError as err:  # a quoting filter refused a value, or a value was emitted unquoted
        raise RenderError(f"template {_template_line(err, name)}: {err.problem}", err.fix) from None


def _template_line(err: BaseException, name: str) -> str:
    """'NAME line N' of the innermost template frame in err's traceback (Jinja maps frames to template lines)."""
    where = name
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(".j2"):
            where = f"{Path(tb.tb_frame.f_code.co_filename).name} line {tb.tb_lineno}"
        tb = tb.tb_next
    return where


def _write_file(env: jinja2.Environment, files: Path, name: str, staging: Path, values: dict) -> None:
    if (files / f"{name}.j2").is_file():
        text = _render(env, f"files/{name}.j2", values)
    elif (files / name).is_file():
        text = (files / name).read_text()
    else:
        raise RenderError(f"templates/files/{name} not found", "restore it from the gpurig project")
    _write(staging / name, text, mode=0o755 if name.endswith(".sh") else 0o644)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)


def _replace_dir(staging: Path, final: Path) -> None:
    """Swap the new context in; the old one is removed only after the new one is in place."""
    os.chmod(staging, 0o755)
    if final.exists():
        old = final.with_name(f".{final.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        staging.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(final)


def render_matrix(
    spec: ImageSpec, entries: list[MatrixEntry], variants: list[str], project: Path, out_root: Path, locks: Locks | None = None
) -> tuple[list[BuildContext], list[tuple[MatrixEntry, str, str]]]:
    """Render every (entry, variant); pairs that cannot exist are returned as skipped with the reason."""
    rendered, skipped = [], []
    for entry in entries:
        for name in variants:
            try:
                check_renderable(entry, spec.variant(name))
            except CompatError as err:
                skipped.append((entry, name, err.problem))
                continue
            rendered.append(render(spec, entry, name, project, out_root, locks))
    return rendered, skipped
