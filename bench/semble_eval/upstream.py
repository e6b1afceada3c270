"""semble's benchmark as published: MinishLab/semble at one pinned commit, read from a git snapshot.

    .venv/bin/python bench/semble_eval/upstream.py sync [--mirror GIT_DIR]   # copy the benchmark files into upstream/
    .venv/bin/python bench/semble_eval/upstream.py published                 # (re)write semble_published.json
    .venv/bin/python bench/semble_eval/upstream.py show                      # where files are read from

The benchmark's data (repos.json, annotations/<repo>.json, results/) is never committed here: it is read from a git
snapshot of semble (the agent tool `fetch` with source `github:michalfedyna/semble`, a fork whose history holds the
upstream commit below; `github:MinishLab/semble` has no snapshot in the store), or from `upstream/` (gitignored), a
copy that `sync` extracts from that snapshot so the harness also runs where the snapshot is not (the device machine:
name `bench/semble_eval/upstream` in the run tool's `carry`). Only the few published numbers the reports compare
against are committed, in semble_published.json, with their source path and commit.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CACHE = HERE / "upstream"  # gitignored copy of benchmarks/{repos.json,annotations,results} at SEMBLE_COMMIT
PUBLISHED = HERE / "semble_published.json"

SEMBLE_REPO = "MinishLab/semble"
# upstream main on 2026-04-29, "prevent main branch (#51)", the newest upstream commit any stored snapshot holds
SEMBLE_COMMIT = "8d737aba127b76f3c729ef6925b2b17fd769d646"
SEMBLE_FETCH_SOURCE = "github:michalfedyna/semble"
MIRROR_CANDIDATES = (
    Path("/work/.mirror/MinishLab+semble/repo"),
    Path("/work/.mirror/michalfedyna+semble/repo"),
)
# semble's published hybrid run at that commit (benchmarks/run_benchmark.py, model minishlab/potion-code-16M) and
# the two single-leg runs of its ablation script (benchmarks/baselines/ablations.py), same commit
RESULTS_HYBRID = "benchmarks/results/semble-hybrid-0332378809c5.json"
RESULTS_ABLATIONS = "benchmarks/results/semble-ablations-215a04760692.json"
SYNCED = ("benchmarks/repos.json", "benchmarks/annotations", "benchmarks/results", "benchmarks/README.md")


class UpstreamMissing(Exception):
    """Neither upstream/ nor a git snapshot holding SEMBLE_COMMIT is on this machine."""


def blob_url(path: str) -> str:
    """The upstream file at the pinned commit, for citations."""
    return f"https://github.com/{SEMBLE_REPO}/blob/{SEMBLE_COMMIT}/{path}"


def _git(git_dir: Path, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True).stdout


def has_commit(git_dir: Path, commit: str = SEMBLE_COMMIT) -> bool:
    if not git_dir.is_dir():
        return False
    probe = subprocess.run(
        ["git", f"--git-dir={git_dir}", "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    return probe.returncode == 0


def find_mirror(explicit: Path | None = None) -> Path | None:
    """The first git snapshot that holds SEMBLE_COMMIT (an explicit one first)."""
    for candidate in ([explicit] if explicit else []) + list(MIRROR_CANDIDATES):
        if has_commit(candidate):
            return candidate
    return None


def _missing_message() -> str:
    return (
        f"semble's benchmark files are not here: neither {CACHE} nor a git snapshot holding {SEMBLE_COMMIT[:12]} "
        f"({', '.join(str(p) for p in MIRROR_CANDIDATES)}). Ask the agent tool `fetch` for "
        f"{SEMBLE_FETCH_SOURCE!r}, then run: .venv/bin/python bench/semble_eval/upstream.py sync"
    )


def read_bytes(path: str, *, mirror: Path | None = None) -> bytes:
    """One upstream file (path relative to semble's root) at SEMBLE_COMMIT: from upstream/, else from the snapshot."""
    cached = CACHE / path
    if cached.is_file():
        return cached.read_bytes()
    git_dir = find_mirror(mirror)
    if git_dir is None:
        raise UpstreamMissing(_missing_message())
    try:
        return _git(git_dir, "show", f"{SEMBLE_COMMIT}:{path}")
    except subprocess.CalledProcessError as e:
        raise FileNotFoundError(f"{path} is not in {SEMBLE_REPO}@{SEMBLE_COMMIT[:12]}") from e


def read_json(path: str, *, mirror: Path | None = None) -> Any:
    return json.loads(read_bytes(path, mirror=mirror).decode("utf-8"))


def load_repos(*, mirror: Path | None = None) -> dict[str, dict[str, Any]]:
    """benchmarks/repos.json by repository name: name, language, url, revision, benchmark_root (None = whole repo)."""
    return {item["name"]: item for item in read_json("benchmarks/repos.json", mirror=mirror)}


def load_annotations(repo: str, *, mirror: Path | None = None) -> list[dict[str, Any]]:
    """The raw items of benchmarks/annotations/<repo>.json (query, relevant, secondary, category, ...)."""
    return read_json(f"benchmarks/annotations/{repo}.json", mirror=mirror)


def sync(mirror: Path | None = None, dest: Path = CACHE) -> Path:
    """Extract SYNCED at SEMBLE_COMMIT from the snapshot into dest (replacing what was there)."""
    git_dir = find_mirror(mirror)
    if git_dir is None:
        raise UpstreamMissing(_missing_message())
    data = _git(git_dir, "archive", "--format=tar", SEMBLE_COMMIT, "--", *SYNCED)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    (dest / "SOURCE.json").write_text(
        json.dumps({"repo": SEMBLE_REPO, "commit": SEMBLE_COMMIT, "snapshot": str(git_dir)}, indent=2) + "\n"
    )
    return dest


def build_published(*, mirror: Path | None = None) -> dict[str, Any]:
    """The numbers side-by-side tables need, from semble's own result files at SEMBLE_COMMIT."""
    hybrid = read_json(RESULTS_HYBRID, mirror=mirror)
    ablations = read_json(RESULTS_ABLATIONS, mirror=mirror)
    repos: dict[str, dict[str, Any]] = {}
    for r in hybrid["repos"]:
        repos[r["repo"]] = {
            "language": r["language"],
            "chunks": r["chunks"],
            "ndcg10": r["ndcg10"],
            "ndcg5": r["ndcg5"],
            "by_category": r["by_category"],
        }
    legs = {"semble-bm25": "bm25", "semble-semantic": "semantic"}
    for r in ablations["repos"]:
        leg = legs.get(r["mode"])
        if leg and r["repo"] in repos:
            repos[r["repo"]][leg] = {"ndcg10": r["ndcg10"], "by_category": r["by_category"]}
    return {
        "source": {
            "repo": SEMBLE_REPO,
            "commit": SEMBLE_COMMIT,
            "hybrid": {"path": RESULTS_HYBRID, "url": blob_url(RESULTS_HYBRID), "model": hybrid["model"]},
            "legs": {"path": RESULTS_ABLATIONS, "url": blob_url(RESULTS_ABLATIONS), "model": ablations["model"]},
            "note": (
                "hybrid = SembleIndex.search(top_k=10) with its ranking stage; bm25 / semantic = one retrieval leg "
                "each, through the same ranking stage (ablations.py modes semble-bm25 / semble-semantic). chunks = "
                "semble's chunk count for the indexed folder. Summary = mean over repositories; a category's "
                "summary = mean over the repositories that have queries of it."
            ),
        },
        "summary": {"hybrid": hybrid["summary"], "legs": ablations["by_mode"]},
        "repos": dict(sorted(repos.items())),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("sync", "published", "show"))
    ap.add_argument("--mirror", type=Path, help="a bare git dir of semble holding SEMBLE_COMMIT")
    args = ap.parse_args(argv)
    try:
        if args.action == "sync":
            print(f"extracted {SEMBLE_REPO}@{SEMBLE_COMMIT[:12]} benchmark files into {sync(args.mirror)}")
        elif args.action == "published":
            PUBLISHED.write_text(json.dumps(build_published(mirror=args.mirror), indent=2) + "\n")
            print(f"wrote {PUBLISHED}")
        else:
            print(f"commit:   {SEMBLE_REPO}@{SEMBLE_COMMIT}")
            print(f"cache:    {CACHE} ({'present' if (CACHE / 'benchmarks/repos.json').is_file() else 'absent'})")
            print(f"snapshot: {find_mirror(args.mirror) or 'none (fetch ' + SEMBLE_FETCH_SOURCE + ')'}")
    except UpstreamMissing as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
