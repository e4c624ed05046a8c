"""Every file gpurig ships, found the same way wherever gpurig is installed, and the project skeleton copied out of them.

``shipped(path)`` is the one resolver: ``path`` is written as it is in the
source checkout (``checks/verify_host.py``, ``templates``,
``gpurig/monitor/grafana-dashboard.json``). The project skeleton (images/,
templates/, checks/, inventory/, .hadolint.yaml, tasks.py) is carried by an installed
wheel as ``gpurig/skeleton/`` (setup.py copies the checkout's top-level
folders there at build time, so git holds them once); an editable install or a
checkout uses the top-level folders themselves. Files under ``gpurig/`` are
package data, next to the code in both cases.

Only the standard library is imported at module level: setup.py reads
``SKELETON`` and ``copy_tree`` from this file before gpurig is installed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# tasks.py makes `invoke TASK` work in a project as `gpurig TASK` does (and marks the project root for both).
SKELETON = ("images", "templates", "checks", "inventory", ".hadolint.yaml", "tasks.py")
# Never copied: caches, and what a run writes next to the inventory.
IGNORED = ("__pycache__", "*.pyc", "known_hosts", "*.gpurig-tmp")


def copy_tree(source: Path, target: Path) -> None:
    """Copy the skeleton entries found under ``source`` into ``target`` (which must not hold them yet)."""
    for name in SKELETON:
        src = source / name
        if src.is_dir():
            shutil.copytree(src, target / name, ignore=shutil.ignore_patterns(*IGNORED))
        elif src.is_file():
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target / name)


def skeleton_source() -> Path:
    """Where this copy of gpurig keeps its project files: the wheel's gpurig/skeleton/, else the checkout."""
    here = Path(__file__).resolve().parent
    packaged = here / "skeleton"
    if (packaged / "images").is_dir():
        return packaged
    if (here.parent / "images").is_dir() and (here.parent / "templates").is_dir():
        return here.parent
    from gpurig.errors import GpurigError

    raise GpurigError(f"this gpurig ({here}) was installed without its project files", "reinstall it from a wheel or sdist built by setup.py")


def shipped(path: str) -> Path:
    """The file or folder gpurig ships at ``path`` (as written in the source checkout), in this installed copy.

    Raises GpurigError, naming the path and where it was looked for, when this
    copy of gpurig lacks it: a probe that is not there must stop the run with
    that line, never let it pass as a check that was skipped.
    """
    from gpurig.errors import GpurigError

    parts = Path(path).parts
    if not parts or Path(path).is_absolute() or ".." in parts:
        raise ValueError(f"shipped() takes a path inside the checkout, not {path!r}")
    package = Path(__file__).resolve().parent
    if parts[0] == package.name:  # package data: beside the code, in a wheel as in a checkout
        found = package.parent / path
    elif parts[0] in SKELETON:
        found = skeleton_source() / path
    else:
        raise ValueError(f"{path!r} is not something gpurig ships (one of {', '.join(SKELETON)}, or under {package.name}/)")
    if not found.exists():
        raise GpurigError(f"this gpurig ({package}) has no {path} (looked for {found})",
                          "reinstall gpurig from a wheel or sdist built by its setup.py (pip install --force-reinstall gpurig)")
    return found


def shipped_text(path: str) -> str:
    """The text of a script gpurig ships (a probe, the sampler): GpurigError when it is missing, unreadable or empty.

    A probe that cannot be read must fail its run with that line; sending an
    empty script would let a host "pass" a check that never ran.
    """
    from gpurig.errors import GpurigError

    found = shipped(path)
    fix = "reinstall gpurig from a wheel or sdist built by its setup.py (pip install --force-reinstall gpurig)"
    try:
        text = found.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise GpurigError(f"{path} cannot be read ({found}): {getattr(err, 'strerror', None) or err}", fix) from None
    if not text.strip():
        raise GpurigError(f"{path} is empty ({found})", fix)
    return text


def scaffold(target: str | Path, config_text: str = "") -> list[str]:
    """Copy the skeleton into ``target`` (created if needed) and write ``gpurig.yaml``; nothing is written when any of it exists.

    A name that is a symlink counts as there, dangling or not: copying or
    writing through it would put gpurig's files wherever the link points.
    """
    import os

    from gpurig.errors import GpurigError

    target = Path(target)
    if target.exists() and not target.is_dir():
        raise GpurigError(f"{target} exists and is not a directory", "give a new or an existing directory")
    names = [*SKELETON, "gpurig.yaml"]
    links = [n for n in names if (target / n).is_symlink()]
    if links:
        raise GpurigError(f"{target} holds symlinks named like gpurig's files ({', '.join(links)}), which init never follows",
                          "remove them, or init into a new directory")
    present = [n for n in names if os.path.lexists(target / n)]
    if present:
        raise GpurigError(f"{target} already has {', '.join(present)}", "init into a new directory, or move those away first")
    source = skeleton_source()
    target.mkdir(parents=True, exist_ok=True)
    copy_tree(source, target)
    # O_EXCL|O_NOFOLLOW: a link made there since the check above is refused, not followed.
    fd = os.open(target / "gpurig.yaml", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(config_text)
    return names
