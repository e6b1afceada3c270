"""Put each benchmark repository of split.json on disk at its pinned revision, from git snapshots already fetched.

    .venv/bin/python bench/semble_eval/fetch_repos.py [--half tune|report|all] [--repo NAME ...] [--check]

No network here: a repository arrives only through the agent tool `fetch` (source `github:<owner>/<name>`), which
leaves a bare git dir under /work/.mirror/<owner>+<name>/. For every repository of the chosen half this script
looks for that git dir, checks that it holds the pinned revision, and extracts the indexed folder at that revision
(`git archive <revision> -- <folder>`, the whole tree when semble indexes the whole repository) into
corpora/<repo>/, keeping the folder's path, so the tree to index is corpora/<repo>/<folder> (see index_root).
When that git dir is absent or older than the pin, any fetched /work/.mirror/<other owner>+<name>/ that holds the
revision serves instead (a fork, or the repository's new home, e.g. Kludex/starlette); the marker names it.
A marker (corpora/<repo>/.semble_eval.json) records revision and folder; a tree whose marker matches is left alone.
corpora/ is gitignored. The end of the output lists, for every repository not on disk, the `fetch` source to ask for.
Exit status: 0 when every selected repository is on disk at its revision, 1 otherwise.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import split as split_mod

HERE = Path(__file__).resolve().parent
CORPORA = HERE / "corpora"
MIRROR_ROOT = Path("/work/.mirror")
MARKER = ".semble_eval.json"


@dataclass
class Outcome:
    repo: str
    # "ok" (already there), "extracted", "fetched, not extracted" (--check), "not fetched",
    # "revision not in snapshot", "folder missing", "archive failed"
    status: str
    detail: str = ""
    files: int | None = None

    @property
    def on_disk(self) -> bool:
        return self.status in ("ok", "extracted")


def owner_name(url: str) -> tuple[str, str]:
    """('tokio-rs', 'axum') from https://github.com/tokio-rs/axum.git."""
    parts = url.rstrip("/").removesuffix(".git").split("/")
    return parts[-2], parts[-1]


def fetch_source(url: str) -> str:
    owner, name = owner_name(url)
    return f"github:{owner}/{name}"


def _is_git_dir(path: Path) -> bool:
    return (path / "HEAD").is_file() and (path / "objects").is_dir()


def find_git_dir(url: str, root: Path = MIRROR_ROOT) -> Path | None:
    """The bare git dir `fetch` left for this repository: <root>/<owner>+<name>/repo, or any git dir below it."""
    owner, name = owner_name(url)
    base = root / f"{owner}+{name}"
    if not base.is_dir():
        matches = [p for p in root.glob("*+*") if p.name.lower() == f"{owner}+{name}".lower()] if root.is_dir() else []
        if not matches:
            return None
        base = matches[0]
    return _git_dir_below(base)


def _git_dir_below(base: Path) -> Path | None:
    for candidate in (base / "repo", base, *sorted(base.glob("*/")), *sorted(base.glob("*/*/"))):
        if _is_git_dir(candidate):
            return candidate
    return None


def fork_git_dirs(url: str, root: Path = MIRROR_ROOT) -> list[Path]:
    """Git dirs `fetch` left for other owners of the same repository name (<root>/*+<name>): forks or a moved home."""
    owner, name = owner_name(url)
    if not root.is_dir():
        return []
    dirs = []
    for base in sorted(root.glob("*+*")):
        base_owner, _, base_name = base.name.partition("+")
        if base_name.lower() != name.lower() or base_owner.lower() == owner.lower():
            continue
        git_dir = _git_dir_below(base)
        if git_dir is not None:
            dirs.append(git_dir)
    return dirs


def _git(git_dir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True)


def has_revision(git_dir: Path, revision: str) -> bool:
    return _git(git_dir, "cat-file", "-e", f"{revision}^{{commit}}").returncode == 0


def index_root(repo: str, entry: dict[str, Any], corpora: Path = CORPORA) -> Path:
    """The folder to index for one repository: corpora/<repo>/<folder> (semble's RepoSpec.benchmark_dir)."""
    base = corpora / repo
    return base / entry["folder"] if entry.get("folder") else base


def materialize(
    repo: str, entry: dict[str, Any], *, root: Path = MIRROR_ROOT, corpora: Path = CORPORA, check_only: bool = False
) -> Outcome:
    dest = corpora / repo
    want = {"revision": entry["revision"], "folder": entry.get("folder"), "url": entry["url"]}
    marker = dest / MARKER
    if marker.is_file():
        try:
            if {k: json.loads(marker.read_text()).get(k) for k in want} == want:
                return Outcome(repo, "ok", str(index_root(repo, entry, corpora)))
        except json.JSONDecodeError:
            pass
    git_dir = find_git_dir(entry["url"], root)
    if git_dir is None:
        git_dir = next((d for d in fork_git_dirs(entry["url"], root) if has_revision(d, entry["revision"])), None)
    if git_dir is None:
        return Outcome(repo, "not fetched", f"nothing under {root}/{'+'.join(owner_name(entry['url']))}")
    if not has_revision(git_dir, entry["revision"]):
        # The owner's snapshot can be older than the pin: take a fetched fork (or moved home) that holds it.
        fork = next((d for d in fork_git_dirs(entry["url"], root) if has_revision(d, entry["revision"])), None)
        if fork is None:
            return Outcome(repo, "revision not in snapshot", f"{git_dir} lacks {entry['revision'][:12]}")
        git_dir = fork
    paths = [entry["folder"]] if entry.get("folder") else []
    listing = _git(git_dir, "ls-tree", "-r", "--name-only", entry["revision"], "--", *paths)
    files = len(listing.stdout.splitlines())
    if listing.returncode != 0 or files == 0:
        return Outcome(repo, "folder missing", f"{entry.get('folder')!r} is empty at {entry['revision'][:12]}")
    if check_only:
        return Outcome(repo, "fetched, not extracted", str(git_dir), files)
    archive = _git(git_dir, "archive", "--format=tar", entry["revision"], "--", *paths)
    if archive.returncode != 0:
        return Outcome(repo, "archive failed", archive.stderr.decode(errors="replace").strip())
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    marker.write_text(json.dumps({**want, "snapshot": str(git_dir), "files": files}, indent=2) + "\n")
    return Outcome(repo, "extracted", str(index_root(repo, entry, corpora)), files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--half", choices=("tune", "report", "all"), default="all")
    ap.add_argument("--repo", action="append", default=[], help="only these repositories (repeatable)")
    ap.add_argument("--check", action="store_true", help="report only; extract nothing")
    ap.add_argument("--mirror-root", type=Path, default=MIRROR_ROOT)
    ap.add_argument("--corpora", type=Path, default=CORPORA)
    ap.add_argument("--split", type=Path, default=split_mod.SPLIT)
    args = ap.parse_args(argv)
    entries = split_mod.load(args.split)
    unknown = set(args.repo) - set(entries)
    if unknown:
        print(f"not in {args.split.name}: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    names = args.repo or split_mod.repos_in(args.half, args.split)
    outcomes = []
    for name in names:
        o = materialize(name, entries[name], root=args.mirror_root, corpora=args.corpora, check_only=args.check)
        outcomes.append(o)
        files = f"{o.files} files" if o.files is not None else ""
        print(f"{name:20} {entries[name]['revision'][:12]}  {o.status:26} {files:>12}  {o.detail}")
    missing = [o for o in outcomes if not o.on_disk]
    print(f"\n{len(outcomes) - len(missing)} of {len(outcomes)} on disk at their pinned revision")
    to_fetch = [o for o in missing if o.status in ("not fetched", "revision not in snapshot")]
    if to_fetch:
        print("Ask the agent tool `fetch` for these sources, then run this again:")
        for o in to_fetch:
            print(f"  {fetch_source(entries[o.repo]['url']):45} # {o.repo}: {o.status}")
    others = [o for o in missing if o not in to_fetch]
    if others:
        print("Fetched but not on disk: " + ", ".join(f"{o.repo} ({o.status})" for o in others))
    return 0 if not missing else 1


if __name__ == "__main__":
    raise SystemExit(main())
