"""search_index's dry run: what indexing a tree would cost (files, chunks, chunks to embed, seconds, disk), read
from the tree and the index alone: no model is loaded and nothing is embedded."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from gpubox.paths import read_inside
from gpubox.tools.gpu.nvml import gpu_status
from gpubox.tools.search.chunker import chunk_text
from gpubox.tools.search.embedder import Embedder
from gpubox.tools.search.indexer import embed_text, needs_new_vectors, sha
from gpubox.tools.search.runstate import NothingToIndex
from gpubox.tools.search.schemas import DryRun, IndexResult
from gpubox.tools.search.store import IndexStore
from gpubox.tools.search.walker import WalkResult, refine_language

# chunks/s before an index has measured its own: MiniLM on 2 CPU cores in fp32 and in bf16 (AMX / AVX512-BF16 CPUs;
# bench/results/search.md: 41-45 chunks/s on a busy hour), fp16 on a GPU
DEFAULT_RATE = {"cpu": 25.0, "cpu-bf16": 40.0, "cuda": 1500.0}


def _cpuinfo_bf16() -> bool:
    """cpu_has_bf16 without importing torch (a dry run loads no model): the kernel's CPU flags, Linux only."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def _known_hashes(store: IndexStore | None, embedder: Embedder) -> tuple[set[str], dict[str, Any]]:
    """The index's chunk text hashes (their vectors are reused) and its meta; no hashes when every chunk would be
    embedded again (run_index: vectors made another way)."""
    if store is None:
        return set(), {}
    meta = store.meta()
    if needs_new_vectors(meta, embedder):
        return set(), meta
    return {h for (h,) in store.connect().execute("SELECT text_hash FROM chunks")}, meta


def _rate(meta: dict[str, Any], embedder: Embedder) -> tuple[float, str]:
    # the device decides the rate; NVML answers without importing torch (a dry run embeds nothing)
    device = "cuda" if gpu_status().available else "cpu"
    device_kind = device
    if device == "cpu":
        loaded = embedder.dtype if embedder.loaded else None
        bf16 = (loaded or embedder.dtype_setting) == "bfloat16" or (
            loaded is None and embedder.dtype_setting == "auto" and _cpuinfo_bf16()
        )
        device_kind = "cpu-bf16" if bf16 else "cpu"
    if meta.get("embed_chunks_per_s") and meta.get("device") == device:
        return float(meta["embed_chunks_per_s"]), "measured on this machine by the last indexing run"
    return DEFAULT_RATE[device_kind], f"default for {device_kind} (all-MiniLM-L6-v2)"


def preview(root: Path, name: str, walked: WalkResult, store: IndexStore | None, embedder: Embedder) -> IndexResult:
    """The dry run of indexing `walked` (files under `root`) into index `name` (`store`: None when new)."""
    known, meta = _known_hashes(store, embedder)
    files_by, chunks_by = Counter[str](), Counter[str]()
    todo = text_bytes = 0
    for rel, lang in walked.files:
        data = read_inside(root, rel)
        if data is None:
            continue
        text = data.decode("utf-8", errors="replace")
        lang = refine_language(rel, lang, text)  # as run_index chunks it: a .h holding C++ is C++
        files_by[lang] += 1
        for c in chunk_text(text, lang):
            chunks_by[lang] += 1
            text_bytes += len(c.text)
            if sha(embed_text(rel, c).encode()) not in known:
                todo += 1
    rate, src = _rate(meta, embedder)
    n = sum(chunks_by.values())
    dim = int(meta.get("dim") or 384)
    return IndexResult(
        name=name,
        root=str(root),
        state="dry_run",
        files=len(walked.files),
        chunks=n,
        excluded=dict(walked.excluded),
        languages=dict(files_by),
        message=f"would index {len(walked.files)} files into {n} chunks, embedding {todo}"
        if walked.files or known
        else str(NothingToIndex(str(root), walked.excluded)),
        dry_run=DryRun(
            files_by_language=dict(files_by),
            chunks_by_language=dict(chunks_by),
            chunks_to_embed=todo,
            estimated_seconds=round(todo / rate + len(walked.files) * 0.002, 1),
            # vector blob + FAISS copy (4 B x dim each), text in the table and in FTS5 (~2x), row overhead
            estimated_disk_bytes=int(n * (8 * dim + 200) + 2.2 * text_bytes),
            embed_rate_chunks_per_s=round(rate, 1),
            rate_source=src,
        ),
    )
