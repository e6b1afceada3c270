"""semble (MinishLab, MIT) on the same labelled queries, as the bar #10 names: its own chunking, BM25, static
embeddings and ranking stage, scored exactly like gpubox (evalset.first_rank: right file, overlapping span).

semble is not a gpubox dependency; run this in a venv of its own (it imports nothing from gpubox):

    python3.11 -m venv /tmp/semble-venv && /tmp/semble-venv/bin/pip install semble==0.7.0
    /tmp/semble-venv/bin/python bench/search_eval/semble_eval.py --model bench/data/models/minilm-l6-m2v-pca256

semble's default model, minishlab/potion-code-16M, lives on the Hugging Face Hub, which this machine cannot reach;
--model takes any local model2vec folder (embedders.py distils one from the bundled MiniLM). Corpora must already
be fetched (fetch.py). gpubox's rows are read from the committed per-query JSON of the same split, so the two are
compared query by query without re-indexing anything with gpubox. Writes bench/results/search_semble.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evalset import first_rank, load_queries, metrics, select
from fetch import BENCH, DEFAULT_DEST, QUERIES_DIR, load_specs

RESULTS = BENCH / "results"
GPUBOX_JSON = {"test": RESULTS / "search_quality_after_test.json"}


def run(split: str, model: Path, corpora_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    # semble keeps an index cache under XDG_CACHE_HOME; a fresh one per run keeps timings and results honest.
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="semble-cache-")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from semble import SembleIndex

    rows: list[dict[str, Any]] = []
    info: dict[str, Any] = {"index_s": {}, "chunks": {}, "query_ms": []}
    for spec in load_specs(None):
        if not (QUERIES_DIR / f"{spec.name}.jsonl").exists():
            continue
        root = corpora_dir / spec.name
        if not root.is_dir():
            raise SystemExit(f"{root} is missing: run bench/search_eval/fetch.py first")
        t0 = time.perf_counter()
        index = SembleIndex.from_path(root, model_path=str(model))
        info["index_s"][spec.name] = time.perf_counter() - t0
        info["chunks"][spec.name] = len(index.chunks)
        for q in select(load_queries(spec.name), split):
            ranks: dict[str, int | None] = {}
            for mode, rerank in (("semble", True), ("semble, no ranking stage", False)):
                t1 = time.perf_counter()
                results = index.search(q.query, top_k=10, rerank=rerank)
                if rerank:
                    info["query_ms"].append((time.perf_counter() - t1) * 1000)
                hits = [(r.chunk.file_path, r.chunk.start_line, r.chunk.end_line) for r in results]
                ranks[mode] = first_rank(hits, q.targets)
            rows.append({"id": q.id, "kind": q.kind, "language": spec.language, "ranks": ranks})
        print(
            f"{spec.name}: {len(index.chunks)} chunks, indexed in {info['index_s'][spec.name]:.1f} s", file=sys.stderr
        )
    return rows, info


def table(rows: list[dict[str, Any]], modes: list[str]) -> list[str]:
    groups: list[tuple[str, list[dict[str, Any]]]] = [("all", rows)]
    for field in ("kind", "language"):
        for value in sorted({r[field] for r in rows}):
            groups.append((f"{field}={value}", [r for r in rows if r[field] == value]))
    out = ["| queries | n | system | recall@1 | recall@5 | recall@10 | MRR@10 |", "|---|---|---|---|---|---|---|"]
    for label, group in groups:
        for mode in modes:
            m = metrics([r["ranks"][mode] for r in group])
            out.append(
                f"| {label} | {len(group)} | {mode} | {m['recall@1']:.2f} | {m['recall@5']:.2f} | "
                f"{m['recall@10']:.2f} | {m['mrr@10']:.2f} |"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a local model2vec folder")
    ap.add_argument("--split", choices=("dev", "test", "all"), default="test")
    ap.add_argument("--corpora-dir", type=Path, default=DEFAULT_DEST)
    ap.add_argument("--out", type=Path, default=RESULTS / "search_semble.md")
    args = ap.parse_args(argv)
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"{args.model} is not a model2vec folder (no config.json)")
    from importlib.metadata import version

    rows, info = run(args.split, args.model, args.corpora_dir)
    modes = ["semble", "semble, no ranking stage"]
    ours = GPUBOX_JSON.get(args.split)
    if ours is not None and ours.exists():
        by_id = {r["id"]: r for r in json.loads(ours.read_text())}
        missing = [r["id"] for r in rows if r["id"] not in by_id]
        if missing:
            raise SystemExit(f"{ours} lacks {len(missing)} of these queries (e.g. {missing[0]}); rerun run_eval.py")
        for r in rows:
            for mode, rank in by_id[r["id"]]["ranks"].items():
                r["ranks"][f"gpubox {mode}"] = rank
        modes = ["gpubox hybrid", *modes, "gpubox lexical", "gpubox vector", "gpubox bm25"]
    q = sorted(info["query_ms"])
    indexing = ", ".join(f"{k} {v:.1f} s ({info['chunks'][k]} chunks)" for k, v in info["index_s"].items())
    text = [
        f"# semble on the labelled code-search set ({args.split} split)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; semble {version('semble')}, model2vec "
        f"{version('model2vec')}; embedding model `{args.model.name}` (local); {len(rows)} queries; "
        f"{os.cpu_count()} CPU cores. Produced by `bench/search_eval/semble_eval.py`; gpubox rows from "
        f"`{ours.relative_to(BENCH.parent) if ours else '-'}` (same queries, same scoring: right file, overlapping "
        "line span).",
        "",
        "semble's published model (potion-code-16M) is on the Hugging Face Hub, out of reach here, so semble runs "
        "with a model2vec model distilled locally from the bundled all-MiniLM-L6-v2 (`embedders.py`); its chunking, "
        "BM25, query-type fusion and ranking stage are its own. 'no ranking stage' is `search(rerank=False)`.",
        "",
        f"semble indexing: {indexing}; "
        f"query p50 {statistics.median(q):.1f} ms, p95 {q[int(0.95 * (len(q) - 1))]:.1f} ms (in process, no MCP).",
        "",
        *table(rows, modes),
        "",
    ]
    args.out.write_text("\n".join(text))
    print(args.out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
