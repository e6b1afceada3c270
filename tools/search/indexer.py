"""The indexing pipeline: walk -> hash -> chunk changed files -> embed new text (deduplicated by content hash)
-> batches of whole files, each committed atomically (chunks, vectors, FTS rows and the FAISS file), so a killed
run resumes from its last batch."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubox.errors import BusyError, InvalidInputError
from gpubox.paths import read_inside
from gpubox.tools.search import vectors
from gpubox.tools.search.chunker import Chunk, chunk_text, embedding_text
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
    done: threading.Event = field(default_factory=threading.Event)  # set once finished or error is final

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
    # What the embedding sees (chunker.embedding_text): path, qualified name, signature, then the code. The path
    # costs a re-embed when a file moves, and buys recall: +0.05 recall@5 on bench/search_eval's dev split.
    return embedding_text(path, c)


@dataclass
class _Group:
    """Files published together in one commit: their rows, and the texts they still need embedded."""

    files: list[tuple[str, str, int, str]] = field(default_factory=list)
    chunks: list[tuple[str, str, Chunk, str]] = field(default_factory=list)  # (path, language, chunk, hash)
    todo: dict[str, str] = field(default_factory=dict)  # hash -> text to embed


def run_index(
    root: Path,
    store: IndexStore,
    embedder: Embedder,
    options: WalkOptions,
    progress: Progress,
    ann_threshold: int,
    *,
    commit_chunks: int = 512,
    write_share: float = 0.1,
    on_commit: Callable[[int], None] | None = None,
) -> IndexReport:
    """Index `root` into `store`, publishing whole files in batches.

    A batch commits once it holds `commit_chunks` newly embedded chunks and the embedding since the last commit
    took at least 1/`write_share` times as long as that commit's write (each commit rewrites the FAISS file, so
    this keeps writes near `write_share` of the run on large indexes). Every commit leaves SQLite and the FAISS
    file consistent, so a killed run keeps its committed batches, the next run resumes from them (their files are
    up to date), and meta['run'] says the run did not finish. `on_commit(n)` runs after the n-th commit (tests
    use it to stop a run at a known point).
    """
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
    per_file: list[tuple[tuple[str, str, int, str], list[tuple[str, str, Chunk, str]]]] = []
    seen: set[str] = set()
    added = changed = 0
    progress.phase = "chunking"
    for rel, lang in result.files:
        if progress.cancel.is_set():
            raise Cancelled()
        data = read_inside(root, rel)  # re-checked at open time: the file may have become a symlink since the walk
        progress.files_done += 1
        if data is None:
            result.excluded["unreadable or replaced since the walk"] += 1
            continue
        seen.add(rel)
        langs[lang] += 1
        digest = sha(data)
        if known.get(rel) == digest:
            continue
        if rel in known:
            changed += 1
        else:
            added += 1
        text = data.decode("utf-8", errors="replace")
        chunks = [(rel, lang, c, sha(embed_text(rel, c).encode())) for c in chunk_text(text, lang)]
        per_file.append(((rel, digest, len(data), lang), chunks))
    removed = [p for p in known if p not in seen]
    if not per_file and not removed:
        if (meta.get("run") or {}).get("state") == "running":  # an interrupted run whose files are all committed
            with store.transaction() as db:
                store.set_meta(db, run={**meta["run"], "state": "complete", "finished": time.time()})
        progress.phase = "ready"
        files, chunks = store.counts()
        return IndexReport(files, chunks, 0, 0, 0, 0, 0, time.perf_counter() - t0, result.excluded, langs)

    # embed only text we have never embedded (unchanged chunks of an edited file reuse their vectors)
    have = store.vectors_by_hash(list({h for _, cs in per_file for *_, h in cs}))
    groups: list[_Group] = [_Group()]
    queued: set[str] = set()
    for f, cs in per_file:
        g = groups[-1]
        g.files.append(f)
        g.chunks.extend(cs)
        for p, _, c, h in cs:
            if h not in have and h not in queued:
                queued.add(h)
                g.todo[h] = embed_text(p, c)
        if len(g.todo) >= commit_chunks:
            groups.append(_Group())
    if len(groups) > 1 and not groups[-1].files:
        groups.pop()
    total_chunks = sum(len(cs) for _, cs in per_file)
    progress.phase = "embedding"
    progress.chunks_to_embed = len(queued)
    dim = embedder.dimension()
    gen = int(meta.get("generation", 0))
    run = {
        "state": "running",
        "pid": os.getpid(),
        "started": time.time(),
        "files_total": len(per_file),
        "files_done": 0,
        "chunks_to_embed": len(queued),
        "chunks_embedded": 0,
        "commits": 0,
    }
    with store.transaction() as db:
        store.set_meta(db, run=run)

    fresh: dict[str, bytes] = {}
    pending = _Group()
    embed_s = last_write_s = 0.0
    since_commit = 0
    step = max(1, embedder.batch_size)
    for n, g in enumerate(groups):
        # similar lengths in one batch: less padding, the same order sentence-transformers uses within a call
        todo = sorted(g.todo, key=lambda h: len(g.todo[h]))
        t_embed = time.perf_counter()
        for i in range(0, len(todo), step):
            if progress.cancel.is_set():
                raise Cancelled()
            part = todo[i : i + step]
            # no SQLite transaction is open here, and bulk=True lets a query take the model between batches
            vecs = embedder.encode([g.todo[h] for h in part], bulk=True)
            for h, v in zip(part, vecs, strict=True):
                fresh[h] = v.tobytes()
            progress.chunks_embedded += len(part)
        embed_s += time.perf_counter() - t_embed
        pending.files += g.files
        pending.chunks += g.chunks
        last = n == len(groups) - 1
        since_commit += len(todo)
        if not last and (since_commit < commit_chunks or embed_s * write_share < last_write_s):
            continue
        progress.phase = "writing"
        t_write = time.perf_counter()
        gen += 1
        run["commits"] = int(run["commits"]) + 1
        run["files_done"] = int(run["files_done"]) + len(pending.files)
        run["chunks_embedded"] = progress.chunks_embedded
        if last:
            run["state"] = "complete"
            run["finished"] = time.time()
        rows = [
            (p, c.start_line, c.end_line, c.symbol, c.kind, lang, c.text, h, fresh.get(h) or have[h])
            for p, lang, c, h in pending.chunks
        ]
        elapsed = time.perf_counter() - t0
        rate = len(queued) / max(elapsed, 1e-6) if last and len(queued) >= 50 else meta.get("embed_chunks_per_s")
        _commit(
            store,
            gen,
            files=pending.files,
            rows=rows,
            delete=(removed if run["commits"] == 1 else []) + [f[0] for f in pending.files if f[0] in known],
            dim=dim,
            ann_threshold=ann_threshold,
            meta=dict(
                model=str(embedder.model_path),
                dim=dim,
                root=str(root),
                updated=time.time(),
                device=embedder.device,
                embed_chunks_per_s=rate,
                run=run,
            ),
        )
        last_write_s, embed_s, since_commit = time.perf_counter() - t_write, 0.0, 0
        pending = _Group()
        progress.phase = "embedding"
        if on_commit is not None:
            on_commit(int(run["commits"]))
    files, chunks = store.counts()
    progress.phase = "ready"
    return IndexReport(
        files,
        chunks,
        added,
        changed,
        len(removed),
        len(queued),
        total_chunks - len(queued),
        time.perf_counter() - t0,
        result.excluded,
        langs,
    )


def _commit(
    store: IndexStore,
    gen: int,
    *,
    files: list[tuple[str, str, int, str]],
    rows: list[tuple[Any, ...]],
    delete: list[str],
    dim: int,
    ann_threshold: int,
    meta: dict[str, object],
) -> None:
    """One transaction: chunks, vectors, FTS rows, files, and the pointer to a FAISS file built from all of them."""
    faiss_file = store.faiss_path(gen)
    with store.transaction() as db:
        store.delete_paths(db, delete)
        store.insert_chunks(db, rows)
        db.executemany("INSERT OR REPLACE INTO files (path, hash, size, language) VALUES (?, ?, ?, ?)", files)
        ids, blob = store.all_vectors(db)
        fsync_write(faiss_file, vectors.serialize(vectors.build(ids, blob, dim, ann_threshold)))
        store.set_meta(db, generation=gen, faiss_file=faiss_file.name, **meta)
    store.sweep()


def ensure_not_running(progress: Progress | None, name: str) -> None:
    if progress is not None and progress.finished is None and progress.error is None and progress.phase != "ready":
        raise BusyError(f"index '{name}' is already being built ({progress.message()}); poll search_list")
