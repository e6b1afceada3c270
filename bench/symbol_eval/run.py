"""Send the ctags-built symbol queries (build_queries.py) through gpubox's search_code over MCP and score them.

    .venv/bin/python bench/symbol_eval/run.py [--corpora /tmp/cppcorp] [--modes hybrid,lexical] [--out F.jsonl]

Each repository of sources.json is indexed with gpubox's default settings (index state in $SYMBOL_EVAL_STATE,
default /tmp/symbol_eval_state), every query asked with k=10, and scored by the port of semble's scorer
(bench/semble_eval/score.py: NDCG@10 over the target files): the per-repository table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import anyio
from mcp import Client

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "semble_eval"))

from run_gpubox import index, structured  # noqa: E402
from score import parse_query, score_query  # noqa: E402

from gpubox.app import build_server, state_of  # noqa: E402
from gpubox.settings import Settings  # noqa: E402

STATE = Path(os.environ.get("SYMBOL_EVAL_STATE") or "/tmp/symbol_eval_state")
FOLDERS = {"once": "annotations", "shared": "annotations_shared", "prominent": "annotations_prominent"}


async def run(
    corpora: Path, modes: list[str], out_path: Path, folder: str = "annotations", only: list[str] | None = None
) -> dict[str, dict[str, float]]:
    repos = [r["name"] for r in json.loads((HERE / "sources.json").read_text())["repos"]]
    repos = [r for r in repos if not only or r in only]
    server = build_server(Settings.load(state_dir=STATE, allowed_roots=[corpora]))
    table: dict[str, dict[str, float]] = {}
    try:
        async with Client(server) as client:  # type: ignore[arg-type]
            with out_path.open("w", encoding="utf-8") as out:
                for repo in repos:
                    name = repo.replace("+", "--")  # index names allow no "+"
                    await index(client, name, corpora / repo)
                    items = json.loads((HERE / folder / f"{repo}.json").read_text())
                    if not items:
                        continue
                    for mode in modes:
                        scores = []
                        for i, item in enumerate(items):
                            args = {"query": item["query"], "index": name, "k": 10, "mode": mode}
                            res = structured(await client.call_tool("search_code", args))
                            hits = [[h["path"], h["start_line"], h["end_line"]] for h in res["hits"]]
                            scores.append(score_query(hits, parse_query(item, repo, i))["ndcg10"])
                            out.write(json.dumps({"repo": repo, "index": i, "mode": mode, "hits": hits}) + "\n")
                        table.setdefault(repo, {})[mode] = sum(scores) / len(scores)
    finally:
        state_of(server).close()
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpora", type=Path, default=Path("/tmp/cppcorp"))
    ap.add_argument("--modes", type=lambda s: s.split(","), default=["hybrid", "vector", "lexical"])
    ap.add_argument("--out", type=Path, default=Path("/tmp/symbol_eval_hits.jsonl"))
    ap.add_argument("--set", choices=sorted(FOLDERS), default="once", help="build_queries.py's query set")
    ap.add_argument("--repos", type=lambda s: s.split(","), default=None, help="only these (sources.json names)")
    args = ap.parse_args()
    folder = FOLDERS[args.set]
    table = anyio.run(run, args.corpora, args.modes, args.out, folder, args.repos)
    print("| repo | " + " | ".join(args.modes) + " |\n|---|" + "---|" * len(args.modes))
    for repo, row in table.items():
        print(f"| {repo} | " + " | ".join(f"{row[m]:.3f}" for m in args.modes) + " |")
    means = [sum(r[m] for r in table.values()) / len(table) for m in args.modes]
    print("| **mean** | " + " | ".join(f"{v:.3f}" for v in means) + " |")


if __name__ == "__main__":
    main()
