"""Score one of semble's benchmark repositories that split.json leaves out of both halves (issue #22).

    .venv/bin/python bench/semble_eval/run_excluded.py --repo laravel-framework \
        --root /tmp/laravel_corp/laravel/src/Illuminate [--state /tmp/laravel_state]

split.json excludes laravel-framework, redis and zig for their size, so no default was tuned on them and neither
half's score includes them: a held-out check of the defaults. The tree comes from a snapshot by hand
(`git --git-dir=<mirror> archive <revision> <folder> | tar -x -C <dir>`, revision and folder from split.json's
`excluded`); every annotated query goes through `search_code` over MCP in each mode, scored by score.py, and the
means print beside semble's published figure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import score  # noqa: E402
import upstream  # noqa: E402
from run_gpubox import index, structured  # noqa: E402

from gpubox.app import build_server, state_of  # noqa: E402
from gpubox.settings import Settings  # noqa: E402

MODES = ("hybrid", "vector", "lexical")


async def run(repo: str, root: Path, state: Path) -> dict[str, list[dict[str, Any]]]:
    server = build_server(Settings.load(state_dir=state, allowed_roots=[root]))
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    try:
        async with Client(server) as client:  # type: ignore[arg-type]
            info = await index(client, repo, root)
            print(f"{repo}: {info.get('chunks')} chunks", file=sys.stderr)
            queries = score.load_queries(repo)
            for i, item in enumerate(upstream.load_annotations(repo)):
                for mode in MODES:
                    args = {"query": item["query"], "index": repo, "k": 10, "mode": mode}
                    res = structured(await client.call_tool("search_code", args))
                    hits = [[h["path"], h["start_line"], h["end_line"]] for h in res["hits"]]
                    rows[mode].append(score.score_query(hits, queries[i]))
    finally:
        state_of(server).close()
    return rows


def _means(rows: list[dict[str, Any]]) -> str:
    cats: dict[str, list[float]] = {}
    for r in rows:
        cats.setdefault(r["category"], []).append(r["ndcg10"])
    per = ", ".join(f"{c} {sum(v) / len(v):.3f} ({len(v)})" for c, v in sorted(cats.items()))
    return f"{sum(r['ndcg10'] for r in rows) / len(rows):.3f}; {per}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--root", type=Path, required=True, help="the indexed folder, extracted at the pinned revision")
    ap.add_argument("--state", type=Path, default=Path("/tmp/semble_excluded_state"))
    args = ap.parse_args()
    rows = anyio.run(run, args.repo, args.root, args.state)
    for mode in MODES:
        print(f"gpubox {mode}: {_means(rows[mode])}")
    published = score.semble_published(args.repo)
    print(f"semble (published): {published.get('ndcg10', float('nan')):.3f}; {published.get('by_category')}")


if __name__ == "__main__":
    main()
