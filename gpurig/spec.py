"""images/*.yaml -> ImageSpec: validated once into frozen objects, or a SpecError naming file, key and fix."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpurig import compat
from gpurig.errors import CompatError, SpecError, did_you_mean


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
        repo = f"{self.registry.rstrip('/')}/{self.name}" if self.registry else self.name
        return f"{repo}:{entry.tag}-{variant}"

    def alias_refs(self, entry: MatrixEntry, variant: str) -> tuple[str, ...]:
        repo = self.image_ref(entry, variant).rsplit(":", 1)[0]
        fields = {"variant": variant, "torch": entry.torch, "cuda": entry.cuda, "cuda_tag": entry.cuda_tag}
        return tuple(f"{repo}:{alias.format(**fields)}" for alias in self.build.aliases)


# --- loading -------------------------------------------------------------------

_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_PYTHON = re.compile(r"^3\.\d+$")


class _Node:
    """A YAML value with its key path, so every error can say where it is."""

    def __init__(self, source: Path, path: str, value: Any) -> None:
        self.source, self.path, self.value = source, path, value

    def fail(self, problem: str, fix: str) -> SpecError:
        where = f"{self.source}: {self.path}" if self.path else str(self.source)
        return SpecError(f"{where}: {problem}", fix)

    def mapping(self, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, _Node]:
        if self.value is None:
            self.value = {}
        if not isinstance(self.value, dict):
            raise self.fail(f"expected a mapping, got {type(self.value).__name__}", f"write keys {', '.join(allowed)}")
        for key in self.value:
            if key not in allowed:
                raise self.fail(
                    f"unknown key {key!r}{did_you_mean(key, allowed)}", f"valid keys here: {', '.join(allowed)}"
                )
        for key in required:
            if key not in self.value:
                raise self.fail(f"missing key {key!r}", f"add {key}: ... (see images/pytorch.yaml)")
        return {k: _Node(self.source, f"{self.path}.{k}" if self.path else str(k), v) for k, v in self.value.items()}

    def text(self, pattern: re.Pattern | None = None, example: str = "") -> str:
        if isinstance(self.value, (int, float)) and not isinstance(self.value, bool):
            # YAML reads 3.10 as the float 3.1: refuse rather than guess
            raise self.fail(f"{self.value!r} is a number", f"quote it: \"{example or self.value}\"")
        if not isinstance(self.value, str):
            raise self.fail(f"expected a string, got {type(self.value).__name__}", f"write e.g. {example!r}")
        if pattern and not pattern.match(self.value):
            raise self.fail(f"{self.value!r} is not valid here", f"write e.g. {example!r}")
        return self.value

    def strings(self) -> tuple[str, ...]:
        if self.value is None:
            return ()
        if not isinstance(self.value, list) or not all(isinstance(v, str) for v in self.value):
            raise self.fail("expected a list of strings", "write e.g. [a, b]")
        return tuple(self.value)

    def ports(self) -> tuple[int, ...]:
        if not isinstance(self.value, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 for p in self.value
        ):
            raise self.fail("expected a list of port numbers (1-65535)", "write e.g. [22, 8888]")
        return tuple(self.value)


def load_spec(path: str | Path) -> ImageSpec:
    """Load and validate one image spec file."""
    source = Path(path)
    if not source.is_file():
        raise SpecError(f"image spec {source} not found", "run from the project root or pass --spec FILE")
    try:
        raw = yaml.safe_load(source.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SpecError(f"{source}:{where} is not valid YAML ({getattr(err, 'problem', err)})", "fix the syntax")
    if raw is None:
        raise SpecError(f"{source} is empty", "declare name, python, matrix and variants (see images/pytorch.yaml)")
    root = _Node(source, "", raw)
    top = root.mapping(
        ("name", "registry", "python", "matrix", "base", "user", "variants", "build"),
        required=("name", "python", "matrix"),
    )
    name = top["name"].text(_NAME, "pytorch")
    python = top["python"].text(_PYTHON, "3.11")
    base, bootstrap = _load_base(top.get("base"))
    found = compat.base_python(base)
    if found and found != python:
        raise top["python"].fail(
            f"base {base} installs Python {found}, not {python}", f"set python: \"{found}\" or choose another base"
        )
    matrix, default = _load_matrix(top["matrix"], python)
    return ImageSpec(
        path=source,
        name=name,
        registry=top["registry"].text() if "registry" in top and top["registry"].value else "",
        python=python,
        matrix=matrix,
        default=default,
        base=base,
        bootstrap=bootstrap,
        user=_load_user(top.get("user")),
        variants=_load_variants(top.get("variants"), base, python),
        build=_load_build(top.get("build")),
    )


def _load_base(node: _Node | None) -> tuple[str, Bootstrap | None]:
    if node is None:
        return "debian:bookworm-slim", Bootstrap("bookworm", "http://deb.debian.org/debian")
    keys = node.mapping(("image", "bootstrap"), required=("image",))
    image = keys["image"].text(example="debian:bookworm-slim")
    if "bootstrap" not in keys or keys["bootstrap"].value is False:
        return image, None
    boot = keys["bootstrap"].mapping(("suite", "mirror"), required=("suite",))
    mirror = boot["mirror"].text(example="http://deb.debian.org/debian") if "mirror" in boot else ""
    return image, Bootstrap(boot["suite"].text(example="bookworm"), mirror or "http://deb.debian.org/debian")


def _load_matrix(node: _Node, python: str) -> tuple[tuple[MatrixEntry, ...], MatrixEntry]:
    if not isinstance(node.value, list) or not node.value:
        raise node.fail("expected a non-empty list of {torch, cuda} entries", "write - {torch: \"2.14.1\", cuda: \"13.0\"}")
    entries, default = [], None
    for i, item in enumerate(node.value):
        row = _Node(node.source, f"{node.path}[{i}]", item)
        keys = row.mapping(("torch", "cuda", "default"), required=("torch", "cuda"))
        torch = keys["torch"].text(_VERSION, "2.14.1")
        cuda = keys["cuda"].text(re.compile(r"^(\d+\.\d+|cpu)$"), "12.8")
        try:
            compat.check_torch_cuda(torch, cuda)
            compat.check_python(torch, python)
        except CompatError as err:
            raise row.fail(err.problem, err.fix) from None
        entry = MatrixEntry(torch, cuda)
        if entry in entries:
            raise row.fail(f"{entry} is listed twice", "remove the duplicate")
        entries.append(entry)
        if "default" in keys:
            if not isinstance(keys["default"].value, bool):
                raise keys["default"].fail("expected true or false", "write default: true")
            if keys["default"].value:
                if default is not None:
                    raise keys["default"].fail("a second default entry", "mark exactly one entry default: true")
                default = entry
    return tuple(entries), default or entries[0]


def _load_user(node: _Node | None) -> User:
    if node is None:
        return User()
    keys = node.mapping(("name", "uid"))
    name = keys["name"].text(re.compile(r"^[a-z_][a-z0-9_-]{0,30}$"), "gpurig") if "name" in keys else "gpurig"
    uid = keys["uid"].value if "uid" in keys else 1000
    if not isinstance(uid, int) or isinstance(uid, bool) or not 1000 <= uid < 65534:
        raise keys["uid"].fail(f"uid {uid!r} is not a regular user id", "use a number from 1000 to 65533")
    if name == "root":
        raise keys["name"].fail("the image user must not be root", "choose another name, e.g. gpurig")
    return User(name, uid)


def _load_variants(node: _Node | None, base: str, python: str) -> dict[str, Variant]:
    if node is None:
        configured: dict[str, _Node] = {k: _Node(Path(), k, None) for k in VARIANT_KINDS}
    else:
        configured = node.mapping(tuple(VARIANT_KINDS))
        if not configured:
            raise node.fail("no variants listed", f"list some of {', '.join(VARIANT_KINDS)}")
    variants = {}
    for name, vnode in configured.items():
        kind = VARIANT_KINDS[name]
        keys = vnode.mapping(("base", "apt", "pip", "ports"))
        vbase = keys["base"].text(example="debian:bookworm-slim") if "base" in keys else base
        found = compat.base_python(vbase)
        if found and found != python:
            raise keys["base"].fail(f"{vbase} installs Python {found}, not {python}", "use a base with that Python")
        variants[name] = Variant(
            name=name,
            kind=kind,
            base=vbase,
            apt=kind.apt + (keys["apt"].strings() if "apt" in keys else ()),
            pip=kind.pip + (keys["pip"].strings() if "pip" in keys else ()),
            ports=keys["ports"].ports() if "ports" in keys else kind.ports,
        )
    return variants


def _load_build(node: _Node | None) -> BuildSettings:
    if node is None:
        return BuildSettings()
    keys = node.mapping(
        ("pip_index", "pip_extra_index", "find_links", "torch_index", "apt_mirror", "ca_bundle", "aliases", "syntax")
    )
    defaults = BuildSettings()

    def text(key: str, default: str) -> str:
        return keys[key].text() if key in keys and keys[key].value is not None else default

    aliases = keys["aliases"].strings() if "aliases" in keys else ()
    for alias in aliases:
        try:
            alias.format(variant="v", torch="t", cuda="c", cuda_tag="ct")
        except (KeyError, IndexError, ValueError):
            raise keys["aliases"].fail(
                f"alias {alias!r} uses an unknown field", "use only {variant}, {torch}, {cuda}, {cuda_tag}"
            ) from None
    return BuildSettings(
        pip_index=text("pip_index", defaults.pip_index),
        pip_extra_index=keys["pip_extra_index"].strings() if "pip_extra_index" in keys else (),
        find_links=keys["find_links"].strings() if "find_links" in keys else (),
        torch_index=text("torch_index", defaults.torch_index),
        apt_mirror=text("apt_mirror", defaults.apt_mirror),
        ca_bundle=text("ca_bundle", defaults.ca_bundle),
        aliases=aliases,
        syntax=text("syntax", defaults.syntax),
    )


def find_specs(images_dir: str | Path) -> list[Path]:
    """The spec files of a project's images/ directory."""
    folder = Path(images_dir)
    if not folder.is_dir():
        raise SpecError(f"no images directory at {folder}", "run from the project root (where images/ is) or pass --spec")
    files = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    if not files:
        raise SpecError(f"{folder} has no *.yaml image specs", "add one, e.g. images/pytorch.yaml")
    return files
