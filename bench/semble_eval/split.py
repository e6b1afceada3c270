"""The fixed tune/report split of semble's benchmark repositories (issue #22), chosen before any scoring.

    .venv/bin/python bench/semble_eval/split.py            # print the table; fail if split.json disagrees
    .venv/bin/python bench/semble_eval/split.py --write    # (re)write split.json from the rule below

Which repositories: every repository in semble's benchmarks/repos.json (at upstream.SEMBLE_COMMIT) except the very
large trees, i.e. those whose indexed folder semble itself cut into more than MAX_SEMBLE_CHUNKS chunks (the
`chunks` field of its published results, the only size measure that needs no checkout). That leaves out zig
(ziglang/zig lib/std, 13,059 chunks), redis (src, 6,289) and laravel-framework (src/Illuminate, 6,197); the next
largest, jackson-databind (4,570) and curl (4,444), stay. Every language keeps at least two repositories.

Which half: within each language, repositories are ordered by sha256(SALT + name) and dealt alternately to the two
halves. A language with an even count splits evenly starting with `tune`; languages with an odd count (taken in
alphabetical order) start alternately with `tune` and `report`, so the halves come out equal in size. The rule reads
names and languages only: no score, query or chunk count decides a half, and every language is in both halves.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import upstream

HERE = Path(__file__).resolve().parent
SPLIT = HERE / "split.json"
SALT = "gpubox-semble-split-v1/"
MAX_SEMBLE_CHUNKS = 5000
HALVES = ("tune", "report")


def _key(name: str) -> str:
    return hashlib.sha256((SALT + name).encode()).hexdigest()


def assign_halves(languages: dict[str, str]) -> dict[str, str]:
    """repo -> half, from {repo: language} alone (the rule in the module docstring)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name, language in languages.items():
        groups[language].append(name)
    halves: dict[str, str] = {}
    odd_seen = 0
    for language in sorted(groups):
        members = sorted(groups[language], key=_key)
        start = 0
        if len(members) % 2:
            start = odd_seen % 2
            odd_seen += 1
        for i, name in enumerate(members):
            halves[name] = HALVES[(start + i) % 2]
    return halves


def build(*, mirror: Path | None = None) -> dict[str, Any]:
    repos = upstream.load_repos(mirror=mirror)
    published = json.loads(upstream.PUBLISHED.read_text())["repos"]
    excluded: dict[str, dict[str, Any]] = {}
    kept: dict[str, dict[str, Any]] = {}
    for name, spec in sorted(repos.items()):
        chunks = published[name]["chunks"]
        entry = {
            "language": spec["language"],
            "url": spec["url"],
            "revision": spec["revision"],
            "folder": spec.get("benchmark_root"),
            "semble_chunks": chunks,
            "queries": len(upstream.load_annotations(name, mirror=mirror)),
        }
        if chunks > MAX_SEMBLE_CHUNKS:
            excluded[name] = {**entry, "why": f"very large tree: semble cut its folder into {chunks} chunks"}
        else:
            kept[name] = entry
    halves = assign_halves({name: e["language"] for name, e in kept.items()})
    for name, entry in kept.items():
        entry["half"] = halves[name]
    return {
        "source": {
            "repo": upstream.SEMBLE_REPO,
            "commit": upstream.SEMBLE_COMMIT,
            "repos_json": "benchmarks/repos.json",
        },
        "rule": (
            f"all repos.json entries with at most {MAX_SEMBLE_CHUNKS} semble chunks; within each language ordered by "
            f"sha256('{SALT}' + name) and dealt alternately, odd-sized languages (alphabetical) starting alternately "
            "with tune and report"
        ),
        "excluded": excluded,
        "repos": kept,
    }


def load(path: Path = SPLIT) -> dict[str, dict[str, Any]]:
    """repo -> {language, url, revision, folder, semble_chunks, queries, half} from split.json."""
    return json.loads(path.read_text())["repos"]


def repos_in(half: str, path: Path = SPLIT) -> list[str]:
    """The repositories of one half ('tune' or 'report'), or all of them ('all')."""
    return sorted(name for name, e in load(path).items() if half == "all" or e["half"] == half)


def table(split: dict[str, Any]) -> str:
    repos = split["repos"]
    lines = ["| language | tune | report |", "|---|---|---|"]
    by_lang: dict[str, dict[str, list[str]]] = defaultdict(lambda: {h: [] for h in HALVES})
    for name, e in sorted(repos.items()):
        by_lang[e["language"]][e["half"]].append(name)
    for language in sorted(by_lang):
        cells = [", ".join(by_lang[language][h]) for h in HALVES]
        lines.append(f"| {language} | {cells[0]} | {cells[1]} |")
    totals = {h: [e for e in repos.values() if e["half"] == h] for h in HALVES}
    lines.append(
        "| **total** | "
        + " | ".join(f"{len(totals[h])} repos, {sum(e['queries'] for e in totals[h])} queries" for h in HALVES)
        + " |"
    )
    lines.append("")
    lines.append(
        "Left out (very large trees): "
        + ", ".join(
            f"{name} ({e['language']}, {e['semble_chunks']} semble chunks)" for name, e in split["excluded"].items()
        )
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="write split.json (otherwise compare with it)")
    ap.add_argument("--mirror", type=Path, help="a bare git dir of semble holding upstream.SEMBLE_COMMIT")
    args = ap.parse_args(argv)
    try:
        split = build(mirror=args.mirror)
    except upstream.UpstreamMissing as e:
        print(e, file=sys.stderr)
        return 2
    if args.write:
        SPLIT.write_text(json.dumps(split, indent=2) + "\n")
        print(f"wrote {SPLIT}", file=sys.stderr)
    elif SPLIT.exists() and json.loads(SPLIT.read_text()) != split:
        print(f"{SPLIT} differs from what the rule gives now; the split is fixed, do not rewrite it", file=sys.stderr)
        return 1
    print(table(split))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
