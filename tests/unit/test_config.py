"""One configuration: defaults < ~/.gpurig.yaml < project gpurig.yaml < GPURIG_* env < flags, each value validated."""

from __future__ import annotations

from pathlib import Path

import pytest
from invoke import Config

from gpurig.config import DEFAULTS, GpurigConfig, find_project_root, project_config, settings
from gpurig.errors import ConfigError


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """An empty project (gpurig.yaml marks it) with HOME and the environment free of gpurig settings."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for key in DEFAULTS:
        monkeypatch.delenv(f"GPURIG_{key.upper()}", raising=False)
    root = tmp_path / "proj"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "gpurig.yaml").write_text("")
    monkeypatch.chdir(root / "sub" / "deeper")
    return root


def test_defaults_without_any_file(project):
    s = settings(project_config(project))
    assert s.root == project
    assert (s.forks, s.connect_timeout, s.host_key_policy) == (64, 10.0, "accept-new")
    assert s.inventory == project / "inventory" / "hosts.yaml"
    assert s.known_hosts == project / "inventory" / "known_hosts"


def test_project_file_overrides_user_file_which_overrides_defaults(project):
    (Path.home() / ".gpurig.yaml").write_text("forks: 5\nconnect_timeout: 3\n")
    (project / "gpurig.yaml").write_text("forks: 8\ninventory: fleet/prod.yaml\n")
    s = settings(project_config(project))
    assert s.forks == 8 and s.connect_timeout == 3.0
    # a path in the project's file is relative to the project, wherever gpurig runs from
    assert s.inventory == project / "fleet" / "prod.yaml"
    assert s.known_hosts == project / "fleet" / "known_hosts"


def test_env_overrides_the_project_file_and_flags_override_both(project, monkeypatch):
    (project / "gpurig.yaml").write_text("forks: 8\nhost_key_policy: strict\n")
    monkeypatch.setenv("GPURIG_FORKS", "16")
    s = settings(project_config(project))
    assert s.forks == 16 and s.host_key_policy == "strict"
    s = settings(project_config(project), forks="2", host_key_policy="off")
    assert s.forks == 2 and s.host_key_policy == "off"


def test_a_typed_inventory_path_is_relative_to_the_working_directory(project, monkeypatch):
    s = settings(project_config(project), inventory="hosts.yaml")
    assert s.inventory == project / "sub" / "deeper" / "hosts.yaml"
    monkeypatch.setenv("GPURIG_INVENTORY", "other.yaml")
    assert settings(project_config(project)).inventory == project / "sub" / "deeper" / "other.yaml"


def test_known_hosts_can_be_set_apart_from_the_inventory(project):
    (project / "gpurig.yaml").write_text("known_hosts: secrets/known_hosts\n")
    assert settings(project_config(project)).known_hosts == project / "secrets" / "known_hosts"


def test_invoke_config_from_tasks_py_sees_the_same_layers(project, monkeypatch):
    (project / "gpurig.yaml").write_text("forks: 8\n")
    monkeypatch.setenv("GPURIG_CONNECT_TIMEOUT", "4")
    invoke_config = Config(overrides={"root": str(project)})  # what `invoke` with tasks.py hands a task
    s = settings(invoke_config, forks="3")
    assert (s.root, s.forks, s.connect_timeout) == (project, 3, 4.0)
    assert settings(invoke_config).forks == 8


def test_project_root_is_found_from_a_subdirectory_and_none_outside(project, tmp_path):
    assert find_project_root() == project
    assert find_project_root(project / "sub") == project
    (tmp_path / "elsewhere").mkdir()
    assert find_project_root(tmp_path / "elsewhere") is None


@pytest.mark.parametrize(
    "flags,fragments",
    [
        ({"forks": "abc"}, ["--forks 'abc' is not a whole number", "at least 1"]),
        ({"forks": "0"}, ["--forks 0 is below 1"]),
        ({"connect_timeout": "-1"}, ["--connect-timeout -1 is out of range", "above 0"]),
        ({"connect_timeout": "soon"}, ["--connect-timeout 'soon' is not a number"]),
        ({"connect_timeout": "inf"}, ["is not a number"]),
        ({"host_key_policy": "accept_new"}, ["--host-key-policy 'accept_new' is not valid", "did you mean 'accept-new'"]),
    ],
)
def test_bad_flag_values_are_config_errors(project, flags, fragments):
    with pytest.raises(ConfigError) as err:
        settings(project_config(project), **flags)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_a_bad_value_names_the_file_or_variable_it_came_from(project, monkeypatch):
    (project / "gpurig.yaml").write_text("forks: many\n")
    with pytest.raises(ConfigError, match=r"forks in .*proj/gpurig.yaml 'many' is not a whole number"):
        settings(project_config(project))
    (project / "gpurig.yaml").write_text("connect_timeout: 10\n")
    monkeypatch.setenv("GPURIG_CONNECT_TIMEOUT", "0")
    with pytest.raises(ConfigError, match=r"\$GPURIG_CONNECT_TIMEOUT 0 is out of range"):
        settings(project_config(project))
    monkeypatch.setenv("GPURIG_CONNECT_TIMEOUT", "2.5")  # a float over the file's integer is still fine
    assert settings(project_config(project)).connect_timeout == 2.5
    monkeypatch.setenv("GPURIG_FORKS", "lots")
    with pytest.raises(ConfigError, match=r"\$GPURIG_FORKS 'lots' is not a whole number"):
        settings(project_config(project))


def test_gpurig_config_reads_gpurig_files_not_invoke_ones(project):
    (project / "invoke.yaml").write_text("forks: 3\n")
    (project / "gpurig.yaml").write_text("forks: 7\n")
    config = GpurigConfig(project_location=str(project))
    config.load_project()
    assert config.forks == 7


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("forks: [1\n", "gpurig.yaml: line 2: malformed YAML"),
        ("- forks\n", "must be a mapping of settings"),
        ("frks: 8\n", "unknown setting 'frks' (did you mean 'forks'?)"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_it(project, text, fragment):
    from invoke.exceptions import Exit

    (project / "gpurig.yaml").write_text(text)
    with pytest.raises(Exit) as err:
        project_config(project)
    assert fragment in err.value.message and err.value.message.startswith("gpurig: ")


def test_a_python_file_named_like_the_config_is_never_run(project):
    (project / "gpurig.py").write_text("raise SystemExit('ran')\n")
    assert settings(project_config(project)).forks == 64
