"""`gpurig init DIR`: a new project from the files this gpurig carries."""

from __future__ import annotations

from pathlib import Path

from gpurig.cli.base import refuse_dry, task
from gpurig.config import DEFAULTS, new_project_id
from gpurig.files import output_dir
from gpurig.report import console

__all__ = ["init"]


def config_template() -> str:
    """gpurig.yaml with every setting at its default, commented out, and the project's own fresh id."""
    lines = [
        "# gpurig settings for this project. Each overrides /etc/gpurig.yaml and ~/.gpurig.yaml,",
        "# and is overridden by GPURIG_<NAME> variables and command-line flags.",
    ]
    for key, value in DEFAULTS.items():
        if key == "project_id":
            lines += ["# which images on a shared Docker engine are this project's (their io.gpurig.project-id label); keep it",
                      f"project_id: {new_project_id()}"]
            continue
        lines.append(f"# {key}: {value!r}" if isinstance(value, str) else f"# {key}: {value}")
    return "\n".join(lines) + "\n"


@task(help={"directory": "where to create the project (created if missing; must not hold its files yet)"})
def init(c, directory):
    """Start a project: images/, templates/, checks/, inventory/, .hadolint.yaml, tasks.py and gpurig.yaml, from gpurig's own copies.

    Nothing is written when DIRECTORY already holds any of them (a tasks.py of your own included): init names them and stops.
    """
    from gpurig.skeleton import scaffold

    refuse_dry(c, "init", "run it without --dry: it only writes into a new or empty DIRECTORY")
    # The whole path checked first: no folder on the way may be another user's symlink.
    written = scaffold(output_dir(directory, "init"), config_template())
    target = Path(directory)
    console.print(f"created {', '.join(written)} in {target}")
    console.print(f"next: cd {target} && gpurig matrix && gpurig render (or invoke matrix: tasks.py loads gpurig's tasks)")
