"""images/*.yaml -> ImageSpec: validated once into frozen objects, or a SpecError naming file, key and fix."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gpurig.errors import CompatError, SpecError, did_you_mean
from gpurig.image import compat
from gpurig.strict import validate, yamlio
from gpurig.strict.yamlnode import Check, Node


@dataclass(frozen=True)
class VariantKind:
    """What a variant is made of; the templates read these flags."""

    ssh: bool
    jupyter: bool
    cuda_toolkit: bool
    ports: tuple[int, ...]
    apt: tuple[str, ...] = ()
    pip: tuple[str, ...] = ()


JUPYTER_PIP = ("jupyterlab",)
SSH_APT = ("openssh-server",)

VARIANT_KINDS: dict[str, VariantKind] = {
    "slim": VariantKind(ssh=False, jupyter=False, cuda_toolkit=False, ports=()),
    "ssh": VariantKind(ssh=True, jupyter=False, cuda_toolkit=False, ports=(22,), apt=SSH_APT),
    "jupyter": VariantKind(ssh=False, jupyter=True, cuda_toolkit=False, ports=(8888,), pip=JUPYTER_PIP),
    "full": VariantKind(
        ssh=True,
        jupyter=True,
        cuda_toolkit=True,
        ports=(22, 8888),
        apt=SSH_APT + ("build-essential", "python3-dev", "git", "curl", "less", "procps", "vim-tiny"),
        pip=JUPYTER_PIP + ("nvitop", "ninja"),
    ),
}


@dataclass(frozen=True)
class MatrixEntry:
    """One (torch, CUDA) pair of the versions matrix; cuda is 'X.Y' or 'cpu'."""

    torch: str
    cuda: str

    @property
    def cuda_tag(self) -> str:
        return compat.cuda_tag(self.cuda)

    @property
    def is_cpu(self) -> bool:
        return self.cuda == compat.CPU

    @property
    def tag(self) -> str:
        return f"{self.torch}-{self.cuda_tag}"

    @property
    def min_driver(self) -> str | None:
        return compat.min_driver(self.cuda)

    def __str__(self) -> str:
        return f"torch {self.torch} + {'CPU' if self.is_cpu else 'CUDA ' + self.cuda}"


@dataclass(frozen=True)
class Variant:
    """A variant as configured: its kind plus the spec's options for it."""

    name: str
    kind: VariantKind
    base: str
    apt: tuple[str, ...]
    pip: tuple[str, ...]
    ports: tuple[int, ...]

    def builds_on(self, entry: MatrixEntry) -> bool:
        """Whether this variant can be built on ``entry`` (the CUDA toolkit needs a CUDA entry)."""
        return not (self.kind.cuda_toolkit and entry.is_cpu)


@dataclass(frozen=True)
class Bootstrap:
    """How to make the base locally (debootstrap + docker import) when no registry answers."""

    suite: str
    mirror: str


@dataclass(frozen=True)
class BuildSettings:
    pip_index: str = ""
    pip_extra_index: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    # pip reads only find_links (--no-index): a build that must never wait on an index
    offline: bool = False
    torch_index: str = "https://download.pytorch.org/whl/{cuda_tag}"
    apt_mirror: str = ""
    ca_bundle: str = "auto"
    aliases: tuple[str, ...] = ()
    syntax: str = ""


@dataclass(frozen=True)
class User:
    name: str = "gpurig"
    uid: int = 1000


@dataclass(frozen=True)
class ImageSpec:
    path: Path
    name: str
    registry: str
    python: str
    matrix: tuple[MatrixEntry, ...]
    default: MatrixEntry
    base: str
    bootstrap: Bootstrap | None
    user: User
    variants: dict[str, Variant] = field(hash=False)
    build: BuildSettings = BuildSettings()

    def variant(self, name: str) -> Variant:
        if name not in self.variants:
            raise SpecError(
                f"{self.path}: unknown variant {name!r}{did_you_mean(name, self.variants)}",
                f"choose one of {', '.join(self.variants)}",
            )
        return self.variants[name]

    def entry(self, torch: str | None = None, cuda: str | None = None) -> MatrixEntry:
        """The matrix entry selected by --torch/--cuda (either may be omitted), default if neither."""
        if torch is None and cuda is None:
            return self.default
        picked = [e for e in self.matrix if torch in (None, e.torch) and cuda in (None, e.cuda)]
        if not picked:
            if torch and cuda:
                compat.check_torch_cuda(torch, cuda)  # says why, if the pair cannot exist at all
            listed = ", ".join(f"{e.torch}/{e.cuda}" for e in self.matrix)
            raise SpecError(
                f"{self.path}: no matrix entry for torch={torch or 'any'} cuda={cuda or 'any'}",
                f"pick one of (torch/cuda) {listed}, or add it to the matrix",
            )
        if len(picked) > 1 and torch is None:
            picked = [e for e in picked if e.torch == self.default.torch] or picked
        return picked[0]

    def image_ref(self, entry: MatrixEntry, variant: str) -> str:
        """{registry}/{name}:{torch}-{cuda tag}-{variant}."""
        return self.tag_ref(f"{entry.tag}-{variant}")

    def tag_ref(self, tag: str) -> str:
        """A bare tag as a reference of this spec's image ({registry}/{name}:{tag}); a whole one (':', '/', '@') as given."""
        if any(ch in tag for ch in ":/@"):
            return tag
        repo = f"{self.registry.rstrip('/')}/{self.name}" if self.registry else self.name
        return f"{repo}:{tag}"


# --- loading -------------------------------------------------------------------
# Every value gets a type-specific check at load time (gpurig/strict/validate.py): what
# passes is what the templates may quote into a Dockerfile; the rest is refused
# with one line naming the file, the key path and the rule.

ALIAS_FIELDS = ("variant", "torch", "cuda", "cuda_tag")
TORCH_INDEX_FIELDS = ("cuda_tag", "cuda")


def _pattern(regex: str, rule: str) -> Check:
    """A check that ``regex`` matches the whole value (fullmatch: no trailing newline slips through)."""
    compiled = re.compile(regex, re.ASCII)  # \d is ASCII digits only: a version of '٢.٩.١' is no version
    return lambda value: None if validate.matches(compiled, value) else rule


_NAME = _pattern(r"[a-z0-9]+(?:[._-][a-z0-9]+)*", "is not an image name (lowercase letters and digits, joined by '.', '_' or '-')")
_VERSION = _pattern(r"\d{1,4}\.\d{1,4}\.\d{1,4}", "is not a version X.Y.Z")
_CUDA = _pattern(r"\d{1,3}\.\d{1,3}|cpu", "is not a CUDA version X.Y or cpu")
_PYTHON = _pattern(r"3\.\d{1,3}", "is not a Python version 3.X")
_USER_NAME = _pattern(r"[a-z_][a-z0-9_-]{0,30}", "is not a user name (lowercase letters, digits, '_', '-'; at most 31)")


def _source_url(value: str) -> str | None:
    """An http(s) URL pip or apt fetches from; its userinfo would be kept in the image's history."""
    problem = validate.url_problem(value)
    if problem is None and validate.strip_userinfo(value) != value:
        return "carries user:password@ (RUN lines are kept in the image's history)"
    return problem


def _find_links(value: str) -> str | None:
    return _source_url(value) if "://" in value else validate.find_links_problem(value)


def _ca_bundle(value: str) -> str | None:
    """auto, none, or a file; `docker build --secret id=ca,src=PATH` reads PATH as CSV, so no ',' or '"'."""
    if value in ("auto", "none"):
        return None
    if "," in value or '"' in value:
        return "contains ',' or '\"' (docker build --secret would read it as another field)"
    return validate.path_problem(value)


def _registry(value: str) -> str | None:
    return validate.registry_problem(value.rstrip("/"))


def _torch_index(value: str) -> str | None:
    """An index URL with an optional {cuda_tag} or {cuda} (validated once filled in)."""
    problem = validate.placeholders_problem(value, TORCH_INDEX_FIELDS)
    return problem or _source_url(value.format(cuda_tag="cu128", cuda="12.8"))


def load_spec(path: str | Path) -> ImageSpec:
    """Load and validate one image spec file."""
    source = Path(path)
    raw = yamlio.load_yaml(
        source, error=SpecError, what="image spec", fix_missing="run from the project root or pass --spec FILE",
        fix_large="point --spec at the image spec (a spec is a few KiB: name, python, matrix, variants)",
    )
    if raw is None:
        raise SpecError(f"{source} is empty", "declare name, python, matrix and variants (see images/pytorch.yaml)")
    top = Node(source, "", raw, SpecError).mapping(
        ("name", "registry", "python", "matrix", "base", "user", "variants", "build"),
        required=("name", "python", "matrix"),
    )
    name = top["name"].text(_NAME, "pytorch")
    if len(name) > 128:
        raise top["name"].fail(f"a name of {len(name)} characters (at most 128)", "choose a shorter name")
    python = top["python"].text(_PYTHON, "3.11")
    base, bootstrap = _load_base(top.get("base"))
    found = compat.base_python(base)
    if found and found != python:
        raise top["python"].fail(
            f"base {base} installs Python {found}, not {python}", f"set python: \"{found}\" or choose another base"
        )
    matrix, default = _load_matrix(top["matrix"], python)
    variants = _load_variants(top.get("variants"), base, python)
    build = _load_build(top.get("build"), matrix, variants)
    registry = top["registry"].optional_text(_registry, "registry.example.com:5000/ml") if "registry" in top else ""
    return ImageSpec(
        path=source,
        name=name,
        registry=registry,
        python=python,
        matrix=matrix,
        default=default,
        base=base,
        bootstrap=bootstrap,
        user=_load_user(top.get("user")),
        variants=variants,
        build=build,
    )


def _load_base(node: Node | None) -> tuple[str, Bootstrap | None]:
    if node is None:
        return "debian:bookworm-slim", Bootstrap("bookworm", "http://deb.debian.org/debian")
    keys = node.mapping(("image", "bootstrap"), required=("image",))
    image = keys["image"].text(validate.image_ref_problem, "debian:bookworm-slim")
    if "bootstrap" not in keys or keys["bootstrap"].value is False:
        return image, None
    boot = keys["bootstrap"].mapping(("suite", "mirror"), required=("suite",))
    suite = boot["suite"].text(validate.debian_suite_problem, "bookworm")
    default_mirror = "http://deb.debian.org/debian"
    mirror = boot["mirror"].optional_text(_source_url, default_mirror, default_mirror) if "mirror" in boot else default_mirror
    return image, Bootstrap(suite, mirror)


def _load_matrix(node: Node, python: str) -> tuple[tuple[MatrixEntry, ...], MatrixEntry]:
    rows = node.items('{torch: "2.14.1", cuda: "13.0"}')
    if not rows:
        raise node.fail("expected a non-empty list of {torch, cuda} entries", "write - {torch: \"2.14.1\", cuda: \"13.0\"}")
    entries: list[MatrixEntry] = []
    default = None
    for row in rows:
        keys = row.mapping(("torch", "cuda", "default"), required=("torch", "cuda"))
        torch = keys["torch"].text(_VERSION, "2.14.1")
        cuda = keys["cuda"].text(_CUDA, "12.8")
        try:
            compat.check_torch_cuda(torch, cuda)
            compat.check_python(torch, python)
        except CompatError as err:
            raise row.fail(err.problem, err.fix) from None
        entry = MatrixEntry(torch, cuda)
        if entry in entries:
            raise row.fail(f"{entry} is listed twice", "remove the duplicate")
        entries.append(entry)
        if "default" in keys and keys["default"].boolean("default: true"):
            if default is not None:
                raise keys["default"].fail("a second default entry", "mark exactly one entry default: true")
            default = entry
    return tuple(entries), default or entries[0]


def _load_user(node: Node | None) -> User:
    if node is None:
        return User()
    keys = node.mapping(("name", "uid"))
    name = keys["name"].text(_USER_NAME, "gpurig") if "name" in keys else "gpurig"
    if name == "root":
        raise keys["name"].fail("the image user must not be root", "choose another name, e.g. gpurig")
    if "uid" not in keys:
        return User(name)
    uid = keys["uid"].value
    if isinstance(uid, bool) or not isinstance(uid, int) or not 1000 <= uid < 65534:
        raise keys["uid"].fail(f"uid {validate.excerpt(uid)} is not a regular user id", "use a number from 1000 to 65533")
    return User(name, uid)


def _load_variants(node: Node | None, base: str, python: str) -> dict[str, Variant]:
    if node is None:
        configured: dict[str, Node] = {k: Node(Path(), k, None, SpecError) for k in VARIANT_KINDS}
    else:
        configured = node.mapping(tuple(VARIANT_KINDS))
        if not configured:
            raise node.fail("no variants listed", f"list some of {', '.join(VARIANT_KINDS)}")
    variants = {}
    for name, vnode in configured.items():
        kind = VARIANT_KINDS[name]
        keys = vnode.mapping(("base", "apt", "pip", "ports"))
        vbase = keys["base"].text(validate.image_ref_problem, "debian:bookworm-slim") if "base" in keys else base
        found = compat.base_python(vbase)
        if found and found != python:
            raise keys["base"].fail(f"{vbase} installs Python {found}, not {python}", "use a base with that Python")
        variants[name] = Variant(
            name=name,
            kind=kind,
            base=vbase,
            apt=kind.apt + (keys["apt"].strings(validate.debian_package_problem, "htop") if "apt" in keys else ()),
            pip=kind.pip + (keys["pip"].strings(validate.pip_requirement_problem, "gpustat") if "pip" in keys else ()),
            ports=keys["ports"].ports() if "ports" in keys else kind.ports,
        )
    return variants


def _load_build(node: Node | None, matrix: tuple[MatrixEntry, ...], variants: dict[str, Variant]) -> BuildSettings:
    if node is None:
        return BuildSettings()
    keys = node.mapping(
        ("pip_index", "pip_extra_index", "find_links", "offline", "torch_index", "apt_mirror", "ca_bundle", "aliases",
         "syntax")
    )
    defaults = BuildSettings()

    def text(key: str, check: Check, example: str, default: str = "") -> str:
        return keys[key].optional_text(check, example, default) if key in keys else default

    def strings(key: str, check: Check, example: str) -> tuple[str, ...]:
        return keys[key].strings(check, example) if key in keys else ()

    aliases = strings("aliases", lambda a: validate.placeholders_problem(a, ALIAS_FIELDS), "{variant}")
    for i, alias in enumerate(aliases):
        for entry in matrix:
            for variant in variants:
                tag = alias.format(variant=variant, torch=entry.torch, cuda=entry.cuda, cuda_tag=entry.cuda_tag)
                problem = validate.tag_problem(tag)
                if problem:
                    raise keys["aliases"].child(i, alias).fail(
                        f"makes the tag {validate.excerpt(tag)} for {entry.tag}-{variant}, which {problem}",
                        "use letters, digits, '_', '.', '-' around {variant}, {torch}, {cuda}, {cuda_tag}",
                    )
    find_links = strings("find_links", _find_links, "/opt/wheels")
    offline = keys["offline"].boolean("offline: true") if "offline" in keys else False
    if offline:
        _check_offline(keys, find_links)
    return BuildSettings(
        pip_index=text("pip_index", _source_url, "https://pypi.example.com/simple"),
        pip_extra_index=strings("pip_extra_index", _source_url, "https://pypi.example.com/simple"),
        find_links=find_links,
        offline=offline,
        # null or "" turns the torch index off (pip's own index only); offline builds name no index at all
        torch_index=""
        if offline
        else keys["torch_index"].optional_text(_torch_index, defaults.torch_index)
        if "torch_index" in keys
        else defaults.torch_index,
        apt_mirror=text("apt_mirror", _source_url, "http://mirror.example.com/debian"),
        ca_bundle=text("ca_bundle", _ca_bundle, "auto", defaults.ca_bundle),
        aliases=aliases,
        syntax=text("syntax", validate.image_ref_problem, "docker/dockerfile:1"),
    )


def _check_offline(keys: dict[str, Node], find_links: tuple[str, ...]) -> None:
    """offline: true reads only find_links: without one there is nothing to install from; an index beside it contradicts it."""
    if not find_links:
        raise keys["offline"].fail("is true but build.find_links is empty, so pip has nothing to install from",
                                   "add the wheelhouse to build.find_links, e.g. find_links: [/opt/wheels]")
    for key in ("pip_index", "pip_extra_index", "torch_index"):
        if key in keys and keys[key].value not in (None, "", []):
            raise keys[key].fail("names an index, but build.offline is true (pip reads only find_links)",
                                 f"remove build.{key}, or set offline: false")


def find_specs(images_dir: str | Path) -> list[Path]:
    """The spec files of a project's images/ directory."""
    folder = Path(images_dir)
    if not folder.is_dir():
        raise SpecError(f"no images directory at {folder}", "run from the project root (where images/ is) or pass --spec")
    files = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    if not files:
        raise SpecError(f"{folder} has no *.yaml image specs", "add one, e.g. images/pytorch.yaml")
    return files
