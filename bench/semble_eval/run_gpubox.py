"""Run semble's benchmark queries through gpubox's own MCP tools and write the hits for score.py (issue #22).

    .venv/bin/python bench/semble_eval/run_gpubox.py [--half tune|report|all] [--repos chi,bats-core]
        [--modes hybrid,vector,lexical] [--out bench/semble_eval/hits.jsonl]

For each repository of the chosen half that is on disk (fetch_repos.py puts it in corpora/<repo>/): one
`search_index` of the folder semble indexes (its `benchmark_root`), with gpubox's default settings, then every
annotated query through `search_code` (k=10, each mode asked for), through an in-memory MCP client. The index
state lives in bench/semble_eval/state/ (gitignored), so a second run re-uses unchanged indexes. Repositories not
on disk are listed and skipped: a partial run is a partial result, and says so.

Writes one JSON object per query and mode: {"repo", "index", "mode", "hits": [[path, start, end], ...],
"ms"}; `path` is relative to the indexed folder, as score.py expects.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import split as split_mod  # noqa: E402
import upstream  # noqa: E402

from gpubox.app import build_server, state_of  # noqa: E402
from gpubox.settings import Settings  # noqa: E402

CORPORA = HERE / "corpora"
STATE = Path(os.environ.get("SEMBLE_EVAL_STATE") or HERE / "state")  # another state dir: an experiment's indexes


def structured(result: Any) -> dict[str, Any]:
    if result.is_error:
        raise RuntimeError(" ".join(getattr(c, "text", "") for c in result.content))
    return result.structured_content or {}


async def index(client: Client, repo: str, root: Path) -> dict[str, Any]:
    """Index `root` under the repo's name and wait until it is ready."""
    out = structured(
        await client.call_tool("search_index", {"path": str(root), "name": repo, "more": {"wait_seconds": 600}})
    )
    while out.get("state") == "indexing":
        listed = structured(await client.call_tool("search_list", {}))
        info = next(i for i in listed["indexes"] if i["name"] == repo)
        if info["state"] != "indexing":
            return info
        await anyio.sleep(2)
    return out


async def run(half: str, repos: list[str] | None, modes: list[str], out_path: Path) -> None:
    chosen = split_mod.load()
    names = [r for r, v in chosen.items() if half == "all" or v["half"] == half]
    if repos:
        names = [r for r in names if r in repos]
    present = [r for r in names if (CORPORA / r).is_dir()]
    missing = sorted(set(names) - set(present))
    if missing:
        print(
            f"not on disk, skipped ({len(missing)}): {', '.join(missing)}; see fetch_repos.py --check", file=sys.stderr
        )
    server = build_server(Settings.load(state_dir=STATE, allowed_roots=[CORPORA]))
    try:
        async with Client(server) as client:  # type: ignore[arg-type]
            with out_path.open("w", encoding="utf-8") as out:
                for repo in present:
                    folder = chosen[repo].get("folder") or ""
                    t0 = time.perf_counter()
                    info = await index(client, repo, CORPORA / repo / folder)
                    print(
                        f"{repo}: {info.get('chunks')} chunks, indexed in {time.perf_counter() - t0:.0f} s",
                        file=sys.stderr,
                    )
                    for i, item in enumerate(upstream.load_annotations(repo)):
                        for mode in modes:
                            t1 = time.perf_counter()
                            try:
                                res = structured(
                                    await client.call_tool(
                                        "search_code", {"query": item["query"], "index": repo, "k": 10, "mode": mode}
                                    )
                                )
                            except RuntimeError as exc:  # an index with nothing in it: no hits, said once
                                print(f"{repo}: {exc}", file=sys.stderr)
                                res = {"hits": []}
                            hits = [[h["path"], h["start_line"], h["end_line"]] for h in res["hits"]]
                            ms = round((time.perf_counter() - t1) * 1000, 1)
                            out.write(
                                json.dumps({"repo": repo, "index": i, "mode": mode, "hits": hits, "ms": ms}) + "\n"
                            )
    finally:
        state_of(server).close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--half", choices=["tune", "report", "all"], default="tune")
    ap.add_argument("--repos", type=lambda s: s.split(","), default=None)
    ap.add_argument("--modes", type=lambda s: s.split(","), default=["hybrid"])
    ap.add_argument("--out", type=Path, default=HERE / "hits.jsonl")
    args = ap.parse_args()
    anyio.run(run, args.half, args.repos, args.modes, args.out)


if __name__ == "__main__":
    main()
