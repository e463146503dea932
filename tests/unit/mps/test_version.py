"""The MPS control binary must come from the running driver's release."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.core.errors import MpsError
from agent.mps.version import check_release, embedded_release, mismatch


@pytest.mark.parametrize(
    ("binary", "release"),
    [
        (
            b"\x7fELF...\x00Using log directory: %s\x00535.309.01\x00CUDA_MPS_CLIENT\x00",
            "535.309.01",
        ),
        (b"\x00550.54\x00", "550.54"),
        (b"no release in here 535.309.01 without its NULs", None),
        (b"\x00535.309.01\x00\x00550.54.15\x00", None),  # two: cannot tell
        (b"\x00535.309.01\x00...\x00535.309.01\x00", "535.309.01"),
        (b"\x001.2.3\x00", None),
    ],
)
def test_the_release_a_binary_names(binary: bytes, release: str | None) -> None:
    assert embedded_release(binary) == release


@pytest.mark.parametrize(
    ("binary_release", "driver", "refused"),
    [
        ("535.309.01", "535.309.01", False),
        ("535.309.01", "550.54.15", True),
        (None, "550.54.15", False),  # cannot tell: warned, not refused
        ("535.309.01", None, False),  # no driver (a simulated node)
    ],
)
def test_a_binary_of_another_release_is_refused(
    binary_release: str | None, driver: str | None, refused: bool
) -> None:
    why = mismatch("/usr/bin/nvidia-cuda-mps-control", binary_release, driver)
    assert (why is not None) is refused
    if why:
        assert "535.309.01" in why and "550.54.15" in why and "mps.control_binary" in why


def test_a_file_is_read_and_refused(tmp_path: Path) -> None:
    binary = tmp_path / "nvidia-cuda-mps-control"
    binary.write_bytes(b"\x7fELF\x00535.309.01\x00")
    check_release(str(binary), "535.309.01")
    check_release(str(binary), None)
    with pytest.raises(MpsError, match=r"from driver release 535\.309\.01 but the running driver"):
        check_release(str(binary), "550.54.15")
    with pytest.raises(MpsError, match="cannot read"):
        check_release(str(tmp_path / "missing"), "550.54.15")


@pytest.mark.mps_binary
def test_the_real_binary_names_its_release() -> None:
    path = shutil.which("nvidia-cuda-mps-control")
    assert path is not None
    release = embedded_release(Path(path).read_bytes())
    assert release is not None and release.count(".") >= 1, "the real binary names its release"
