"""Package the Helm chart deploy/helm/gpushare without Helm's binary: the chart archive
``gpushare-<version>.tgz`` that `helm package` makes, and an OCI image layout on disk holding
that chart as `helm push` stores it in a registry.

    python deploy/helm/package.py [--chart DIR] [--out DIR]   # default out: dist/

Both are byte-for-byte reproducible (entries' times are SOURCE_DATE_EPOCH, else 0), so two
runs of one checkout give identical files and digests. Standard library and PyYAML only.

The archive, as Helm's chartutil.Save writes it: a gzip stream (Helm's header: extra field
and the comment "Helm") of a tar whose entries all lie under ``gpushare/``: ``Chart.yaml``
first (the chart's metadata as Helm serialises it: its known fields, keys sorted, empty ones
left out), then ``values.yaml``, ``values.schema.json``, the templates and the other files
in the order Helm's loader walks the folder, each mode 0644, ``.helmignore`` respected.

The OCI layout (``<out>/gpushare-<version>-oci``: ``oci-layout``, ``index.json``,
``blobs/sha256/``), as Helm's registry client pushes a chart: a manifest
``application/vnd.oci.image.manifest.v1+json`` whose config is the metadata as JSON
(``application/vnd.cncf.helm.config.v1+json``) and whose one layer is the archive itself
(``application/vnd.cncf.helm.chart.content.v1.tar+gzip``), with Helm's manifest annotations;
index.json names it by the chart's version (``org.opencontainers.image.ref.name``). Copy it
to a registry with `oras cp --from-oci-layout DIR:<version> REGISTRY/charts/gpushare:<version>`
or push the .tgz with `helm push` (deploy/image/README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import sys
import tarfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpushare"

# helm.sh/helm pkg/registry constants.go; OCI image-spec.
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.cncf.helm.config.v1+json"
CHART_LAYER_MEDIA_TYPE = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
LAYOUT_VERSION = "1.0.0"

# Helm's gzip header (chartutil.Save): this extra field and the comment "Helm".
GZIP_EXTRA = b"+aHR0cHM6Ly95b3V0dS5iZS96OVV6MWljandyTQo="
GZIP_COMMENT = b"Helm"
FILE_MODE = 0o644
BLOCK_BYTES = 512

# pkg/chart Metadata, in its field order (its JSON); Chart.yaml's other keys are not kept.
METADATA_FIELDS = (
    "name", "home", "sources", "version", "description", "keywords", "maintainers", "icon",
    "apiVersion", "condition", "tags", "appVersion", "deprecated", "annotations",
    "kubeVersion", "dependencies", "type",
)  # fmt: skip
MAINTAINER_FIELDS = ("name", "email", "url")
SPECIAL_FILES = ("Chart.yaml", "values.yaml", "values.schema.json")
DEFAULT_IGNORE = "templates/.?*"  # Helm's loader always skips these


# -- which files, in which order ------------------------------------------------------------


@dataclass(frozen=True)
class IgnoreRule:
    """One line of .helmignore, with Helm's (pkg/ignore) meaning."""

    pattern: re.Pattern[str]
    negate: bool
    dir_only: bool
    whole_path: bool

    @classmethod
    def parse(cls, line: str) -> IgnoreRule | None:
        line = line.strip()
        if not line or line.startswith("#"):
            return None
        negate = line.startswith("!")
        line = line.removeprefix("!")
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        whole_path = "/" in line
        return cls(re.compile(glob_regex(line.lstrip("/"))), negate, dir_only, whole_path)

    def matches(self, path: str) -> bool:
        return bool(self.pattern.fullmatch(path if self.whole_path else path.rsplit("/", 1)[-1]))


def glob_regex(glob: str) -> str:
    """Go's filepath.Match pattern as a regular expression (``*`` and ``?`` stop at ``/``)."""
    out, i = [], 0
    while i < len(glob):
        char = glob[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and "]" in glob[i + 1 :]:
            end = glob.index("]", i + 1)
            body = glob[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
            i = end
        elif char == "\\" and i + 1 < len(glob):
            i += 1
            out.append(re.escape(glob[i]))
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def ignored(rules: list[IgnoreRule], path: str, is_dir: bool) -> bool:
    """Helm's Rules.Ignore: negated rules end the search where they do not match."""
    for rule in rules:
        if rule.negate:
            if (rule.dir_only and not is_dir) or not rule.matches(path):
                return True
            continue
        if rule.dir_only and not is_dir:
            continue
        if rule.matches(path):
            return True
    return False


def walk(chart_dir: Path) -> list[str]:
    """The chart's files relative to it, as Helm's loader walks them (each folder's entries
    sorted by name, a folder's files where the folder sorts), less .helmignore's."""
    ignore_file = chart_dir / ".helmignore"
    lines = ignore_file.read_text().splitlines() if ignore_file.exists() else []
    rules = [r for r in map(IgnoreRule.parse, [*lines, DEFAULT_IGNORE]) if r is not None]
    found: list[str] = []

    def visit(folder: Path, prefix: str) -> None:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            path = prefix + entry.name
            if entry.is_dir():
                if not ignored(rules, path, True):
                    visit(Path(entry.path), path + "/")
            elif not ignored(rules, path, False):
                if not entry.is_file():
                    raise SystemExit(f"package.py: {path} is not a regular file")
                found.append(path)

    visit(chart_dir, "")
    return found


def chart_entries(chart_dir: Path) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """The chart's metadata and its archive's entries ({name under <chart>/: bytes}) in
    Helm's order: Chart.yaml, values.yaml, values.schema.json, templates, other files."""
    paths = walk(chart_dir)
    if "Chart.yaml" not in paths:
        raise SystemExit(f"package.py: {chart_dir} has no Chart.yaml")
    if any(p == "Chart.lock" or p.startswith("charts/") for p in paths):
        raise SystemExit(
            "package.py: charts with dependencies (charts/, Chart.lock) are not packaged"
        )
    meta = metadata((chart_dir / "Chart.yaml").read_text())
    entries = [("Chart.yaml", chart_yaml(meta))]
    entries += [(p, (chart_dir / p).read_bytes()) for p in SPECIAL_FILES[1:] if p in paths]
    rest = [p for p in paths if p not in SPECIAL_FILES]
    entries += [(p, (chart_dir / p).read_bytes()) for p in rest if p.startswith("templates/")]
    entries += [(p, (chart_dir / p).read_bytes()) for p in rest if not p.startswith("templates/")]
    return meta, [(f"{meta['name']}/{name}", data) for name, data in entries]


# -- the metadata, as Helm serialises it ----------------------------------------------------


def sanitize(text: str) -> str:
    """Helm's sanitizeString: white space becomes a space, unprintable characters go."""
    return "".join(" " if c.isspace() else c for c in text if c.isspace() or c.isprintable())


def metadata(chart_yaml_text: str) -> dict[str, Any]:
    """Chart.yaml's known fields, sanitised as Helm's Metadata.Validate does, in Helm's field
    order, empty ones left out (omitempty)."""
    raw = yaml.safe_load(chart_yaml_text) or {}
    for key in ("apiVersion", "name", "version"):
        if not raw.get(key):
            raise SystemExit(f"package.py: Chart.yaml: {key} is required")
    if raw.get("dependencies"):
        raise SystemExit("package.py: Chart.yaml: dependencies are not packaged here")
    meta: dict[str, Any] = {}
    for key in METADATA_FIELDS:
        value = raw.get(key)
        if key == "maintainers" and value:
            value = [{f: sanitize(str(m[f])) for f in MAINTAINER_FIELDS if m.get(f)} for m in value]
        elif key in ("sources", "keywords") and value:
            value = [sanitize(str(v)) for v in value]
        elif key == "annotations" and value:
            value = {str(k): str(v) for k, v in value.items()}
        elif key == "deprecated":
            value = bool(value)
        elif value is not None:
            value = sanitize(str(value))
        if value:
            meta[key] = value
    return meta


def chart_yaml(meta: dict[str, Any]) -> bytes:
    """Chart.yaml as Helm writes it into the archive (sigs.k8s.io/yaml: keys sorted)."""
    return yaml.safe_dump(meta, sort_keys=True, default_flow_style=False).encode()


def go_json(value: Any) -> bytes:
    """JSON as Go's encoding/json writes it: compact, <, > and & escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escape)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode()


# -- the archive -----------------------------------------------------------------------------


def tar_bytes(entries: list[tuple[str, bytes]], mtime: int) -> bytes:
    """A ustar archive of the entries, as Go's archive/tar writes one (no record padding)."""
    out = bytearray()
    for name, data in entries:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), FILE_MODE, mtime
        out += info.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict")
        out += data + b"\0" * (-len(data) % BLOCK_BYTES)
    return bytes(out + b"\0" * (2 * BLOCK_BYTES))


def gzip_bytes(data: bytes) -> bytes:
    """A gzip member with Helm's header (FEXTRA and FCOMMENT, no time, OS unknown)."""
    header = b"\x1f\x8b\x08" + bytes([0x04 | 0x10]) + b"\0\0\0\0" + b"\x00\xff"
    header += struct.pack("<H", len(GZIP_EXTRA)) + GZIP_EXTRA + GZIP_COMMENT + b"\0"
    deflate = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflate.compress(data) + deflate.flush()
    trailer = struct.pack("<II", zlib.crc32(data) & 0xFFFFFFFF, len(data) & 0xFFFFFFFF)
    return header + body + trailer


# -- the OCI layout --------------------------------------------------------------------------


def descriptor(media_type: str, data: bytes) -> dict[str, Any]:
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }


def manifest_annotations(meta: dict[str, Any], created: str) -> dict[str, str]:
    """Helm's generateOCIAnnotations: description, title, version, url, created, source,
    authors, then the chart's own annotations (never over title or version)."""
    found = {
        "org.opencontainers.image.description": meta.get("description", ""),
        "org.opencontainers.image.title": meta["name"],
        "org.opencontainers.image.version": meta["version"],
        "org.opencontainers.image.url": meta.get("home", ""),
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.source": (meta.get("sources") or [""])[0],
        "org.opencontainers.image.authors": ", ".join(
            m.get("name", "") + (f" ({m['email']})" if m.get("email") else "")
            for m in meta.get("maintainers", [])
        ),
    }
    found = {k: v for k, v in found.items() if v.strip()}
    for key, value in meta.get("annotations", {}).items():
        if key not in ("org.opencontainers.image.title", "org.opencontainers.image.version"):
            found[key] = value
    return dict(sorted(found.items()))


def write_layout(folder: Path, meta: dict[str, Any], archive: bytes, created: str) -> None:
    """The OCI image layout of the chart at ``folder`` (replaced when it exists)."""
    config = go_json(meta)
    manifest = go_json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": descriptor(CONFIG_MEDIA_TYPE, config),
            "layers": [descriptor(CHART_LAYER_MEDIA_TYPE, archive)],
            "annotations": manifest_annotations(meta, created),
        }
    )
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [
            {
                **descriptor(MANIFEST_MEDIA_TYPE, manifest),
                "annotations": {REF_NAME: meta["version"]},
            }
        ],
    }
    if folder.exists():
        shutil.rmtree(folder)
    blobs = folder / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for blob in (config, archive, manifest):
        (blobs / hashlib.sha256(blob).hexdigest()).write_bytes(blob)
    (folder / "oci-layout").write_bytes(go_json({"imageLayoutVersion": LAYOUT_VERSION}))
    (folder / "index.json").write_bytes(go_json(index))


# -- the command -----------------------------------------------------------------------------


def source_date_epoch() -> int:
    """The entries' time: SOURCE_DATE_EPOCH (reproducible builds' convention), else 0."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "0")
    if not value.isdigit():
        raise SystemExit(f"package.py: SOURCE_DATE_EPOCH must be whole seconds (got {value!r})")
    return int(value)


def package(chart_dir: Path, out: Path) -> tuple[Path, Path]:
    """Write ``<out>/<name>-<version>.tgz`` and the layout ``<out>/<name>-<version>-oci``."""
    epoch = source_date_epoch()
    meta, entries = chart_entries(chart_dir)
    archive = gzip_bytes(tar_bytes(entries, epoch))
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{meta['name']}-{meta['version']}"
    tgz = out / f"{stem}.tgz"
    tgz.write_bytes(archive)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    layout = out / f"{stem}-oci"
    write_layout(layout, meta, archive, created)
    return tgz, layout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chart", type=Path, default=CHART, help="the chart's folder")
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="where to write")
    args = parser.parse_args(argv)
    tgz, layout = package(args.chart, args.out)
    print(f"wrote {tgz} ({tgz.stat().st_size} bytes) and the OCI layout {layout}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
