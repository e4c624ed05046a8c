"""Shared layers and stable identity: ssh and jupyter carry slim's torch layer, and the same content keeps its image id."""

from __future__ import annotations

import json
import shutil

from conftest import CPU_TORCH, SESSION, SPEC_NAME, TEST_LABEL, docker

MB = 1000 * 1000


def rootfs(ref: str) -> list[str]:
    return json.loads(docker("image", "inspect", ref).stdout)[0]["RootFS"]["Layers"]


def test_ssh_and_jupyter_are_built_on_slims_torch_layer(build, engine):
    slim, ssh, jupyter = (build(v).ref for v in ("slim", "ssh", "jupyter"))
    sizes = engine.layer_sizes(slim, ssh, jupyter)
    slim_layers = rootfs(slim)
    torch_layer = max(slim_layers, key=sizes.__getitem__)
    assert sizes[torch_layer] > 500 * MB  # torch with its libraries, the layer worth sharing
    for variant in (ssh, jupyter):
        layers = rootfs(variant)
        assert torch_layer in layers, f"{variant} does not reuse slim's torch layer {torch_layer}"
        # everything below torch is slim's too: the same layers, in the same order
        at = slim_layers.index(torch_layer)
        assert layers[: at + 1] == slim_layers[: at + 1]
    extra = sum(sizes[layer] for layer in set(rootfs(jupyter)) - set(slim_layers))
    assert extra < 300 * MB, f"a host that has slim needs {extra / MB:.0f} MB more for jupyter"


def test_a_copy_of_the_project_builds_the_same_image_id(build, cli, tmp_path):
    """Same content, another directory name: the same image, and no dangling one left behind."""
    first = build("slim").report
    before = dangling()
    copy = tmp_path / "a-copy-named-otherwise"
    shutil.copytree(cli.project, copy, symlinks=True, ignore=shutil.ignore_patterns("build-contexts", "reports"))
    moved = type(cli)(copy, cli.env)
    proc = moved("build", "--variant", "slim", "--cuda", "cpu", "--label", f"{TEST_LABEL}={SESSION}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    again = json.loads((copy / "reports/builds" / SPEC_NAME / f"{CPU_TORCH}-cpu-slim.json").read_text())
    assert again["image_id"] == first["image_id"]
    assert again["steps"]["ran"] == 0 and again["steps"]["total"] == again["steps"]["cached"]
    assert dangling() == before
    tags = json.loads(docker("image", "inspect", first["image_id"]).stdout)[0]["RepoTags"]
    assert f"{SPEC_NAME}:{CPU_TORCH}-cpu-slim" in tags


def dangling() -> set[str]:
    """This session's untagged gpurig images (other tests leave some: a spec built under the same tag)."""
    return set(docker("image", "ls", "-q", "--no-trunc", "--filter", "dangling=true",
                      "--filter", f"label=org.opencontainers.image.title={SPEC_NAME}").stdout.split())
