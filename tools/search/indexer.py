"""The indexing pipeline: walk -> hash -> chunk changed files -> embed new text (deduplicated by content hash)
-> one atomic write of chunks, vectors, FTS rows and the FAISS file."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gpubox.errors import BusyError, InvalidInputError
from gpubox.tools.search import vectors
from gpubox.tools.search.chunker import Chunk, chunk_text
from gpubox.tools.search.embedder import Embedder
from gpubox.tools.search.store import IndexStore, fsync_write
from gpubox.tools.search.walker import WalkOptions, walk

log = logging.getLogger("gpubox.search")


class Cancelled(Exception):
    pass


@dataclass
class Progress:
    phase: str = "queued"
    files_total: int = 0
    files_done: int = 0
    chunks_to_embed: int = 0
    chunks_embedded: int = 0
    started: float = field(default_factory=time.time)
    finished: float | None = None
    error: str | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    def message(self) -> str:
        if self.phase == "embedding":
            return f"embedding {self.chunks_embedded}/{self.chunks_to_embed} chunks"
        return f"{self.phase}: {self.files_done}/{self.files_total} files"


@dataclass
class IndexReport:
    files: int
    chunks: int
    added_files: int
    changed_files: int
    removed_files: int
    embedded_chunks: int
    reused_chunks: int
    seconds: float
    excluded: Counter[str]
    languages: Counter[str]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def embed_text(path: str, c: Chunk) -> str:
    # What the embedding sees: what the chunk defines, then the code. The path stays out (FTS indexes it) so a
    # renamed or moved file reuses its vectors instead of being embedded again.
    del path
    return (f"{c.kind} {c.symbol}\n" if c.symbol else "") + c.text


def run_index(
    root: Path,
    store: IndexStore,
    embedder: Embedder,
    options: WalkOptions,
    progress: Progress,
    ann_threshold: int,
    batch: int = 256,
) -> IndexReport:
    t0 = time.perf_counter()
    meta = store.meta()
    if meta.get("model") and meta["model"] != str(embedder.model_path):
        raise InvalidInputError(
            f"this index was built with embedding model {meta['model']} (dim {meta.get('dim')}); the server now uses "
            f"{embedder.model_path}. Drop it with search_drop and index again."
        )
    progress.phase = "walking"
    result = walk(root, options)
    progress.files_total = len(result.files)
    known = store.file_hashes()
    langs: Counter[str] = Counter()
    new_chunks: list[tuple[str, str, Chunk]] = []  # (path, language, chunk)
    new_files: list[tuple[str, str, int, str]] = []
    seen: set[str] = set()
    added = changed = 0
    progress.phase = "chunking"
    for rel, lang in result.files:
        if progress.cancel.is_set():
            raise Cancelled()
        seen.add(rel)
        langs[lang] += 1
        data = (root / rel).read_bytes()
        digest = sha(data)
        progress.files_done += 1
        if known.get(rel) == digest:
            continue
        if rel in known:
            changed += 1
        else:
            added += 1
        text = data.decode("utf-8", errors="replace")
        for c in chunk_text(text, lang):
            new_chunks.append((rel, lang, c))
        new_files.append((rel, digest, len(data), lang))
    removed = [p for p in known if p not in seen]
    if not new_files and not removed:
        progress.phase = "ready"
        files, chunks = store.counts()
        return IndexReport(files, chunks, 0, 0, 0, 0, 0, time.perf_counter() - t0, result.excluded, langs)

    # embed only text we have never embedded (renames and moved code reuse their vectors)
    hashes = [sha(embed_text(p, c).encode()) for p, _, c in new_chunks]
    have = store.vectors_by_hash(list(set(hashes)))
    todo = sorted({h: i for i, h in enumerate(hashes) if h not in have}.values())
    # similar lengths in one batch: less padding, the same order sentence-transformers uses within a call
    todo.sort(key=lambda j: len(new_chunks[j][2].text))
    progress.phase = "embedding"
    progress.chunks_to_embed = len(todo)
    fresh: dict[str, bytes] = {}
    for i in range(0, len(todo), batch):
        if progress.cancel.is_set():
            raise Cancelled()
        part = todo[i : i + batch]
        vecs = embedder.encode([embed_text(new_chunks[j][0], new_chunks[j][2]) for j in part])
        for j, v in zip(part, vecs, strict=True):
            fresh[hashes[j]] = v.tobytes()
        progress.chunks_embedded += len(part)
    dim = embedder.dimension()

    progress.phase = "writing"
    gen = int(meta.get("generation", 0)) + 1
    faiss_file = store.faiss_path(gen)
    with store.transaction() as db:
        store.delete_paths(db, removed + [f[0] for f in new_files if f[0] in known])
        rows = [
            (p, c.start_line, c.end_line, c.symbol, c.kind, lang, c.text, h, fresh.get(h) or have[h])
            for (p, lang, c), h in zip(new_chunks, hashes, strict=True)
        ]
        store.insert_chunks(db, rows)
        db.executemany("INSERT OR REPLACE INTO files (path, hash, size, language) VALUES (?, ?, ?, ?)", new_files)
        ids, blob = store.all_vectors(db)
        fsync_write(faiss_file, vectors.serialize(vectors.build(ids, blob, dim, ann_threshold)))
        elapsed = time.perf_counter() - t0
        rate = len(todo) / max(elapsed, 1e-6) if len(todo) >= 50 else meta.get("embed_chunks_per_s")
        store.set_meta(
            db,
            generation=gen,
            faiss_file=faiss_file.name,
            model=str(embedder.model_path),
            dim=dim,
            root=str(root),
            updated=time.time(),
            device=embedder.device,
            embed_chunks_per_s=rate,
        )
    store.sweep()
    files, chunks = store.counts()
    progress.phase = "ready"
    return IndexReport(
        files,
        chunks,
        added,
        changed,
        len(removed),
        len(todo),
        len(new_chunks) - len(todo),
        time.perf_counter() - t0,
        result.excluded,
        langs,
    )


def ensure_not_running(progress: Progress | None, name: str) -> None:
    if progress is not None and progress.finished is None and progress.error is None and progress.phase != "ready":
        raise BusyError(f"index '{name}' is already being built ({progress.message()}); poll search_list")
