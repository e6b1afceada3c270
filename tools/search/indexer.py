"""The indexing pipeline: walk -> hash -> chunk changed files -> embed new text (deduplicated by content hash)
-> batches of whole files, each committed atomically (chunks, vectors, FTS rows and the FAISS file), so a killed
run resumes from its last batch."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubox.errors import InvalidInputError
from gpubox.paths import read_inside
from gpubox.tools.search import vectors
from gpubox.tools.search.chunker import CHUNKER_VERSION, Chunk, chunk_text, embedding_text
from gpubox.tools.search.embedder import Embedder
from gpubox.tools.search.runstate import Cancelled, IndexReport, NothingToIndex, Progress
from gpubox.tools.search.store import IndexStore, fsync_write
from gpubox.tools.search.walker import WalkOptions, WalkResult, ambiguous, refine_language, walk

log = logging.getLogger("gpubox.search")


# what an index that records no `embed_tokens` was embedded with (the embedder's cut before it became a setting)
LEGACY_EMBED_TOKENS = 256
MIXED = "mixed"  # meta['adapter'] of an index whose re-embedding run was interrupted


def needs_new_vectors(meta: dict[str, Any], embedder: Embedder) -> bool:
    """The index's vectors were made reading another number of tokens per chunk or with another adapter merged into
    the model (an index from before the code adapter records none), or a run changing either was interrupted
    (`embed_tokens` None: some vectors were made one way, some the other)."""
    tokens = meta.get("embed_tokens", LEGACY_EMBED_TOKENS) != embedder.max_seq_length
    return tokens or meta.get("adapter") != embedder.adapter


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def embed_text(path: str, c: Chunk) -> str:
    # What the embedding sees (chunker.embedding_text): path, qualified name, signature, then the code. The path
    # costs a re-embed when a file moves, and buys recall: +0.05 recall@5 on bench/search_eval's dev split.
    return embedding_text(path, c)


FileRow = tuple[str, str, int, str]  # a `files` row: (path, content hash, size, language)
ChunkRow = tuple[str, str, Chunk, str]  # (path, language, chunk, hash of its embedding text)


@dataclass
class _Group:
    """Files published together in one commit: their rows, and the texts they still need embedded."""

    files: list[FileRow] = field(default_factory=list)
    chunks: list[ChunkRow] = field(default_factory=list)
    todo: dict[str, str] = field(default_factory=dict)  # hash -> text to embed


@dataclass
class _Scan:
    """What the chunking pass found: new and changed files with their chunks, every path still readable, and the
    counts the report gives."""

    per_file: list[tuple[FileRow, list[ChunkRow]]] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    langs: Counter[str] = field(default_factory=Counter)
    added: int = 0
    changed: int = 0


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
    _check_model(meta, embedder)
    progress.phase = "walking"
    result = walk(root, options)
    progress.files_total = len(result.files)
    known = store.file_hashes()
    if not result.files and not known and not meta.get("generation"):  # a wrong path or filter, on a new index
        raise NothingToIndex(str(root), result.excluded)
    progress.phase = "chunking"
    # files chunked by an older chunker are chunked again (their unchanged chunk texts keep their vectors); vectors
    # made reading another number of tokens per chunk are all made again
    retokened = bool(known) and needs_new_vectors(meta, embedder)
    stale = (meta.get("chunker") != CHUNKER_VERSION or retokened) and bool(known)
    scan = _scan(root, result, {p: "" for p in known} if stale else known, progress)
    removed = [p for p in known if p not in scan.seen]
    if not scan.per_file and not removed:
        _close_interrupted_run(store, meta)
        progress.phase = "ready"
        files, chunks = store.counts()
        return IndexReport(files, chunks, 0, 0, 0, 0, 0, time.perf_counter() - t0, result.excluded, scan.langs)

    # embed only text we have never embedded (unchanged chunks of an edited file reuse their vectors)
    have = {} if retokened else store.vectors_by_hash(list({h for _, cs in scan.per_file for *_, h in cs}))
    groups, to_embed = _plan_groups(scan.per_file, have, commit_chunks)
    progress.chunks_to_embed = to_embed  # first: a poll between the two saw "embedding 0/0", reported as 100%
    progress.phase = "embedding"
    publisher = _Publisher(
        store, root, embedder, ann_threshold, meta, known, removed, vectors=have, to_embed=to_embed, t0=t0,
        rechunk=stale, retokened=retokened,
    )  # fmt: skip
    publisher.start(len(scan.per_file))
    _embed_and_publish(groups, publisher, progress, commit_chunks, write_share, on_commit)
    files, chunks = store.counts()
    progress.phase = "ready"
    reused = sum(len(cs) for _, cs in scan.per_file) - to_embed
    counts = (scan.added, scan.changed, len(removed), to_embed, reused)
    return IndexReport(files, chunks, *counts, time.perf_counter() - t0, result.excluded, scan.langs)


def _check_model(meta: dict[str, Any], embedder: Embedder) -> None:
    """Refuse to add vectors from another model: they would share one FAISS space with the old ones."""
    if meta.get("model") and meta["model"] != str(embedder.model_path):
        raise InvalidInputError(
            f"this index was built with embedding model {meta['model']} (dim {meta.get('dim')}); the server now uses "
            f"{embedder.model_path}. Drop it with search_drop and index again."
        )


def _scan(root: Path, walked: WalkResult, known: dict[str, str], progress: Progress) -> _Scan:
    """Read the walked files; chunk those whose content hash differs from `known`. Files that became unreadable
    since the walk join its exclusions."""
    scan = _Scan()
    for rel, lang in walked.files:
        if progress.cancel.is_set():
            raise Cancelled()
        data = read_inside(root, rel)  # re-checked at open time: the file may have become a symlink since the walk
        progress.files_done += 1
        if data is None:
            walked.excluded["unreadable or replaced since the walk"] += 1
            continue
        scan.seen.add(rel)
        # decoded before the unchanged-file check only where the content decides the language (a .h: C or C++)
        text = data.decode("utf-8", errors="replace") if ambiguous(rel, lang) else None
        lang = refine_language(rel, lang, text) if text is not None else lang
        scan.langs[lang] += 1
        digest = sha(data)
        if known.get(rel) == digest:
            continue
        if rel in known:
            scan.changed += 1
        else:
            scan.added += 1
        text = text if text is not None else data.decode("utf-8", errors="replace")
        chunks = [(rel, lang, c, sha(embed_text(rel, c).encode())) for c in chunk_text(text, lang)]
        scan.per_file.append(((rel, digest, len(data), lang), chunks))
    return scan


def _close_interrupted_run(store: IndexStore, meta: dict[str, Any]) -> None:
    """An interrupted run whose files were all committed is finished: nothing is left to embed."""
    if (meta.get("run") or {}).get("state") == "running":
        with store.transaction() as db:
            store.set_meta(db, run={**meta["run"], "state": "complete", "finished": time.time()})


def _plan_groups(
    per_file: list[tuple[FileRow, list[ChunkRow]]], have: dict[str, bytes], commit_chunks: int
) -> tuple[list[_Group], int]:
    """Whole files in groups of about `commit_chunks` texts to embed, each text once however many chunks share it;
    and how many texts that is in all."""
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
    return groups, len(queued)


def _embed_and_publish(
    groups: list[_Group],
    publisher: _Publisher,
    progress: Progress,
    commit_chunks: int,
    write_share: float,
    on_commit: Callable[[int], None] | None,
) -> None:
    """Embed group by group; commit what is pending after the last group, and before it whenever run_index's
    rule allows (enough new chunks, and embedding that outweighed the previous write)."""
    pending = _Group()
    embed_s = last_write_s = 0.0
    since_commit = 0
    for n, g in enumerate(groups):
        embed_s += _embed(g.todo, publisher.embedder, progress, publisher.vectors)
        pending.files += g.files
        pending.chunks += g.chunks
        last = n == len(groups) - 1
        since_commit += len(g.todo)
        if not last and (since_commit < commit_chunks or embed_s * write_share < last_write_s):
            continue
        progress.phase = "writing"
        t_write = time.perf_counter()
        publisher.commit(pending, progress.chunks_embedded, last)
        last_write_s, embed_s, since_commit = time.perf_counter() - t_write, 0.0, 0
        pending = _Group()
        progress.phase = "embedding"
        if on_commit is not None:
            on_commit(int(publisher.run["commits"]))


def _embed(todo: dict[str, str], embedder: Embedder, progress: Progress, into: dict[str, bytes]) -> float:
    """Embed `todo` (hash -> text) into `into` (hash -> vector bytes), a batch at a time; returns the seconds."""
    # similar lengths in one batch: less padding, the same order sentence-transformers uses within a call
    order = sorted(todo, key=lambda h: len(todo[h]))
    step = max(1, embedder.batch_size)
    t0 = time.perf_counter()
    for i in range(0, len(order), step):
        if progress.cancel.is_set():
            raise Cancelled()
        part = order[i : i + step]
        # no SQLite transaction is open here, and bulk=True lets a query take the model between batches
        vecs = embedder.encode([todo[h] for h in part], bulk=True)
        for h, v in zip(part, vecs, strict=True):
            into[h] = v.tobytes()
        progress.chunks_embedded += len(part)
    return time.perf_counter() - t0


@dataclass
class _Publisher:
    """A run's commits: each one bumps the index generation and meta['run'], and publishes a batch of files."""

    store: IndexStore
    root: Path
    embedder: Embedder
    ann_threshold: int
    meta: dict[str, Any]  # the index's meta as the run found it
    known: dict[str, str]  # path -> content hash before the run: these paths' old rows go
    removed: list[str]  # paths gone since the last run: the first commit deletes them
    vectors: dict[str, bytes]  # hash -> vector: those already stored, then those this run embeds
    to_embed: int
    t0: float
    run: dict[str, Any] = field(default_factory=dict)  # meta['run'], written with every commit
    rechunk: bool = False  # the index was chunked by an older chunker: every file is chunked again
    retokened: bool = False  # and embedded again, reading another number of tokens per chunk
    dim: int = 0
    gen: int = 0

    def start(self, files_total: int) -> None:
        """Record the run in meta before anything is embedded, so a killed run is seen as one."""
        self.dim = self.embedder.dimension()
        self.gen = int(self.meta.get("generation", 0))
        self.run = {
            "state": "running",
            "pid": os.getpid(),
            "started": time.time(),
            "files_total": files_total,
            "files_done": 0,
            "chunks_to_embed": self.to_embed,
            "chunks_embedded": 0,
            "commits": 0,
        }
        with self.store.transaction() as db:
            self.store.set_meta(db, run=self.run)

    def _embed_tokens(self, last: bool) -> int | None:
        """What meta['embed_tokens'] says after a commit: until a re-embedding run's last commit its vectors are
        mixed (None), so an interrupted one is re-embedded whatever the setting is by then."""
        if last or not self.rechunk:
            return self.embedder.max_seq_length
        return None if self.retokened else self.meta.get("embed_tokens", LEGACY_EMBED_TOKENS)

    def _adapter(self, last: bool) -> str | None:
        """What meta['adapter'] says after a commit: a re-embedding run's earlier commits hold vectors of both
        variants, which no embedder's value matches, so search refuses vectors until a run completes."""
        if last or not self.rechunk:
            return self.embedder.adapter
        return MIXED if self.retokened else self.meta.get("adapter")

    def commit(self, batch: _Group, chunks_embedded: int, last: bool) -> None:
        self.gen += 1
        run = self.run
        run["commits"] = int(run["commits"]) + 1
        run["files_done"] = int(run["files_done"]) + len(batch.files)
        run["chunks_embedded"] = chunks_embedded
        if last:
            run["state"] = "complete"
            run["finished"] = time.time()
        rows = [
            (p, c.start_line, c.end_line, c.symbol, c.kind, lang, c.text, h, self.vectors[h])
            for p, lang, c, h in batch.chunks
        ]
        elapsed = time.perf_counter() - self.t0
        # the measured rate replaces the stored one only when this run embedded enough to measure it
        rate = (
            self.to_embed / max(elapsed, 1e-6) if last and self.to_embed >= 50 else self.meta.get("embed_chunks_per_s")
        )
        _commit(
            self.store,
            self.gen,
            files=batch.files,
            rows=rows,
            delete=(self.removed if run["commits"] == 1 else []) + [f[0] for f in batch.files if f[0] in self.known],
            dim=self.dim,
            ann_threshold=self.ann_threshold,
            meta=dict(
                model=str(self.embedder.model_path),
                dim=self.dim,
                root=str(self.root),
                updated=time.time(),
                device=self.embedder.device,
                embed_chunks_per_s=rate,
                run=run,
                # a re-chunking run records the new chunker with its last commit only: if it is interrupted, the
                # next run re-chunks again (the files it did not reach are still cut the old way)
                chunker=CHUNKER_VERSION if last or not self.rechunk else self.meta.get("chunker"),
                embed_tokens=self._embed_tokens(last),
                adapter=self._adapter(last),
            ),
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
