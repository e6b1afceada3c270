"""Put a packaged release on disk for a benchmark repository whose pinned revision no snapshot holds (issue #22).

    .venv/bin/python bench/semble_eval/stand_ins.py [--repo axios|guzzle|nlohmann-json ...]

These repositories' git snapshots (and the forks tried) stop before semble's pin, so fetch_repos.py cannot extract
them. Their indexed folder ships, file for file, in a package this machine can reach (npm, Debian). The marker says
"NOT the pinned revision" and names the package, so every table that scores them can say so:

- axios (tune, `lib`): npm `axios@1.15.0`, the newest release before the pin entered semble's repos.json
  (2026-04-15); its files hold every annotated line span's start (class Axios at line 22, mergeConfig at 17,
  InterceptorManager at 5). 1.13.2 and older put class Axios at line 21, so its symbol query missed the span.
- guzzle (report, `src`): Debian `php-guzzlehttp-guzzle` 7.4.5-1 (`/usr/share/php/GuzzleHttp` is upstream's src/;
  Debian's generated autoload.php is dropped). Every file the annotations name is there; they name no line spans.
- nlohmann-json (tune, `include/nlohmann`): Debian `nlohmann-json3-dev` 3.11.2-2.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPORA = HERE / "corpora"
MARKER = ".semble_eval.json"

# repo -> (package kind, package, path inside the unpacked package, folder semble indexes, files to drop, why)
STAND_INS: dict[str, tuple[str, str, str, str, tuple[str, ...], str]] = {
    "axios": (
        "npm",
        "axios@1.15.0",
        "package/lib",
        "lib",
        (),
        "the newest release before the pin entered semble's repos.json (2026-04-15); it holds each annotated line "
        "span's start (class Axios at 22, mergeConfig at 17, InterceptorManager at 5)",
    ),
    "guzzle": (
        "debian",
        "php-guzzlehttp-guzzle=7.4.5-1",
        "usr/share/php/GuzzleHttp",
        "src",
        ("autoload.php",),
        "upstream's src/ as Debian installs it; Debian's generated autoload.php removed",
    ),
    "nlohmann-json": (
        "debian",
        "nlohmann-json3-dev=3.11.2-2",
        "usr/include/nlohmann",
        "include/nlohmann",
        (),
        "the tune half's only C++ repository; every annotated file exists there",
    ),
}


def unpack(kind: str, package: str, work: Path) -> Path:
    """Download one package into `work` and unpack it; returns the unpacked root."""
    out = work / "x"
    out.mkdir()
    if kind == "npm":
        subprocess.run(["npm", "pack", package, "--pack-destination", str(work)], check=True, capture_output=True)
        with tarfile.open(next(work.glob("*.tgz"))) as tar:
            tar.extractall(out, filter="data")
    else:
        subprocess.run(["apt-get", "download", package], check=True, capture_output=True, cwd=work)
        subprocess.run(["dpkg-deb", "-x", str(next(work.glob("*.deb"))), str(out)], check=True)
    return out


def place(repo: str, url: str) -> Path:
    kind, package, inner, folder, drop, why = STAND_INS[repo]
    dest = CORPORA / repo
    with tempfile.TemporaryDirectory() as tmp:
        src = unpack(kind, package, Path(tmp)) / inner
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(src, dest / folder)
    for name in drop:
        (dest / folder / name).unlink(missing_ok=True)
    marker = {
        "revision": f"NOT the pinned revision: {kind} {package}, {inner} extracted as {folder}/: {why}",
        "folder": folder,
        "url": url,
        "snapshot": f"{kind}:{package}",
        "files": sum(1 for p in (dest / folder).rglob("*") if p.is_file()),
    }
    (dest / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return dest / folder


def main() -> None:
    import split as split_mod

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", action="append", choices=sorted(STAND_INS), help="only these (repeatable)")
    args = ap.parse_args()
    entries = split_mod.load()
    for repo in args.repo or sorted(STAND_INS):
        print(f"{repo:15} -> {place(repo, entries[repo]['url'])}")


if __name__ == "__main__":
    main()
