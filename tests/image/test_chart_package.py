"""deploy/helm/package.py: the chart archive and its OCI layout, checked against Helm's own
Go code (helm-python-sdk, a dev dependency): the same entries as `helm package`, an archive
Helm loads and renders like the chart folder, a layout whose every digest and size holds,
and the same bytes from two runs. Fast; no container engine."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO

CHART = REPO / "deploy" / "helm" / "gpushare"
KUBE_VERSION = "v1.34.2"
# A fixed token: the chart makes a random one otherwise.
TOKEN = {"token": {"value": "x" * 48}}
VALUES: list[dict[str, Any]] = [TOKEN, {**TOKEN, "shm": {"size": "64MiB"}, "path": "both"}]


def load(name: str) -> Any:
    path = REPO / "deploy" / "helm" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"gpushare_{name}_under_test", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


PACKAGE = load("package")
RENDER = load("render")


def members(archive: Path) -> list[tuple[str, int, bytes]]:
    with tarfile.open(archive) as tar:
        return [(m.name, m.mode, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]


def helm_package(chart_dir: Path, out: Path) -> Path:
    helm_python = pytest.importorskip("helm_python")
    return Path(helm_python.package(str(chart_dir), destination=str(out)))


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the .tgz, the OCI layout) of this checkout's chart."""
    tgz, layout = PACKAGE.package(CHART, tmp_path_factory.mktemp("dist"))
    return Path(tgz), Path(layout)


def test_the_archive_holds_what_helm_package_puts_in_it(
    packaged: tuple[Path, Path], tmp_path: Path
) -> None:
    tgz, _ = packaged
    assert tgz.name == f"gpushare-{load_chart_version()}.tgz"
    ours, helms = members(tgz), members(helm_package(CHART, tmp_path))
    assert [m[0] for m in ours] == [m[0] for m in helms]  # names, and Helm's order
    assert ours == helms  # modes and bytes (Chart.yaml as Helm writes it)
    assert ours[0][0] == "gpushare/Chart.yaml"
    # Every other file of the chart's folder, byte for byte.
    files = {p.relative_to(CHART).as_posix() for p in CHART.rglob("*") if p.is_file()}
    assert {m[0].removeprefix("gpushare/") for m in ours} == files
    for name, _, data in ours[1:]:
        assert data == (CHART / name.removeprefix("gpushare/")).read_bytes(), name
    with tarfile.open(tgz) as tar:
        assert {m.mtime for m in tar.getmembers()} == {0}
        assert {(m.uid, m.gid, m.type) for m in tar.getmembers()} == {(0, 0, tarfile.REGTYPE)}


def load_chart_version() -> str:
    import yaml

    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"])


def test_the_unpacked_archive_renders_as_the_chart_folder(
    packaged: tuple[Path, Path], tmp_path: Path
) -> None:
    tgz, _ = packaged
    with tarfile.open(tgz) as tar:
        tar.extractall(tmp_path, filter="data")
    for values in VALUES:
        from_archive = RENDER.render_all(
            values, kube_version=KUBE_VERSION, chart_dir=tmp_path / "gpushare"
        )
        assert from_archive == RENDER.render_all(values, kube_version=KUBE_VERSION)
    helm_python = pytest.importorskip("helm_python")
    loaded = helm_python.Chart.load_archive(tgz.read_bytes())
    assert (loaded.name, loaded.version) == ("gpushare", load_chart_version())


def blob(layout: Path, digest: str) -> bytes:
    algorithm, _, hexdigest = digest.partition(":")
    assert algorithm == "sha256", digest
    data = (layout / "blobs" / "sha256" / hexdigest).read_bytes()
    assert hashlib.sha256(data).hexdigest() == hexdigest, f"blob {digest} is not its digest"
    return data


def resolve(layout: Path, descriptor: dict[str, Any]) -> bytes:
    data = blob(layout, descriptor["digest"])
    assert len(data) == descriptor["size"], descriptor
    return data


def test_the_oci_layout_is_the_chart_as_helm_stores_it_in_a_registry(
    packaged: tuple[Path, Path],
) -> None:
    tgz, layout = packaged
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout / "index.json").read_text())
    assert index["schemaVersion"] == 2
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    (entry,) = index["manifests"]
    assert entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert entry["annotations"] == {"org.opencontainers.image.ref.name": load_chart_version()}
    manifest = json.loads(resolve(layout, entry))
    assert manifest["mediaType"] == entry["mediaType"] and manifest["schemaVersion"] == 2
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
    assert resolve(layout, layer) == tgz.read_bytes()
    config = resolve(layout, manifest["config"])
    annotations = manifest["annotations"]
    assert annotations["org.opencontainers.image.title"] == "gpushare"
    assert annotations["org.opencontainers.image.version"] == load_chart_version()
    # The config is the chart's metadata exactly as Helm's Go code marshals it.
    helm_python = pytest.importorskip("helm_python")
    from helm_python import _native

    chart = helm_python.Chart.load_archive(tgz.read_bytes())
    assert config == _native.call_string("helm_chart_metadata", chart._raw()).encode()
    # No blob that nothing names.
    named = {entry["digest"], manifest["config"]["digest"], layer["digest"]}
    stored = {f"sha256:{p.name}" for p in (layout / "blobs" / "sha256").iterdir()}
    assert stored == named


def test_two_runs_give_identical_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = PACKAGE.package(CHART, tmp_path / "one")
    second = PACKAGE.package(CHART, tmp_path / "two")

    def tree(root: Path) -> dict[str, bytes]:
        return {
            p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()
        }

    assert tree(tmp_path / "one") == tree(tmp_path / "two")
    assert Path(first[0]).read_bytes() == Path(second[0]).read_bytes()
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    stamped, _ = PACKAGE.package(CHART, tmp_path / "three")
    with tarfile.open(stamped) as tar:
        assert {m.mtime for m in tar.getmembers()} == {1767225600}


def test_helmignore_is_respected_as_helm_does(tmp_path: Path) -> None:
    chart = tmp_path / "gpushare"
    shutil.copytree(CHART, chart)
    (chart / ".helmignore").write_text("# local files\n*.orig\nscratch/\n/NOTES.md\n")
    (chart / "templates" / "agent" / "daemonset.yaml.orig").write_text("old\n")
    (chart / "scratch").mkdir()
    (chart / "scratch" / "notes.txt").write_text("x\n")
    (chart / "NOTES.md").write_text("x\n")
    (chart / "README.md").write_text("# the chart\n")
    (chart / "templates" / ".hidden.yaml").write_text("x: 1\n")
    tgz, _ = PACKAGE.package(chart, tmp_path / "ours")
    names = [m[0] for m in members(Path(tgz))]
    assert "gpushare/README.md" in names and "gpushare/.helmignore" in names
    for left_out in ("daemonset.yaml.orig", "scratch/", "NOTES.md", ".hidden.yaml"):
        assert not any(left_out in n for n in names), left_out
    assert names == [m[0] for m in members(helm_package(chart, tmp_path / "helm"))]


def test_the_command_writes_into_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert PACKAGE.main(["--out", str(tmp_path)]) == 0
    version = load_chart_version()
    assert (tmp_path / f"gpushare-{version}.tgz").is_file()
    assert (tmp_path / f"gpushare-{version}-oci" / "index.json").is_file()
    assert "wrote" in capsys.readouterr().out
    with tarfile.open(fileobj=io.BytesIO((tmp_path / f"gpushare-{version}.tgz").read_bytes())):
        pass
