"""Rendering every variant x matrix entry: the lines that make each image what it claims, and hadolint-clean."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpurig.errors import CompatError, RenderError
from gpurig.image.lint import failing, lint
from gpurig.image.render import image_labels, render, render_matrix, torch_requirement
from gpurig.image.spec import MatrixEntry, load_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_spec(ROOT / "images" / "pytorch.yaml")
PAIRS = [(e, v) for e in SPEC.matrix for v in SPEC.variants if not (e.is_cpu and v == "full")]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("contexts")
    contexts, skipped = render_matrix(SPEC, list(SPEC.matrix), list(SPEC.variants), ROOT, out)
    return {(c.entry, c.variant.name): c for c in contexts}, skipped


def instructions(dockerfile: Path) -> list[str]:
    """Dockerfile instructions with continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def index_of(lines: list[str], pattern: str) -> int:
    return next(i for i, line in enumerate(lines) if re.search(pattern, line))


def test_cpu_full_is_skipped_with_reason(rendered):
    contexts, skipped = rendered
    assert [(e.tag, v) for e, v, _ in skipped] == [("2.13.0-cpu", "full")]
    assert "needs a CUDA build" in skipped[0][2]
    assert len(contexts) == len(PAIRS)


@pytest.mark.parametrize("entry,variant", PAIRS, ids=[f"{e.tag}-{v}" for e, v in PAIRS])
def test_every_variant_and_entry_renders_what_it_claims(rendered, entry, variant):
    context = rendered[0][(entry, variant)]
    lines = instructions(context.dockerfile)
    text = "\n".join(lines)
    assert lines[0] == f"FROM {SPEC.variants[variant].base}"
    assert not context.dockerfile.read_text().startswith("# syntax")
    # torch pinned; the checks suite in; checks and configs copied after torch
    torch_at = index_of(lines, rf"pip install .*{re.escape(torch_requirement(entry))}")
    assert index_of(lines, r"^COPY checks /opt/gpurig/checks") > torch_at
    assert index_of(lines, r"^COPY entrypoint.sh") > torch_at
    assert (context.path / "checks" / "verify_torch.py").is_file()
    # the toolkit's variables, and a CUDA constraint matching the build
    assert "NVIDIA_VISIBLE_DEVICES=all" in text and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in text
    if entry.is_cpu:
        assert "NVIDIA_REQUIRE_CUDA" not in text
    else:
        assert f'NVIDIA_REQUIRE_CUDA="cuda>={entry.cuda}"' in text
    # labels later tasks read
    for key, value in {
        "io.gpurig.torch": entry.torch,
        "io.gpurig.cuda": entry.cuda,
        "io.gpurig.variant": variant,
        "io.gpurig.python": "3.11",
        "io.gpurig.min-driver": entry.min_driver or "none",
        "org.opencontainers.image.version": f"{entry.tag}-{variant}",
    }.items():
        assert f'{key}="{value}"' in text
    for key in ("revision", "created"):  # this checkout is a git repository
        assert f"org.opencontainers.image.{key}=" in text
    assert 'io.gpurig.project="pytorch"' in text
    assert "local:" not in text  # nothing from the directory the checkout happens to lie in
    # pip and apt leave no caches in layers; the CA bundle only as a secret
    for line in lines:
        if "pip install" in line:
            assert "--mount=type=cache,target=/root/.cache/pip" in line
            assert "--mount=type=secret,id=ca" in line
        if "apt-get install" in line:
            assert "--mount=type=cache,target=/var/lib/apt/lists" in line
    assert "ca-certificates.crt" not in text and "COPY ca" not in text
    meta = json.loads((context.path / "gpurig-context.json").read_text())
    assert meta["image"] == f"pytorch:{entry.tag}-{variant}"


@pytest.mark.parametrize("entry,variant", PAIRS, ids=[f"{e.tag}-{v}" for e, v in PAIRS])
def test_every_rendered_dockerfile_is_hadolint_clean(rendered, entry, variant):
    context = rendered[0][(entry, variant)]
    assert failing(lint(context.dockerfile, ROOT / ".hadolint.yaml")) == []


@pytest.mark.parametrize("entry", SPEC.matrix, ids=[e.tag for e in SPEC.matrix])
def test_variants_of_an_entry_share_every_layer_up_to_torch(rendered, entry):
    """The same instructions up to the torch layer: BuildKit makes those layers once for all variants."""
    contexts = [c for (e, _), c in rendered[0].items() if e == entry]
    assert len(contexts) >= 3
    prefixes = set()
    for context in contexts:
        lines = instructions(context.dockerfile)
        torch_at = index_of(lines, rf"pip install .*{re.escape(torch_requirement(entry))} numpy( +&&|$)")
        prefixes.add(tuple(lines[: torch_at + 1]))
        # a variant's own packages come after the torch layer, never before
        for package in context.variant.apt:
            assert index_of(lines, rf"apt-get install .*\b{re.escape(package)}\b") > torch_at
        for package in context.variant.pip:
            assert index_of(lines, rf"pip install .*\b{re.escape(package)}\b") > torch_at
    assert len(prefixes) == 1


def test_torch_comes_with_numpy(rendered):
    lines = instructions(rendered[0][(SPEC.default, "slim")].dockerfile)
    # the step's command ends there, or goes on to trim pip's report ('&& if ...')
    assert re.search(r"pip install .*torch==2\.14\.1 numpy( +&&|$)", lines[index_of(lines, r"pip install")])


def test_slim_is_runtime_only_and_non_root(rendered):
    context = rendered[0][(SPEC.default, "slim")]
    text = context.dockerfile.read_text()
    lines = instructions(context.dockerfile)
    assert lines[-1] == 'CMD ["bash"]'
    assert "USER 1000" in lines
    for tool in ("build-essential", "gcc", "openssh-server", "jupyterlab", "cuda-toolkit"):
        assert tool not in text
    assert "EXPOSE" not in text and "HEALTHCHECK" not in text


@pytest.mark.parametrize("variant", ["ssh", "full"])
def test_ssh_images_delete_package_host_keys_in_the_same_layer(rendered, variant):
    context = rendered[0][(SPEC.default, variant)]
    apt_step = next(line for line in instructions(context.dockerfile) if "apt-get install" in line and "openssh" in line)
    # a later RUN rm would leave the keys in the apt layer
    assert "openssh-server" in apt_step and "rm -f /etc/ssh/ssh_host_*" in apt_step
    config = (context.path / "sshd_config").read_text()
    for setting in ("PasswordAuthentication no", "PermitRootLogin no", "KbdInteractiveAuthentication no"):
        assert re.search(rf"^{setting}$", config, re.M)
    entrypoint = (context.path / "entrypoint.sh").read_text()
    assert "ssh-keygen -A" in entrypoint and "/run/secrets/authorized_keys" in entrypoint
    assert "EXPOSE 22" in context.dockerfile.read_text()


@pytest.mark.parametrize("variant", ["jupyter", "full"])
def test_jupyter_images_require_a_token_and_check_health(rendered, variant):
    context = rendered[0][(SPEC.default, variant)]
    text = context.dockerfile.read_text()
    assert "HEALTHCHECK" in text and "8888" in text
    config = (context.path / "jupyter_server_config.py").read_text()
    assert "c.IdentityProvider.token" in config and "raise SystemExit" in config
    entrypoint = (context.path / "entrypoint.sh").read_text()
    assert "secrets.token_urlsafe" in entrypoint and "unset JUPYTER_TOKEN" in entrypoint


def test_full_has_the_cuda_toolkit_of_its_cuda(rendered):
    for entry in (e for e in SPEC.matrix if not e.is_cpu):
        text = rendered[0][(entry, "full")].dockerfile.read_text()
        assert f"cuda-toolkit[nvcc,cudart,cccl,crt,nvvm]=={entry.cuda}.*" in text
        assert "CUDA_HOME=/usr/local/cuda" in text


def test_torch_requirement_follows_where_the_wheel_lives():
    assert torch_requirement(MatrixEntry("2.14.1", "13.0")) == "torch==2.14.1"  # PyPI's own build
    assert torch_requirement(MatrixEntry("2.9.1", "12.6")) == "torch==2.9.1+cu126"
    assert torch_requirement(MatrixEntry("2.13.0", "cpu")) == "torch==2.13.0+cpu"


def test_non_pypi_builds_use_the_torch_index(rendered):
    text = rendered[0][(MatrixEntry("2.13.0", "cpu"), "slim")].dockerfile.read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu" in text


def test_wheelhouse_is_mounted_not_copied(project, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "demo-1.0-py3-none-any.whl").write_bytes(b"not really a wheel")
    spec_file = project / "images" / "pytorch.yaml"
    spec_file.write_text(spec_file.read_text().replace("  # find_links: [/opt/wheels]", f"  find_links: [{wheels}]"))
    spec = load_spec(spec_file)
    context = render(spec, spec.default, "slim", project, project / "out")
    text = context.dockerfile.read_text()
    assert "--mount=type=bind,source=wheelhouse,target=/wheelhouse" in text
    assert "--find-links /wheelhouse" in text
    assert not re.search(r"^(COPY|ADD) .*wheelhouse", text, re.M)
    assert (context.path / "wheelhouse" / "demo-1.0-py3-none-any.whl").is_file()


def test_apt_mirror_override_is_applied_before_update(project):
    spec_file = project / "images" / "pytorch.yaml"
    spec_file.write_text(
        spec_file.read_text().replace("  # apt_mirror: http://mirror.example.com/debian", "  apt_mirror: http://mirror.example.com/debian")
    )
    spec = load_spec(spec_file)
    lines = instructions(render(spec, spec.default, "slim", project, project / "out").dockerfile)
    apt_step = next(line for line in lines if "apt-get update" in line)
    assert apt_step.index("mirror.example.com") < apt_step.index("apt-get update")


def test_rerender_replaces_the_context_whole(project):
    spec = load_spec(project / "images" / "pytorch.yaml")
    first = render(spec, spec.default, "slim", project, project / "out")
    (first.path / "stale-file").write_text("left from before")
    second = render(spec, spec.default, "slim", project, project / "out")
    assert second.path == first.path and not (second.path / "stale-file").exists()
    assert [p.name for p in (project / "out" / "pytorch").iterdir()] == [first.path.name]


def test_a_broken_template_leaves_the_previous_context_untouched(project):
    spec = load_spec(project / "images" / "pytorch.yaml")
    good = render(spec, spec.default, "slim", project, project / "out")
    before = good.dockerfile.read_text()
    (project / "templates" / "slim.Dockerfile.j2").write_text('{% extends "Dockerfile.j2" %}{% block user %}{{ nope }}{% endblock %}')
    with pytest.raises(RenderError, match="'nope' is undefined"):
        render(spec, spec.default, "slim", project, project / "out")
    assert good.dockerfile.read_text() == before
    assert [p.name for p in (project / "out" / "pytorch").iterdir()] == [good.path.name]


def test_full_for_a_cpu_entry_is_refused():
    with pytest.raises(CompatError, match="variant full needs a CUDA build"):
        render(SPEC, MatrixEntry("2.13.0", "cpu"), "full", ROOT, ROOT / "unused")


def test_missing_templates_dir(project):
    shutil.rmtree(project / "templates")
    with pytest.raises(RenderError, match="no templates directory"):
        render(SPEC, SPEC.default, "slim", project, project / "out")


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "PATH": os.environ["PATH"], "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def test_labels_are_the_same_for_the_same_content(project, tmp_path_factory, monkeypatch):
    """A copy elsewhere, a later commit that leaves the image's inputs alone, a rebuild tomorrow: same labels, same id."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "images")
    spec = load_spec(project / "images" / "pytorch.yaml")
    first = image_labels(spec, spec.default, spec.variant("slim"), project)
    assert first["org.opencontainers.image.revision"] == git(project, "rev-parse", "HEAD").strip()
    assert "org.opencontainers.image.source" not in first  # no remote: left out, not the directory's name

    (project / "README.md").write_text("docs only\n")
    git(project, "add", "README.md")
    git(project, "commit", "-qm", "docs")
    copy = tmp_path_factory.mktemp("elsewhere") / "another-name"
    shutil.copytree(project, copy, symlinks=True)
    moved = load_spec(copy / "images" / "pytorch.yaml")
    assert image_labels(moved, moved.default, moved.variant("slim"), copy) == first
    assert image_labels(spec, spec.default, spec.variant("slim"), project) == first

    with open(project / "checks" / "verify_torch.py", "a") as fh:
        fh.write("# edited\n")
    dirty = image_labels(spec, spec.default, spec.variant("slim"), project)
    assert dirty["org.opencontainers.image.revision"] == first["org.opencontainers.image.revision"] + "-dirty"


def test_labels_outside_a_git_checkout_leave_out_what_is_unknown(project):
    spec = load_spec(project / "images" / "pytorch.yaml")
    labels = image_labels(spec, spec.default, spec.variant("slim"), project)
    for key in ("revision", "created", "source"):
        assert f"org.opencontainers.image.{key}" not in labels
    assert labels["io.gpurig.project"] == "pytorch"


def pip_steps(dockerfile: Path) -> list[str]:
    return [line for line in instructions(dockerfile) if "pip install" in line]


def with_build(project: Path, settings: str) -> Path:
    """The project's spec with ``settings`` (YAML lines under build:) in place of the commented find_links line."""
    spec_file = project / "images" / "pytorch.yaml"
    spec_file.write_text(spec_file.read_text().replace("  # find_links: [/opt/wheels]", settings))
    return spec_file


def test_a_wheelhouse_holding_the_torch_wheel_keeps_the_torch_index_out_of_every_pip_step(project, tmp_path):
    # a jupyter build spent 702 s in one silent pip step retrying download.pytorch.org, whose wheel was in the wheelhouse
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"stand-in")
    spec = load_spec(with_build(project, f"  find_links: [{wheels}]"))
    cpu = MatrixEntry("2.13.0", "cpu")
    steps = pip_steps(render(spec, cpu, "jupyter", project, project / "out").dockerfile)
    assert len(steps) == 2 and all("--find-links /wheelhouse" in s for s in steps)
    assert not any("download.pytorch.org" in s or "--extra-index-url" in s for s in steps), steps
    # an entry whose wheel the wheelhouse lacks still gets it from the torch index
    cuda = render(spec, MatrixEntry("2.14.1", "12.6"), "slim", project, project / "out").dockerfile
    assert any("--extra-index-url https://download.pytorch.org/whl/cu126" in s for s in pip_steps(cuda))


def test_an_offline_build_names_no_index_in_any_pip_step(project, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    spec = load_spec(with_build(project, f"  find_links: [{wheels}]\n  offline: true"))
    for entry, variant in ((spec.default, "full"), (MatrixEntry("2.13.0", "cpu"), "jupyter")):
        steps = pip_steps(render(spec, entry, variant, project, project / "out").dockerfile)
        assert steps and all(" --no-index " in s for s in steps), steps
        assert not any(re.search(r"--(extra-)?index-url|https?://", s) for s in steps), steps


@pytest.mark.parametrize("settings,message", [
    ("  offline: true", "build.offline: is true but build.find_links is empty"),
    ("  find_links: [/tmp]\n  offline: true\n  torch_index: https://download.pytorch.org/whl/{cuda_tag}",
     "build.torch_index: names an index, but build.offline is true"),
    ("  find_links: [/tmp]\n  offline: true\n  pip_index: https://pypi.example.com/simple",
     "build.pip_index: names an index, but build.offline is true"),
])
def test_offline_without_a_wheelhouse_or_with_an_index_is_refused(project, settings, message):
    from gpurig.errors import SpecError

    with pytest.raises(SpecError, match=re.escape(message)):
        load_spec(with_build(project, settings))


def test_a_huge_template_is_one_line_not_read_whole(tmp_path):
    import os
    import shutil

    from gpurig.errors import RenderError
    from gpurig.image.render import TEMPLATE_MAX_BYTES, environment

    templates = tmp_path / "templates"
    shutil.copytree(Path(__file__).resolve().parents[2] / "templates", templates)
    with open(templates / "huge.j2", "wb") as f:  # sparse: a GiB that costs no disk
        f.truncate(1 << 30)
    assert os.path.getsize(templates / "huge.j2") > TEMPLATE_MAX_BYTES
    with pytest.raises(RenderError, match="over the 1 MiB limit|MiB, over the") as err:
        environment(templates).get_template("huge.j2")
    assert "\n" not in str(err.value)
