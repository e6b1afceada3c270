"""Code-search quality through the product: search_index + search_code (hybrid, vector, lexical) vs plain BM25.

    .venv/bin/python bench/search_eval/run_eval.py [--split dev|test|all] [--corpus NAME ...] [--index-only]

Every corpus with a spec in corpora/ and a query file in queries/ is fetched (offline once cached), indexed through
an in-process MCP client on gpubox's own server, and queried in each mode at top 10; bm25.py scores the same
queries outside the product. Indexes persist under bench/data/state, so a re-run after a ranking change embeds
only chunks whose text changed (--fresh starts from an empty state dir, needed when the embedded text or model
changes wholesale). Writes a markdown table (bench/results/search_quality.md for the test split,
search_quality_<split>.md otherwise; --out elsewhere) and per-query ranks and top hits beside it (default
bench/results/search_quality_<split>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bm25 import BM25Index
from evalset import Query, first_rank, load_queries, metrics, select
from fetch import BENCH, DEFAULT_CACHE, DEFAULT_DEST, QUERIES_DIR, CorpusSpec, fetch, load_specs

from gpubox.app import build_server, state_of
from gpubox.settings import Settings

MODES = ("hybrid", "vector", "lexical")
ALL_MODES = (*MODES, "bm25")
RESULTS = BENCH / "results"
DEFAULT_STATE = BENCH / "data" / "state"
Hit = tuple[str, int, int]


def gpubox_commit() -> str:
    """HEAD of this checkout, flagged when server/ or tools/ differ from it or gpubox is imported from elsewhere
    (a snapshot installed with pip --target and put first on PYTHONPATH)."""
    import gpubox

    root = BENCH.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "server", "tools"], cwd=root, capture_output=True, text=True
        ).stdout
    except OSError:
        return "unknown"
    where = Path(gpubox.__file__).resolve().parent
    if where != (root / "server").resolve():
        return f"{sha.strip()} checked out, but gpubox imported from {where}"
    return sha.strip() + (" (+ uncommitted changes in server/ or tools/)" if dirty.strip() else "")


async def index_corpus(client: Client, name: str, root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """search_index returns at once (wait_seconds=0); search_list is polled until the background job ends."""
    r = await client.call_tool("search_index", {"path": str(root), "name": name, "wait_seconds": 0})
    if r.is_error:
        raise RuntimeError(f"search_index {name}: {r.content}")
    t0, last = time.monotonic(), ""
    while True:
        lst = await client.call_tool("search_list", {})
        info = next((i for i in (lst.structured_content or {})["indexes"] if i["name"] == name), None)
        if info is None:
            raise RuntimeError(f"search_list does not show index {name!r} after search_index started it")
        if info["state"] != "indexing":
            break
        prog = info.get("progress") or {}
        msg = f"  {name}: {prog.get('phase')} files {prog.get('files_done')}/{prog.get('files_total')}"
        if msg != last:
            log(msg)
            last = msg
        await anyio.sleep(2)
    if info["state"] != "ready":
        raise RuntimeError(f"indexing {name} ended {info['state']}: {info.get('error')}")
    log(f"  {name}: {info['files']} files, {info['chunks']} chunks, ready in {time.monotonic() - t0:.0f} s")
    return info


async def search(client: Client, name: str, query: str, mode: str) -> list[Hit]:
    r = await client.call_tool("search_code", {"query": query, "index": name, "k": 10, "mode": mode})
    if r.is_error:
        raise RuntimeError(f"search_code {name} {mode} {query!r}: {r.content}")
    return [(h["path"], h["start_line"], h["end_line"]) for h in (r.structured_content or {})["hits"]]


def relativise(hits: list[Hit], root: Path) -> list[Hit]:
    out = []
    for path, start, end in hits:
        p = Path(path)
        out.append(((p.relative_to(root).as_posix() if p.is_absolute() else p.as_posix()), start, end))
    return out


async def evaluate(
    corpora: list[tuple[CorpusSpec, Path, list[Query]]],
    settings: Settings,
    index_only: bool,
    log: Callable[[str], None],
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    server = build_server(settings)
    rows: list[dict[str, Any]] = []
    infos: dict[str, dict[str, Any]] = {}
    try:
        async with Client(server) as client:
            for spec, root, queries in corpora:
                infos[spec.name] = await index_corpus(client, spec.name, root, log)
                if index_only:
                    continue
                bm25 = BM25Index(root)
                for q in queries:
                    top: dict[str, list[Hit]] = {m: relativise(await search(client, spec.name, q.query, m), root)
                                                 for m in MODES}  # fmt: skip
                    top["bm25"] = [(c.path, c.start, c.end) for c in bm25.search(q.query, 10)]
                    ranks = {m: first_rank(hits, q.targets) for m, hits in top.items()}
                    rows.append({
                        "id": q.id, "corpus": q.corpus, "language": spec.language, "kind": q.kind, "split": q.split,
                        "query": q.query, "ranks": ranks, "targets": [t.__dict__ for t in q.targets], "top": top,
                    })  # fmt: skip
                log(f"  {spec.name}: {len(queries)} queries scored")
    finally:
        state_of(server).close()
    return rows, infos


def table(rows: list[dict[str, Any]]) -> list[str]:
    groups: list[tuple[str, list[dict[str, Any]]]] = [("all", rows)]
    for field in ("kind", "language", "corpus"):
        for value in sorted({r[field] for r in rows}):
            groups.append((f"{field}={value}", [r for r in rows if r[field] == value]))
    out = ["| queries | n | mode | recall@1 | recall@5 | recall@10 | MRR@10 |", "|---|---|---|---|---|---|---|"]
    for label, group in groups:
        for mode in ALL_MODES:
            m = metrics([r["ranks"][mode] for r in group])
            name = f"**{mode}**" if mode == "hybrid" else mode
            out.append(
                f"| {label} | {len(group)} | {name} | {m['recall@1']:.2f} | {m['recall@5']:.2f} | "
                f"{m['recall@10']:.2f} | {m['mrr@10']:.2f} |"
            )
    return out


def report(
    split: str, rows: list[dict[str, Any]], specs: list[CorpusSpec], infos: dict[str, Any], secs: float, label: str
) -> str:
    lines = [
        f"# Code search quality ({split} split)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; gpubox {label}; "
        f"{len(rows)} queries; {os.cpu_count()} CPU cores; {secs:.0f} s in all. "
        "Produced by `bench/search_eval/run_eval.py` (method: bench/search_eval/README.md).",
        "",
        "A hit is a result in the right file whose line span overlaps a labelled definition; recall@k is the share of "
        "queries with a hit in the top k, MRR@10 the mean reciprocal rank of the first hit. hybrid, vector and "
        "lexical are `search_code` modes through the MCP server; bm25 is a plain Okapi BM25 (k1=1.2, b=0.75) over "
        "regex-cut definition chunks computed outside gpubox (`bench/search_eval/bm25.py`).",
        "",
        "| corpus | language | source | files | chunks |",
        "|---|---|---|---|---|",
    ]
    for s in specs:
        info = infos.get(s.name, {})
        lines.append(
            f"| {s.name} | {s.language} | {s.registry}: `{s.package}` {s.version} (sha256 {s.sha256[:12]}…) | "
            f"{info.get('files', '?')} | {info.get('chunks', '?')} |"
        )
    return "\n".join([*lines, "", *table(rows), ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=("dev", "test", "all"), default="test")
    ap.add_argument("--corpus", action="append", help="only these corpora (repeatable); default: all with queries")
    ap.add_argument("--state-dir", type=Path, default=DEFAULT_STATE, help="gpubox state dir that keeps the indexes")
    ap.add_argument("--fresh", action="store_true", help="index into a new temporary state dir")
    ap.add_argument("--index-only", action="store_true", help="build or refresh the indexes, run no query")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--corpora-dir", type=Path, default=DEFAULT_DEST)
    ap.add_argument("--out", type=Path, help="markdown output (default by split, under bench/results/)")
    ap.add_argument("--gpubox-label", help="how the report names the gpubox version (default: the git commit)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the bundled MiniLM only; nothing may download weights

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    has_queries = (lambda s: True) if args.index_only else (lambda s: (QUERIES_DIR / f"{s.name}.jsonl").exists())
    specs = [s for s in load_specs(args.corpus) if has_queries(s)]
    if not specs:
        log("no corpus has both corpora/<name>.json and queries/<name>.jsonl")
        return 1
    corpora = []
    for spec in specs:
        root = fetch(spec, args.cache, args.corpora_dir)
        queries = [] if args.index_only else select(load_queries(spec.name), args.split)
        corpora.append((spec, root, queries))
        log(f"{spec.name}: {len(corpora[-1][2])} {args.split} queries, root {root}")
    state_dir = Path(tempfile.mkdtemp(prefix="gpubox-search-eval-")) if args.fresh else args.state_dir
    settings = Settings.load(
        state_dir=state_dir, allowed_roots=[args.corpora_dir.resolve()], search_index_wait_seconds=0
    )
    t0 = time.monotonic()
    rows, infos = anyio.run(evaluate, corpora, settings, args.index_only, log)
    if args.index_only:
        return 0
    md = report(args.split, rows, specs, infos, time.monotonic() - t0, args.gpubox_label or f"commit {gpubox_commit()}")
    out = args.out or RESULTS / ("search_quality.md" if args.split == "test" else f"search_quality_{args.split}.md")
    out.write_text(md)
    # the per-query detail goes beside the table it belongs to (--out), never over the committed default
    detail = out.with_suffix(".json") if args.out else RESULTS / f"search_quality_{args.split}.json"
    detail.write_text(json.dumps(rows, indent=1) + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
