"""Which images are this project's where another project chose the same image name on the same engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpurig.cli.project import config_template
from gpurig.config import project_id
from gpurig.connect.engineinfo import ImageInfo, image_info
from gpurig.errors import ConfigError
from gpurig.image.build import project_images, unowned
from gpurig.image.pipeline import others_aliases_kept
from gpurig.image.render import PROJECT_ID_LABEL, PROJECT_LABEL, BuildContext, image_labels
from gpurig.image.spec import MatrixEntry, load_spec


class Engine:
    """An engine's images by id, each with its tags and labels: what labelled_images and image answer."""

    def __init__(self, **images: tuple[tuple[str, ...], dict[str, str]]):
        self.images = {i: image_info({"Id": i, "RepoTags": list(tags), "Config": {"Labels": labels}, "Created": i})
                       for i, (tags, labels) in images.items()}

    def labelled_images(self, label: str) -> list[ImageInfo]:
        key, _, value = label.partition("=")
        return [image for image in self.images.values() if image.labels.get(key) == value]

    def image(self, ref: str) -> ImageInfo | None:
        return next((image for image in self.images.values() if ref in image.tags), None)


def project(tmp_path: Path, ident: str | None) -> Path:
    (tmp_path / "images").mkdir(parents=True)
    spec = tmp_path / "images" / "pytorch.yaml"
    spec.write_text('name: pytorch\npython: "3.11"\nmatrix:\n  - {torch: "2.14.1", cuda: "13.0"}\nbuild:\n  aliases: ["{variant}"]\n')
    (tmp_path / "gpurig.yaml").write_text(f"project_id: {ident}\n" if ident else "forks: 4\n")
    return tmp_path


def test_init_writes_a_fresh_project_id_and_a_build_carries_it(tmp_path, monkeypatch):
    monkeypatch.delenv("GPURIG_PROJECT_ID", raising=False)
    first, second = (next(line for line in config_template().splitlines() if line.startswith("project_id:")) for _ in range(2))
    assert first != second  # two `gpurig init`s are two projects, whatever image name each chooses
    root = project(tmp_path / "p", first.split(": ")[1])
    assert project_id(root) == first.split(": ")[1]
    spec = load_spec(root / "images" / "pytorch.yaml")
    labels = image_labels(spec, spec.default, spec.variant("slim"), root)
    assert labels[PROJECT_ID_LABEL] == project_id(root) and labels[PROJECT_LABEL] == "pytorch"
    assert PROJECT_ID_LABEL not in image_labels(spec, spec.default, spec.variant("slim"), project(tmp_path / "old", None))


def test_a_project_id_set_where_every_project_reads_it_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("GPURIG_PROJECT_ID", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".gpurig.yaml").write_text("project_id: shared0001\n")
    with pytest.raises(ConfigError, match="belongs in the project's own gpurig.yaml"):
        project_id(project(tmp_path / "p", None))
    with pytest.raises(ConfigError, match="is not a project id"):
        project_id(project(tmp_path / "q", "Not An Id"))


def test_another_projects_images_are_not_listed_and_old_unlabelled_ones_are_with_a_note():
    engine = Engine(
        a=(("pytorch:2.14.1-cu130-slim",), {PROJECT_LABEL: "pytorch", PROJECT_ID_LABEL: "mine0001"}),
        b=(("pytorch:slim",), {PROJECT_LABEL: "pytorch", PROJECT_ID_LABEL: "theirs01"}),
        c=(("pytorch:old",), {PROJECT_LABEL: "pytorch"}),
        d=(("other:1",), {PROJECT_LABEL: "other", PROJECT_ID_LABEL: "mine0001"}),
    )
    found = project_images(engine, ["pytorch"], "mine0001")  # type: ignore[arg-type]
    assert [i.id for i in found] == ["c", "a"]  # newest first; b is the other project's
    assert [i.id for i in unowned(found)] == ["c"]
    assert [i.id for i in project_images(engine, ["pytorch"], "")] == ["c"]  # type: ignore[arg-type]  # a project without an id: none with one


def test_a_build_leaves_another_projects_alias_where_it_is_and_says_so(tmp_path):
    spec = load_spec(project(tmp_path, "mine0001") / "images" / "pytorch.yaml")
    entry = MatrixEntry("2.14.1", "13.0")
    context = BuildContext(tmp_path, spec, entry, spec.variant("slim"), "pytorch:2.14.1-cu130-slim", ("pytorch:slim", "pytorch:latest"),
                           {PROJECT_ID_LABEL: "mine0001"}, False)
    engine = Engine(b=(("pytorch:slim",), {PROJECT_LABEL: "pytorch", PROJECT_ID_LABEL: "theirs01"}),
                    e=(("pytorch:latest",), {PROJECT_LABEL: "pytorch", PROJECT_ID_LABEL: "mine0001"}))
    kept = others_aliases_kept(engine, context)  # type: ignore[arg-type]
    assert kept.aliases == ("pytorch:latest",)
    assert "pytorch:slim stays on another project's image (project id theirs01" in kept.aliases_left[0]
    assert others_aliases_kept(Engine(), context) is context  # nothing there yet: every alias is made


@pytest.mark.parametrize("value", ["abcd\n", "ab$(id)x", "-abcd", "abc\x00d", "9" * 5000, 'abc"d', "ABCD"])
def test_a_hostile_project_id_is_one_short_line(value):
    from gpurig.config import checked_project_id

    with pytest.raises(ConfigError, match="is not a project id") as err:
        checked_project_id(value, "gpurig.yaml")
    assert "\n" not in str(err.value) and len(str(err.value)) < 200  # a trailing newline used to pass the anchored $
