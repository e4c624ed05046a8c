"""Which build an alias tag names: the one matrix entry it follows, and a line whenever one moves or stays.

An alias such as ``{variant}`` makes the same tag for several entries of the
versions matrix; building each in turn would move it between them (building
the CPU slim took ``pytorch:slim`` off the CUDA image, silently). Such a tag
follows the matrix's default entry, or the first entry that can build the
variant when the default cannot; a build of another entry leaves it where it
is and says so. A tag only one entry makes is that entry's. Whatever the tag
named before a build (an older spec, another default, a hand-made tag) is
read back, so that a move between entries is always said.
"""

from __future__ import annotations

from gpurig.connect.engine import Engine
from gpurig.image import compat
from gpurig.image.spec import ImageSpec, MatrixEntry


def alias_ref(spec: ImageSpec, alias: str, entry: MatrixEntry, variant: str) -> str:
    """The full reference ``alias`` makes for ``entry`` and ``variant``."""
    repo = spec.image_ref(entry, variant).rsplit(":", 1)[0]
    return f"{repo}:{alias.format(variant=variant, torch=entry.torch, cuda=entry.cuda, cuda_tag=entry.cuda_tag)}"


def alias_owner(spec: ImageSpec, alias: str, entry: MatrixEntry, variant: str) -> MatrixEntry:
    """The one matrix entry whose build of ``variant`` carries the tag ``alias`` makes for ``entry``."""
    tag = alias_ref(spec, alias, entry, variant)
    kind = spec.variant(variant)
    sharing = [e for e in spec.matrix if kind.builds_on(e) and alias_ref(spec, alias, e, variant) == tag]
    if entry not in sharing or len(sharing) == 1:
        return entry
    return spec.default if spec.default in sharing else sharing[0]


def alias_refs(spec: ImageSpec, entry: MatrixEntry, variant: str) -> tuple[str, ...]:
    """The aliases a build of ``entry`` and ``variant`` tags: the ones it owns."""
    return tuple(
        alias_ref(spec, a, entry, variant) for a in spec.build.aliases if alias_owner(spec, a, entry, variant) == entry
    )


def aliases_left(spec: ImageSpec, entry: MatrixEntry, variant: str) -> tuple[str, ...]:
    """A line for each alias whose tag this build would make but another entry owns: it stays where it is."""
    lines = []
    for alias in spec.build.aliases:
        owner = alias_owner(spec, alias, entry, variant)
        if owner != entry:
            which = "the default" if owner == spec.default else "the first buildable"
            lines.append(
                f"{alias_ref(spec, alias, entry, variant)} stays on {owner.tag}-{variant}: the alias {alias} is made by"
                f" several matrix entries and follows {which} one ({owner})"
            )
    return tuple(lines)


def named_builds(engine: Engine, refs: tuple[str, ...]) -> dict[str, str]:
    """ref -> the build it names now ('2.14.1-cu130-slim', read from the image's labels), for each ref that exists."""
    found = {}
    for ref in refs:
        info = engine.image(ref)
        if info is not None:
            found[ref] = build_name(info.labels)
    return found


def build_name(labels: dict[str, str]) -> str:
    """'2.14.1-cu130-slim' from gpurig's labels; '(not a gpurig build)' for an image without them."""
    torch, cuda, variant = (labels.get(f"io.gpurig.{k}") for k in ("torch", "cuda", "variant"))
    if not (torch and cuda and variant):
        return "(not a gpurig build)"
    return f"{torch}-{compat.cuda_tag(cuda)}-{variant}"


def moves(before: dict[str, str], built: str) -> list[str]:
    """'moved REF from OLD to NEW' for each alias that named another build than the one just made."""
    return [f"moved {ref} from {old} to {built}" for ref, old in before.items() if old != built]
