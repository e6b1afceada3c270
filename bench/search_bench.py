"""Code-search benchmarks: indexing throughput vs raw encode, unchanged re-index, query latency at scale, quality.

    .venv/bin/python bench/search_bench.py [--repo DIR] [--scales 1000,10000,100000]

Scale rows use real chunk texts with random unit vectors (latency depends on sizes, not on vector values);
quality uses the real MiniLM on tests/data/sample_repo with a labelled query set.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np
from mcp import Client

from gpubox.app import build_server
from gpubox.settings import Settings
from gpubox.tools.search.chunker import chunk_text
from gpubox.tools.search.indexer import embed_text
from gpubox.tools.search.service import SearchService
from gpubox.tools.search.store import IndexStore
from gpubox.tools.search.walker import WalkOptions, walk

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LABELLED = {  # query -> relevant (path, symbol); sample_repo
    "exponential backoff retry": ("inventory/retry.py", "retry_with_backoff"),
    "token bucket rate limiting": ("server/ratelimit.go", "RateLimiter"),
    "compute checksum of a byte buffer": ("native/crc32.c", "crc32"),
    "delay a function until the user stops typing": ("web/src/debounce.js", "debounce"),
    "charge a customer's card": ("billing/src/main/java/billing/PaymentGateway.java", "PaymentGateway"),
    "evict the least recently used entry": ("inventory/cache.py", "LRUCache"),
    "edit distance between two strings": ("engine/src/lib.rs", "levenshtein"),
    "hash a password with a salt": ("inventory/auth.py", "hash_password"),
    "verify_password": ("inventory/auth.py", "verify_password"),
    "apply a percentage discount": ("billing/src/main/java/billing/InvoiceCalculator.java", "InvoiceCalculator"),
    "format money for display": ("web/src/formatCurrency.js", "formatCurrency"),
    "fetch a page of items from the API": ("web/src/api.ts", "fetchItems"),
    "read settings from a file with environment overrides": ("inventory/config.py", "load_config"),
    "apply database schema migrations": ("inventory/db.py", "migrate"),
    "write items to a CSV file": ("inventory/csv_export.py", "export_items_to_csv"),
    "split text into words and numbers": ("engine/src/parser.rs", "Tokenizer<'a>"),
    "circular queue push": ("native/ringbuffer.c", "ringbuffer_push"),
    "swap rows and columns of a matrix": ("native/matrix.cpp", "Matrix"),
    "health check endpoint": ("server/main.go", "healthHandler"),
    "refresh_token": ("inventory/auth.py", "refresh_token"),
}


def call(mcp: object, tool: str, **args: object) -> dict:
    async def go() -> dict:
        async with Client(mcp) as c:  # type: ignore[arg-type]
            r = await c.call_tool(tool, args)
            assert not r.is_error, r.content
            return r.structured_content  # type: ignore[return-value]

    return anyio.run(go)


def latencies(mcp: object, index: str, queries: list[str], n: int) -> list[float]:
    async def go() -> list[float]:
        out = []
        async with Client(mcp) as c:  # type: ignore[arg-type]
            for i in range(n + 5):
                t = time.perf_counter()
                r = await c.call_tool("search_code", {"query": queries[i % len(queries)], "index": index, "k": 10})
                if i >= 5:
                    out.append((time.perf_counter() - t) * 1000)
                assert not r.is_error, r.content
        return out

    return anyio.run(go)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    site = Path(sysconfig.get_paths()["purelib"])
    ap.add_argument("--repo", type=Path, default=site / "starlette", help="a real medium repository")
    ap.add_argument("--scales", default="1000,10000,100000")
    ap.add_argument("--queries", type=int, default=100)
    ns = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="gpubox-search-bench-"))
    repo = work / "repo"
    shutil.copytree(ns.repo, repo, ignore=shutil.ignore_patterns("__pycache__"))
    sample = work / "sample"
    shutil.copytree(ROOT / "tests" / "data" / "sample_repo", sample)
    settings = Settings.load(state_dir=work / "state", allowed_roots=[work], search_index_wait_seconds=3600)
    mcp = build_server(settings)
    lines = [f"# Code search benchmark ({os.cpu_count()} CPU cores, {time.strftime('%Y-%m-%d')})", ""]

    # 1. indexing throughput vs raw encode of the same chunks (the server's model is loaded first, by
    # indexing the small sample repo, so both sides run warm)
    t = time.perf_counter()
    call(mcp, "search_index", path=str(sample), name="sample")
    cold = time.perf_counter() - t
    res = call(mcp, "search_index", path=str(repo), name="medium")
    svc = SearchService(settings)
    texts = []
    for rel, lang in walk(repo, WalkOptions()).files:
        for c in chunk_text((repo / rel).read_text(errors="replace"), lang):
            texts.append(embed_text(rel, c))
    emb = svc.embedder
    emb.encode(texts[:8])  # load
    t = time.perf_counter()
    emb.encode(texts)
    raw = time.perf_counter() - t
    pipe_rate, raw_rate = res["embedded_chunks"] / res["seconds"], len(texts) / raw
    lines += [
        f"## Indexing `{ns.repo.name}` ({res['files']} files, {res['chunks']} chunks, device {emb.device})",
        "",
        "| | seconds | chunks/s | files/hour |",
        "|---|---|---|---|",
        f"| gpubox search_index (walk+chunk+embed+write) | {res['seconds']:.1f} | {pipe_rate:.1f} | "
        f"{res['files'] / res['seconds'] * 3600:,.0f} |",
        f"| raw sentence-transformers encode, same chunks | {raw:.1f} | {raw_rate:.1f} | |",
        f"| pipeline / raw encode | | {pipe_rate / raw_rate:.2f} | (goal >= 0.80) |",
        "",
        f"First index after start (imports torch, loads the model; sample repo): {cold:.1f} s.",
        "",
    ]

    # 2. unchanged re-index
    runs = [call(mcp, "search_index", path=str(repo), name="medium")["seconds"] for _ in range(3)]
    lines += [
        f"Unchanged re-index of {res['files']} files: median {statistics.median(runs):.3f} s "
        "(goal: under 2 s for 1,000 files).",
        "",
    ]

    # 3. query latency through the MCP tool at scale
    lines += ["## search_code latency through MCP (hybrid, k=10)", "", "| chunks | p50 ms | p95 ms |", "|---|---|---|"]
    base_rows = (
        svc.store("medium")
        .connect()
        .execute("SELECT path, start_line, end_line, symbol, kind, language, text, text_hash FROM chunks")
        .fetchall()
    )
    queries = [q for q in LABELLED] + ["request routing", "websocket", "middleware", "parse headers"]
    rng = np.random.default_rng(0)
    for n in [int(x) for x in ns.scales.split(",")]:
        name = f"scale{n}"
        store = IndexStore(settings.state_dir / "search" / name)
        with store.transaction() as db:
            rows = []
            for i in range(n):
                p, s, e, sym, kind, lang, text, h = base_rows[i % len(base_rows)]
                v = rng.standard_normal(384).astype(np.float32)
                v /= np.linalg.norm(v)
                rows.append((f"copy{i // len(base_rows)}/{p}", s, e, sym, kind, lang, text, f"{h}-{i}", v.tobytes()))
            store.insert_chunks(db, rows)
            store.set_meta(db, generation=1, model=str(emb.model_path), dim=384, root=str(repo), updated=time.time())
        store.close()
        ms = latencies(mcp, name, queries, ns.queries)
        lines.append(f"| {n:,} | {pct(ms, 0.5):.1f} | {pct(ms, 0.95):.1f} |")
    lines += ["", "(scale rows: real chunk texts, random unit vectors; goal p50 under 30 ms at 100k)", ""]

    # 4. retrieval quality on the labelled sample repo
    lines += [
        "## Retrieval quality (tests/data/sample_repo, 20 labelled queries)",
        "",
        "| mode | recall@5 | MRR |",
        "|---|---|---|",
    ]
    for mode in ("hybrid", "vector", "lexical"):
        hits5, rr = 0, 0.0
        for q, (path, symbol) in LABELLED.items():
            got = call(mcp, "search_code", query=q, index="sample", k=10, mode=mode)["hits"]
            ranks = [i for i, h in enumerate(got) if h["path"] == path and h["symbol"] == symbol]
            if ranks and ranks[0] < 5:
                hits5 += 1
            rr += 1 / (ranks[0] + 1) if ranks else 0
        lines.append(f"| {mode} | {hits5 / len(LABELLED):.2f} | {rr / len(LABELLED):.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "results" / "search.md").write_text(text)


if __name__ == "__main__":
    main()
