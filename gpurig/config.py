"""One layered configuration: each setting has one default here, and files, env and flags override it.

Invoke's ``Config`` with the prefix ``gpurig`` does the layering, lowest first:
the defaults below < ``/etc/gpurig.yaml`` < ``~/.gpurig.yaml`` < the project's
``gpurig.yaml`` < ``GPURIG_*`` environment variables (``GPURIG_FORKS=8``) <
command-line flags. ``settings()`` reads the merged result into a typed,
validated ``Settings``; a bad value is one line naming where it came from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from invoke import Config
from invoke.env import Environment
from invoke.exceptions import Exit

try:  # Invoke reads config files with its own copy of PyYAML
    from invoke.util import yaml as _invoke_yaml

    _YAML_ERRORS: tuple[type[Exception], ...] = (yaml.YAMLError, _invoke_yaml.YAMLError)
except ImportError:
    _YAML_ERRORS = (yaml.YAMLError,)

from gpurig.errors import ConfigError, did_you_mean
from gpurig.strict import validate

# How unknown SSH host keys are met; the settings name them, connect/hostkeys.py enforces them.
HOST_KEY_POLICIES = ("strict", "accept-new", "off")

# What marks a directory as a gpurig project, looked for from the working directory upwards.
PROJECT_MARKERS = ("gpurig.yaml", "images", "tasks.py")

# The one default of every setting. Top-level keys, so the environment variable is GPURIG_<KEY>.
DEFAULTS: dict[str, Any] = {
    # the project directory; "" = found from the working directory upwards (PROJECT_MARKERS)
    "root": "",
    # relative paths are taken from the project root
    "inventory": "inventory/hosts.yaml",
    # Work is I/O-bound (waiting on remote commands); 64 keeps a 2-core controller busy
    # without opening more sessions at once than a typical sshd MaxStartups (10:30:100) allows.
    "forks": 64,
    "connect_timeout": 10.0,
    "host_key_policy": "accept-new",
    # the project's known_hosts; "" = known_hosts beside the inventory file
    "known_hosts": "",
    # Which project an image belongs to (its io.gpurig.project-id label), where several share one Docker engine
    # and one image name. `gpurig init` writes a fresh one into gpurig.yaml; "" = none (told apart by the spec's
    # name only). It is the project's: set in /etc or ~/.gpurig.yaml it would make every project one.
    "project_id": "",
}


class GpurigConfig(Config):
    """Invoke's Config read from gpurig.yaml files and GPURIG_* variables, with gpurig's defaults."""

    prefix = "gpurig"

    # YAML only: Invoke would also run a gpurig.py lying in a project directory as configuration.
    _SUFFIXES = ("yaml", "yml")

    @staticmethod
    def global_defaults() -> dict[str, Any]:
        return {**Config.global_defaults(), **DEFAULTS}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._set(_file_suffixes=self._SUFFIXES)

    def load_base_conf_files(self) -> None:
        self._set(_file_suffixes=self._SUFFIXES)  # before Invoke's __init__ reads /etc and ~
        super().load_base_conf_files()

    def _load_yaml(self, path) -> Any:
        # Invoke would show a traceback for a malformed file; gpurig says where, in one line.
        try:
            data = super()._load_yaml(path)
        except _YAML_ERRORS as err:
            mark = getattr(err, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise Exit(f"gpurig: {path}:{where}: malformed YAML; fix: correct the file or remove it", code=2) from None
        if data is not None and not isinstance(data, dict):
            raise Exit(f"gpurig: {path}: must be a mapping of settings; fix: write 'name: value' lines, e.g. 'forks: 16'", code=2)
        unknown = [k for k in data or {} if k not in DEFAULTS and k not in Config.global_defaults()]
        if unknown:
            raise Exit(
                f"gpurig: {path}: unknown setting {unknown[0]!r}{did_you_mean(unknown[0], DEFAULTS)}; "
                f"fix: use one of {', '.join(DEFAULTS)}",
                code=2,
            )
        return data

    _load_yml = _load_yaml

    def load_shell_env(self) -> None:
        # As Invoke's, but numbers stay the strings they were typed as: settings() validates them
        # and names the variable (Invoke would cast GPURIG_FORKS=abc with int() and show a traceback).
        self.merge()
        self._set(_env=_Environment(config=self._config, prefix=self._env_prefix).load())
        self.merge()


class _Environment(Environment):
    def _cast(self, old: Any, new: Any) -> Any:
        if isinstance(old, (int, float)) and not isinstance(old, bool):
            return new
        return super()._cast(old, new)


def find_project_root(start: str | Path | None = None) -> Path | None:
    """The nearest directory at or above ``start`` holding gpurig.yaml, images/ or tasks.py; None outside a project."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
    return None


def project_config(root: Path | None) -> GpurigConfig:
    """The layered config for a project: defaults, /etc, ~, the project's gpurig.yaml and GPURIG_* env."""
    config = GpurigConfig(project_location=str(root) if root else None)
    config.load_project()
    config.load_shell_env()
    return config


@dataclass(frozen=True)
class Settings:
    """The merged, validated settings a run uses."""

    root: Path | None  # None outside a project
    inventory: Path
    forks: int
    connect_timeout: float
    host_key_policy: str
    known_hosts: Path
    project_id: str = ""

    @property
    def project(self) -> Path:
        """The project root, or the working directory outside a project."""
        return self.root or Path.cwd()


def root_of(config: Mapping[str, Any]) -> Path | None:
    """The project root a config names (``root``: GPURIG_ROOT, tasks.py), else the one found from the working directory."""
    named = config.get("root")
    return Path(named).resolve() if named else find_project_root()


def settings(config: Mapping[str, Any], **flags: Any) -> Settings:
    """Settings from a layered config with the command line's flags on top (a flag of None is not given).

    ``config`` is a ``GpurigConfig`` (the ``gpurig`` program); any other Invoke
    config (``invoke`` with tasks.py) is layered afresh from the project's files
    and env, so both entry points see the same values.
    """
    if isinstance(config, GpurigConfig):
        layered = config
    else:
        root = root_of(config)
        layered = project_config(root)
        if root:
            layered.load_overrides({"root": str(root)})
    unknown = [k for k in flags if k not in DEFAULTS]
    if unknown:
        raise TypeError(f"unknown settings {unknown}")
    values = {key: layered.get(key, default) for key, default in DEFAULTS.items()}
    source = {key: _source(layered, key) for key in DEFAULTS}
    for key, value in flags.items():
        if value is not None:
            values[key] = value
            source[key] = f"--{key.replace('_', '-')}"
    root = root_of(values)
    base = root or Path.cwd()
    # A path typed on the command line or in the shell is relative to where it was typed;
    # one in a config file is relative to the project.
    typed = lambda key: source[key].startswith(("--", "$"))  # noqa: E731
    inventory = _path(Path.cwd() if typed("inventory") else base, values["inventory"])
    known = values["known_hosts"]
    return Settings(
        root=root,
        inventory=inventory,
        forks=positive_int(values["forks"], source["forks"]),
        connect_timeout=positive_number(values["connect_timeout"], source["connect_timeout"]),
        host_key_policy=choice(values["host_key_policy"], HOST_KEY_POLICIES, source["host_key_policy"]),
        known_hosts=_path(Path.cwd() if typed("known_hosts") else base, known) if known else inventory.parent / "known_hosts",
        project_id=checked_project_id(values["project_id"], source["project_id"]),
    )


_PROJECT_ID = re.compile(r"[a-z0-9][a-z0-9-]{3,63}")  # whole value: fullmatch, so no trailing newline slips past a $


def new_project_id() -> str:
    """A fresh project id: random, so two projects that chose the same image name are still two."""
    import secrets  # here, not at the top: only `gpurig init` makes one, and every command's start-up loads this module

    return secrets.token_hex(8)


def checked_project_id(value: Any, where: str) -> str:
    if value in ("", None):
        return ""
    layer = where.removeprefix("project_id in ")
    if layer != where and (Path(layer).name != "gpurig.yaml" or layer.startswith("/etc/")):
        raise ConfigError(f"{where}: a project id belongs in the project's own gpurig.yaml, not in one every project reads",
                          "move project_id into the project's gpurig.yaml")
    if not isinstance(value, str) or not _PROJECT_ID.fullmatch(value):
        raise ConfigError(f"{where} {validate.excerpt(str(value))} is not a project id",
                          "use 4-64 lowercase letters, digits and -, e.g. what `gpurig init` writes")
    return value


def project_id(root: Path | None) -> str:
    """The project id of the project at ``root`` (its gpurig.yaml, or $GPURIG_PROJECT_ID); '' when it has none."""
    config = project_config(root)
    return checked_project_id(config.get("project_id", ""), _source(config, "project_id"))


def positive_int(value: Any, where: str) -> int:
    """``value`` as an integer >= 1, else a ConfigError naming ``where`` it was set (ASCII digits only)."""
    text = str(value).strip()
    number = validate.whole_number(text.lstrip("+-"))
    if number is None:
        raise ConfigError(f"{where} {validate.excerpt(value)} is not a whole number", f"give a number of at least 1 to {where}")
    number = -number if text.startswith("-") else number
    if number < 1:
        raise ConfigError(f"{where} {number} is below 1", f"give a number of at least 1 to {where}")
    return number


def positive_number(value: Any, where: str) -> float:
    """``value`` as a finite number > 0 (seconds), else a ConfigError naming ``where`` it was set (ASCII digits only)."""
    number = validate.finite_number(value if isinstance(value, (int, float)) else str(value).strip())
    if number is None:
        raise ConfigError(f"{where} {validate.excerpt(value)} is not a number", f"give {where} a number of seconds above 0")
    if not number > 0:
        raise ConfigError(f"{where} {number:g} is out of range", f"give {where} a number of seconds above 0")
    return number


def choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise ConfigError(f"{where} {value!r} is not valid{did_you_mean(value, choices)}", f"use one of: {', '.join(choices)}")
    return value


def _source(config: Config, key: str) -> str:
    """Where a setting's value came from, for error messages: the env var, a file, or the default."""
    if key in getattr(config, "_env", {}):
        return f"${'GPURIG_' + key.upper()}"
    for layer in ("runtime", "project", "user", "system"):
        if key in (getattr(config, f"_{layer}", None) or {}):
            return f"{key} in {getattr(config, f'_{layer}_path')}"
    return key


def _path(base: Path, value: str | Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path
