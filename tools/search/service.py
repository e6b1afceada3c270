"""The search service: named indexes under <state_dir>/search/, background indexing jobs, hybrid queries."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import sqlite3
import threading
import time
import unicodedata
import uuid
from pathlib import Path
from typing import Any

from gpubox.errors import GpuboxError, InvalidInputError, NotFoundError, UnknownNameError
from gpubox.paths import resolve_inside as resolve_root
from gpubox.settings import Settings
from gpubox.tools.box.capacity import own_usage
from gpubox.tools.box.footprints import Growth
from gpubox.tools.box.ledger import Ledger
from gpubox.tools.search import index_info, vectors
from gpubox.tools.search.embedder import Embedder, default_model_path
from gpubox.tools.search.indexer import run_index
from gpubox.tools.search.pages import RankedPages
from gpubox.tools.search.preview import preview
from gpubox.tools.search.query import hybrid, snippet
from gpubox.tools.search.runstate import (
    Cancelled,
    IndexReport,
    NothingToIndex,
    Progress,
    built_elsewhere,
    ensure_not_running,
    run_lock_of,
    unfinished_run,
)
from gpubox.tools.search.schemas import (
    DropResult,
    IndexInfo,
    IndexList,
    IndexResult,
    SearchHit,
    SearchResults,
)
from gpubox.tools.search.store import DamagedIndexError, IndexStore, damaged, folder_bytes, unless_damaged
from gpubox.tools.search.vectors_file import rebuild_vectors
from gpubox.tools.search.walker import WalkOptions, walk

log = logging.getLogger("gpubox.search")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


# An indexing run holds the embedding model (MiniLM: 90 MB of weights) with its batch activations and the torch
# runtime, tree-sitter parsers and the index's SQLite/FAISS writes: the server grew 1.21-1.30 GB of host RAM per run
# (semble's benchmark and bench/symbol_eval, 2026-11-26, with the model already loaded for the second and later runs;
# 0.5 GB had been the figure, under-reserving every first run), and on a GPU the weights, activations and a CUDA
# context there too. A configuration's measured footprint replaces this once known (box.footprints).
INDEXING_HOST_GB = 1.3
INDEXING_GPU_GB = 0.6


DROPPED = "~dropped-"  # a dropped index's folder while it is deleted ('~' is in no index name)


def default_name(root: Path) -> str:
    """An index name from a folder's: accents dropped ('ñandú' -> 'nandu'), other characters '-', never a leading
    '.' or '-' ('.dotrepo' -> 'dotrepo'), 'root' when nothing is left."""
    ascii_name = unicodedata.normalize("NFKD", root.name).encode("ascii", "ignore").decode()
    return re.sub(r"[^A-Za-z0-9_.-]", "-", ascii_name).lstrip(".-_")[:64].rstrip(".-") or "root"


class SearchService:
    def __init__(self, settings: Settings, ledger: Ledger | None = None) -> None:
        self.settings = settings
        self.ledger = ledger if ledger is not None else Ledger(settings)
        self.base = settings.state_dir / "search"
        self.base.mkdir(parents=True, exist_ok=True)
        for left in self.base.glob(f"*{DROPPED}*"):  # a drop the previous server did not finish deleting
            shutil.rmtree(left, ignore_errors=True)
        self.embedder = Embedder(
            default_model_path(settings.search_embedding_model),
            settings.search_embed_batch,
            max_seq_length=settings.search_embed_max_tokens,
            dtype=settings.search_embed_dtype,
            onnx_cache=settings.state_dir / "onnx" if settings.search_onnx_queries else None,
            onnx_int8=settings.search_query_int8,
            adapter=settings.search_code_adapter and settings.search_embedding_model is None,
        )
        self._stores: dict[str, IndexStore] = {}
        self._faiss: dict[str, tuple[tuple[Any, int], Any]] = {}  # name -> ((index id, generation), index)
        self._jobs: dict[str, Progress] = {}
        self._reports: dict[str, IndexReport] = {}
        self._pages = RankedPages()
        self._lock = threading.Lock()

    # --- names and stores -----------------------------------------------------------------------
    def _check_name(self, name: str) -> str:
        if not NAME.fullmatch(name):
            raise InvalidInputError(f"index name '{name}' must be 1-64 letters, digits, '_', '-' or '.'")
        return name

    def names(self) -> list[str]:
        return sorted(d.name for d in self.base.iterdir() if DROPPED not in d.name and (d / "index.sqlite").is_file())

    def store(self, name: str, create: bool = False) -> IndexStore:
        with self._lock:
            if name not in self._stores:
                d = self.base / name
                if not create and not (d / "index.sqlite").is_file():
                    raise UnknownNameError("index", name, self.names(), hint="Create it with search_index.")
                self._stores[name] = IndexStore(d)
            return self._stores[name]

    def resolve_name(self, name: str | None) -> str:
        if name:
            if name not in self.names():
                job = self._jobs.get(name)
                if job is None:
                    raise UnknownNameError("index", name, self.names(), hint="Create it with search_index.")
                if job.finished is not None and job.error:  # its first run committed nothing
                    raise NotFoundError(f"index '{name}' has no data: its indexing run failed ({job.error})")
            return name
        names = self.names()
        if len(names) == 1:
            return names[0]
        if not names:
            raise NotFoundError("there is no index yet; call search_index with a directory first")
        raise InvalidInputError(f"several indexes exist ({', '.join(names)}); pass index=<name>")

    # --- indexing -------------------------------------------------------------------------------
    def start_index(
        self, path: str, name: str | None, include: list[str], exclude: list[str], max_file_bytes: int | None
    ) -> tuple[str, Path, Progress]:
        root = resolve_root(path, self.settings.allowed_roots)
        if not root.is_dir():
            raise InvalidInputError(f"{root} is a file; pass the repository directory")
        name = self._check_name(name or default_name(root))
        existing = self.store(name).meta().get("root") if name in self.names() else None
        if existing and existing != str(root):
            raise InvalidInputError(
                f"index '{name}' already covers {existing}; pass another name or search_drop it first"
            )
        owner, needs = f"indexing {name}", self._indexing_needs()
        with self._lock:  # one check-and-reserve: a second start of the same index is told it is running
            ensure_not_running(self._jobs.get(name), name)
            frees = f"waiting for indexing '{name}' to finish (search_list)"
            self.ledger.reserve(owner, "indexing", needs, frees, key=self._indexing_key(needs))
            progress = Progress()
            self._jobs[name] = progress
        options = self._walk_options(include, exclude, max_file_bytes)
        run_lock = None
        try:
            store = self.store(name, create=True)
            run_lock = run_lock_of(self.base, name)
        except BaseException:
            self.ledger.release(owner)
            with self._lock:
                self._jobs.pop(name, None)
            raise

        def work() -> None:
            growth: Growth | None = None
            try:
                # the server's growth while it embeds, kept as this configuration's footprint when above the
                # estimate; not measured while another index is built (a model load meanwhile is counted: safe side)
                growth = Growth(own_usage, alone=lambda: self.indexing() == [name])
                self._reports[name] = run_index(
                    root, store, self.embedder, options, progress, self.settings.search_ann_threshold
                )
            except Cancelled:
                progress.error = "cancelled"
            except NothingToIndex as exc:  # said through search_list; no folder stays that never gets a root
                progress.error = str(exc)
                self._discard_unbuilt(name, store)
            except Exception as exc:  # reported through search_list, never lost
                log.exception("indexing %s failed", name)
                progress.error = str(exc) or type(exc).__name__
                with contextlib.suppress(Exception):  # a first run that committed nothing (the model did not load)
                    self._discard_unbuilt(name, store)  # left a root-less index reading "empty" after a restart
            finally:
                try:
                    self._settle(owner, growth)
                finally:  # even if the release failed: a run that never says it ended blocks its index for good
                    run_lock.close()  # before it says it ended: a new run here must find the lock free
                    progress.finished = time.time()  # after the release: a new run of this index may start now
                    try:
                        store.close_thread()  # this worker's connection; queries may still use theirs
                    finally:
                        progress.done.set()

        try:
            threading.Thread(target=work, name=f"gpubox-index-{name}", daemon=True).start()
        except BaseException:  # no thread (a resource limit): nothing of the run may stay held
            run_lock.close()
            self.ledger.release(owner)
            with self._lock:
                self._jobs.pop(name, None)
            raise
        return name, root, progress

    def _discard_unbuilt(self, name: str, store: IndexStore) -> None:
        """Remove the folder of an index whose first run committed nothing (its job keeps the reason)."""
        with self._lock:
            if store.meta().get("generation") or self._stores.get(name) is not store:
                return
            self._stores.pop(name)
            self._pages.forget(name)
            store.retire()
            trash = self.base / f"{name}{DROPPED}{uuid.uuid4().hex[:8]}"
            (self.base / name).rename(trash)
        shutil.rmtree(trash, ignore_errors=True)

    def _settle(self, owner: str, growth: Growth | None) -> None:
        """Record what the run took (when measurable) and release its memory, whatever happens to the measuring."""
        try:
            used = growth.stop() if growth is not None else None
            if used is not None:
                self.ledger.update(owner, measured=used)
        except Exception:  # the figure is lost; the reservation must not be
            log.exception("measuring indexing run %s", owner)
        finally:
            self.ledger.release(owner)

    def _indexing_needs(self) -> dict[str, float]:
        gpu = any(d.device.startswith("cuda") for d in self.ledger.state().devices)
        return {"host": INDEXING_HOST_GB, **({"cuda:0": INDEXING_GPU_GB} if gpu else {})}

    def _indexing_key(self, needs: dict[str, float]) -> str:
        """The configuration whose measured footprint the ledger remembers: embedder, precision, batch, devices."""
        e = self.embedder
        return f"indexing|{e.model_path}|{self.settings.search_embed_dtype}|{e.batch_size}|{','.join(sorted(needs))}"

    def indexing(self) -> list[str]:
        """Names of the indexes being built right now."""
        with self._lock:
            return [name for name, p in self._jobs.items() if not p.done.is_set()]

    def _walk_options(self, include: list[str], exclude: list[str], max_bytes: int | None) -> WalkOptions:
        size = max_bytes or self.settings.search_max_file_bytes
        return WalkOptions(include, exclude, size, tuple(Path(r).resolve() for r in self.settings.allowed_roots))

    def result(self, name: str, root: Path, progress: Progress) -> IndexResult:
        return index_info.run_result(name, root, progress, self._reports.get(name))

    def dry_run(
        self, path: str, name: str | None, include: list[str], exclude: list[str], max_file_bytes: int | None
    ) -> IndexResult:
        root = resolve_root(path, self.settings.allowed_roots)
        if not root.is_dir():
            raise InvalidInputError(f"{root} is a file; pass the repository directory")
        name = self._check_name(name or default_name(root))
        walked = walk(root, self._walk_options(include, exclude, max_file_bytes))
        return preview(root, name, walked, self.store(name) if name in self.names() else None, self.embedder)

    # --- querying -------------------------------------------------------------------------------
    def _faiss_index(self, name: str, store: IndexStore) -> Any:
        meta = store.meta()
        gen = (meta.get("index_id"), int(meta.get("generation", 0)))  # which index, at which generation
        cached = self._faiss.get(name)
        if cached and cached[0] == gen:
            return cached[1]
        faiss_file = meta.get("faiss_file")
        path = store.dir / faiss_file if faiss_file else None

        def rebuilt() -> Any:
            return rebuild_vectors(store, path, int(meta.get("dim") or self.embedder.dimension()), self.settings)

        index = vectors.load_or(path, rebuilt) if path is not None and path.is_file() else rebuilt()
        self._faiss[name] = (gen, index)
        return index

    def search(
        self,
        query: str,
        name: str | None,
        k: int,
        offset: int,
        path_glob: str | None,
        language: str | None,
        mode: str,
        snippet_chars: int,
    ) -> SearchResults:
        if not query.strip():
            raise InvalidInputError("query is empty; describe the code or name an identifier")
        name = self.resolve_name(name)
        store = self.store(name)
        meta = store.meta()
        if not meta.get("generation"):
            job = self._jobs.get(name)
            if job and job.finished is None:
                state = job.message()
            elif built_elsewhere(self.base, name):
                state = "another gpubox server on this box is building it"
            else:
                state = "the last indexing run was interrupted" if unfinished_run(meta) else "not built"
            raise NotFoundError(f"index '{name}' has no committed data yet ({state}); poll search_list")
        if mode != "lexical":
            index_info.check_embedder(name, meta, str(self.embedder.model_path), self.embedder.adapter)
        index = self._faiss_index(name, store) if mode != "lexical" else None
        embed = (lambda: self.embedder.encode_query(query)) if mode != "lexical" else None
        n = offset + k
        key = (name, meta.get("index_id"), meta.get("generation"), query, mode, path_glob, language)
        ranked, more = self._pages.ranked(
            key, n, lambda pool: hybrid(store, index, embed, query, mode, pool, path_glob, language)
        )
        page = ranked[offset:n]
        rows = store.chunks([r.id for r in page])
        hits = []
        for r in page:
            c = rows.get(r.id)
            if c is None:
                continue
            text, cut = snippet(c.text, query, snippet_chars)
            hits.append(
                SearchHit(
                    path=c.path,
                    start_line=c.start_line,
                    end_line=c.end_line,
                    symbol=c.symbol,
                    kind=c.kind,
                    language=c.language,
                    score=round(r.score, 5),
                    snippet=text,
                    snippet_truncated=cut,
                    matched_by=r.sources,
                )
            )
        return SearchResults(
            index=name,
            query=query,
            mode=mode,
            hits=hits,
            offset=offset,
            next_offset=n if len(ranked) > n or (more and len(ranked) == n) else None,
            candidates=len(ranked),
        )

    # --- listing and dropping -------------------------------------------------------------------
    def info(self, name: str) -> IndexInfo:
        job = self._jobs.get(name)
        if name not in self.names():
            if job is None:
                raise UnknownNameError("index", name, self.names())
            return index_info.unbuilt(name, job)
        try:
            return index_info.describe(name, self.store(name), job, self.embedder.adapter)
        except (OSError, sqlite3.Error, GpuboxError):
            if job is None or name in self.names():
                raise
            return index_info.unbuilt(name, job)  # its first run found nothing and removed it meanwhile

    def list(self) -> IndexList:
        with self._lock:
            jobs = set(self._jobs)
        names = sorted(set(self.names()) | jobs)
        return IndexList(indexes=[self._listed(n) for n in names])

    def _listed(self, name: str) -> IndexInfo:
        try:
            return self.info(name)
        except (DamagedIndexError, sqlite3.DatabaseError) as exc:  # one damaged index hid every other one
            if not isinstance(exc, DamagedIndexError) and not damaged(exc):
                raise
            return index_info.damaged(name, exc)

    def drop(self, name: str) -> DropResult:
        with self._lock:  # checked, forgotten and moved aside at once: no search can open it again meanwhile
            if name not in self.names():
                job = self._jobs.get(name)
                if job is None or job.finished is None:
                    raise UnknownNameError("index", name, self.names())
                del self._jobs[name]  # a first run that failed before committing anything: only its report
                return DropResult(name=name, dropped=True, freed_bytes=0)
            ensure_not_running(self._jobs.get(name), name, ": it is not dropped while the run goes on")
            run_lock = run_lock_of(self.base, name, "drop it")  # not while another server builds it; held until moved
            try:
                store = self._stores.pop(name, None) or unless_damaged(self.base / name)
                self._faiss.pop(name, None)
                self._jobs.pop(name, None)
                self._pages.forget(name)
                size = folder_bytes(self.base / name)
                if store is not None:
                    store.retire()  # searches still running end on their own connections
                trash = self.base / f"{name}{DROPPED}{uuid.uuid4().hex[:8]}"
                (self.base / name).rename(trash)  # atomic: the name is free for a new index at once
            finally:
                run_lock.close()
        shutil.rmtree(trash, ignore_errors=True)
        return DropResult(name=name, dropped=True, freed_bytes=size)

    def close(self) -> None:
        for job in self._jobs.values():
            job.cancel.set()
        for st in self._stores.values():
            st.close()
