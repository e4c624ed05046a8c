"""The version facts: every row of the tables, and the rules users meet."""

import pytest

from gpurig.errors import CompatError
from gpurig.image import compat

# gpu-facts.md table 1, as published: (torch, stable, experimental)
PUBLISHED_TORCH = [
    ("2.4", ["11.8", "12.1"], ["12.4"]),
    ("2.5", ["11.8", "12.1", "12.4"], []),
    ("2.6", ["11.8", "12.4"], ["12.6"]),
    ("2.7", ["11.8", "12.6"], ["12.8"]),
    ("2.8", ["12.6", "12.8"], ["12.9"]),
    ("2.9", ["12.6", "12.8"], ["13.0"]),
    ("2.10", ["12.6", "12.8"], ["13.0"]),
    # rows added from pytorch/pytorch RELEASE.md
    ("2.11", ["12.6", "12.8", "13.0"], []),
    ("2.12", ["12.6", "13.0"], ["13.2"]),
    ("2.13", ["12.6", "13.0"], ["13.2"]),
    ("2.14", ["12.6", "13.0", "13.2"], []),
]
# gpu-facts.md table 2 (GA rows)
PUBLISHED_DRIVER = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.4": "550.54.14",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}
ALL_CUDA = sorted(PUBLISHED_DRIVER, key=compat.version_key)


@pytest.mark.parametrize("torch_minor,stable,experimental", PUBLISHED_TORCH)
def test_every_published_torch_row_accepts_its_cuda_and_rejects_the_rest(torch_minor, stable, experimental):
    version = f"{torch_minor}.0"
    for cuda in ALL_CUDA:
        if cuda in stable + experimental:
            assert compat.check_torch_cuda(version, cuda).minor == torch_minor
        else:
            with pytest.raises(CompatError) as err:
                compat.check_torch_cuda(version, cuda)
            for valid in stable + experimental:
                assert valid in str(err.value)
    assert compat.check_torch_cuda(version, "cpu").minor == torch_minor


def test_torch_29_with_cuda_118_is_refused_naming_the_cuda_it_has():
    with pytest.raises(CompatError) as err:
        compat.check_torch_cuda("2.9.1", "11.8")
    assert str(err.value) == "torch 2.9.1 has no wheel for CUDA 11.8; fix: torch 2.9 ships CUDA 12.6, 12.8, 13.0 (or cpu)"


@pytest.mark.parametrize("cuda,driver", PUBLISHED_DRIVER.items())
def test_every_cuda_row_has_its_published_minimum_driver(cuda, driver):
    assert compat.min_driver(cuda) == driver
    assert compat.require_cuda(cuda) == f"cuda>={cuda}"
    assert compat.driver_supports(driver, cuda)
    major, minor, *rest = driver.split(".")
    older = f"{int(major) - 1}.{minor}"
    assert not compat.driver_supports(older, cuda)


def test_a_cuda_without_a_driver_row_is_refused_with_how_to_add_it():
    with pytest.raises(CompatError) as err:
        compat.check_torch_cuda("2.14.1", "13.2")
    assert "CUDA 13.2 is not in gpurig's driver table" in str(err.value)
    assert "CUDA_RELEASES" in str(err.value)


def test_driver_comparison_is_numeric_not_textual():
    # '570.124.06' > '570.26' numerically, though not as text
    assert compat.driver_supports("570.124.06", "12.8")
    assert not compat.driver_supports("565.57.01", "12.8")


def test_cpu_images_need_no_driver():
    assert compat.min_driver("cpu") is None
    assert compat.require_cuda("cpu") is None
    assert compat.driver_supports("1.0", "cpu")


def test_unknown_torch_and_cuda_name_the_known_ones():
    with pytest.raises(CompatError, match="2.4, 2.5"):
        compat.torch_release("1.13.1")
    with pytest.raises(CompatError, match="11.8, 12.0"):
        compat.cuda_release("10.2")


@pytest.mark.parametrize(
    "torch,python,ok",
    [("2.4.1", "3.8", True), ("2.4.1", "3.13", False), ("2.9.1", "3.9", False), ("2.9.1", "3.14", True)],
)
def test_python_range_per_torch(torch, python, ok):
    if ok:
        compat.check_python(torch, python)
    else:
        with pytest.raises(CompatError, match=f"no wheel for Python {python}"):
            compat.check_python(torch, python)


@pytest.mark.parametrize(
    "base,python",
    [
        ("debian:bookworm-slim", "3.11"),
        ("docker.io/library/debian:bookworm", "3.11"),
        ("ubuntu:22.04", "3.10"),
        ("ubuntu:24.04", "3.12"),
        ("registry.local/ml/custom:1", None),
    ],
)
def test_base_python(base, python):
    assert compat.base_python(base) == python


def test_cuda_tags_match_pytorch_index_names():
    assert compat.cuda_tag("12.8") == "cu128"
    assert compat.cuda_tag("13.0") == "cu130"
    assert compat.cuda_tag("cpu") == "cpu"


def test_one_driver_comparison_for_module_smi_and_package_versions():
    from gpurig.image.compat import driver_at_least, driver_key

    assert driver_key("570.133.20") == (570, 133, 20) and driver_key("1:535.247.01-1~deb12u1") == (535, 247, 1)
    assert driver_at_least("580.65.06", "580.65.06") and driver_at_least("1:580.82.07-1", "580.65.06")
    assert not driver_at_least("570.133.20", "580.65.06") and not driver_at_least("N/A", "525.60.13")
    # one patch or one minor below the minimum is below it: the whole version counts, not its branch alone
    assert not driver_at_least("580.65.05", "580.65.06") and not driver_at_least("580.64.99", "580.65.06")


@pytest.mark.parametrize("version", ["9" * 5000, "570." + "1" * 5000, "٥٧٠.١٣٣", "５７０.133"])
def test_a_driver_version_of_huge_or_foreign_digits_is_no_version_not_a_traceback(version):
    from gpurig.image.compat import driver_at_least, driver_key

    # int() of a 5,000-digit part raised ValueError; re's \d read Arabic-Indic digits as 570
    assert driver_key(version) == () and not driver_at_least(version, "525.60.13")
