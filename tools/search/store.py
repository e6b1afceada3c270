"""One index on disk: SQLite (files, chunks with their vectors, FTS5) + a FAISS file derived from the vectors.

Crash safety: chunks, vectors and the pointer to the FAISS file change in one SQLite transaction. The new FAISS
file is written (fsync, rename) before that transaction commits and the old one is deleted after, so a crash at
any point leaves the committed pointer naming a complete file; stray files are swept on the next open.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubox.errors import NotFoundError
from gpubox.filelock import try_exclusive

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, hash TEXT NOT NULL, size INTEGER NOT NULL, language TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    path TEXT NOT NULL, start_line INTEGER NOT NULL, end_line INTEGER NOT NULL,
    symbol TEXT, kind TEXT NOT NULL, language TEXT NOT NULL,
    text TEXT NOT NULL, text_hash TEXT NOT NULL, vector BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_path ON chunks (path);
CREATE INDEX IF NOT EXISTS chunks_hash ON chunks (text_hash);
CREATE INDEX IF NOT EXISTS chunks_symbol ON chunks (symbol);
-- the symbol leg matches names case-insensitively (parseArgs ~ ParseArgs): without this it scans every chunk
CREATE INDEX IF NOT EXISTS chunks_symbol_nocase ON chunks (symbol COLLATE NOCASE);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(symbol, path, text, idents, tokenize = 'unicode61');
-- per-term document counts, read by the lexical leg to keep its BM25 work bounded (query.plan_lexical)
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_vocab USING fts5vocab(chunks_fts, row);
"""

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# what separates a qualified name's parts: Class.method, fmt::format, Monolog\Logger, Ruby's and Javadoc's Foo#bar
QUALIFIER = r"\.|::|->|\\|#"


def last_part(name: str) -> str:
    """The name a qualified one ends in: Ecto.Query -> Query, fmt::format -> format, Monolog\\Logger -> Logger."""
    return re.split(QUALIFIER, name)[-1]


CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def split_identifiers(text: str) -> str:
    """parseConfigFile / parse_config_file -> 'parse config file' so either spelling matches lexically."""
    parts: list[str] = []
    for ident in set(IDENT.findall(text)):
        if "_" in ident or any(c.isupper() for c in ident[1:]):
            parts.extend(p.lower() for piece in ident.split("_") for p in CAMEL.findall(piece))
    return " ".join(parts)


@dataclass
class ChunkRow:
    id: int
    path: str
    start_line: int
    end_line: int
    symbol: str | None
    kind: str
    language: str
    text: str


class IndexStore:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db_path = directory / "index.sqlite"
        self._local = threading.local()
        # every connection any thread opened, so close() can close them all: worker threads (anyio's pool, the
        # lexical pool, indexing jobs) outlive a request and would otherwise leak their connection
        self._open: set[sqlite3.Connection] = set()
        self._open_lock = threading.Lock()
        self._retired = False  # dropped: no new connection (see retire)
        try:
            with self.connect() as db:
                db.executescript(SCHEMA)
                # which index this is, beyond its name: caches keyed by it never serve a dropped index's data to a
                # new one of the same name (both may be at generation 1)
                db.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('index_id', ?)", (json.dumps(uuid.uuid4().hex),)
                )
        except sqlite3.DatabaseError as exc:
            self.close()
            if not damaged(exc):  # locked, read-only, disk full: the index is fine, say what happened
                raise
            raise DamagedIndexError(directory.name, exc) from exc
        held = try_exclusive(directory / "run.lock")  # no sweep under a run (another server's new FAISS file)
        if held is not None:
            try:
                self.sweep()
            finally:
                held.close()

    # --- connections ----------------------------------------------------------------------------
    def connect(self) -> sqlite3.Connection:
        """This thread's connection (WAL: readers never block the writer or each other)."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None or db not in self._open:  # none yet, or closed by close() from another thread
            if self._retired:
                raise NotFoundError(f"index '{self.dir.name}' was dropped; search_list shows the indexes")
            # check_same_thread=False only so close() may close it from another thread; it is used by one thread
            db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            with self._open_lock:
                self._open.add(db)
            self._local.db = db
        return db

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        db = self.connect()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close_thread(self) -> None:
        """Close the calling thread's connection (a finished worker thread), leaving other threads' open."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        self._local.db = None
        if db is not None:
            with self._open_lock:
                self._open.discard(db)
            db.close()

    def close(self) -> None:
        """Close every connection this store opened, whichever thread opened it."""
        with self._open_lock:
            dbs, self._open = list(self._open), set()
        for db in dbs:
            db.close()
        self._local.db = None

    def retire(self) -> None:
        """Stop serving (the index is being dropped): no thread opens a connection from now on. Other threads'
        connections are not closed under them (closing one in the middle of a query crashed the server in
        CPython's sqlite3 module); each is closed when this store is freed, after its last search."""
        with self._open_lock:
            self._retired = True
            self._open = set()
        own: sqlite3.Connection | None = getattr(self._local, "db", None)
        self._local.db = None
        if own is not None:
            own.close()

    def open_connections(self) -> int:
        return len(self._open)

    # --- meta -----------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        rows = self.connect().execute("SELECT key, value FROM meta").fetchall()
        return {k: json.loads(v) for k, v in rows}

    @staticmethod
    def set_meta(db: sqlite3.Connection, **values: Any) -> None:
        db.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [(k, json.dumps(v)) for k, v in values.items()],
        )

    # --- files and chunks -----------------------------------------------------------------------
    def file_hashes(self) -> dict[str, str]:
        return dict(self.connect().execute("SELECT path, hash FROM files").fetchall())

    def vectors_by_hash(self, hashes: list[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        db = self.connect()
        for i in range(0, len(hashes), 500):
            part = hashes[i : i + 500]
            q = f"SELECT text_hash, vector FROM chunks WHERE text_hash IN ({','.join('?' * len(part))})"
            out.update(db.execute(q, part).fetchall())
        return out

    @staticmethod
    def delete_paths(db: sqlite3.Connection, paths: list[str]) -> None:
        for p in paths:
            ids = [r[0] for r in db.execute("SELECT id FROM chunks WHERE path = ?", (p,))]
            db.executemany("DELETE FROM chunks_fts WHERE rowid = ?", [(i,) for i in ids])
            db.execute("DELETE FROM chunks WHERE path = ?", (p,))
            db.execute("DELETE FROM files WHERE path = ?", (p,))

    @staticmethod
    def insert_chunks(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
        """rows: (path, start, end, symbol, kind, language, text, text_hash, vector_bytes)."""
        for r in rows:
            cur = db.execute(
                "INSERT INTO chunks (path, start_line, end_line, symbol, kind, language, text, text_hash, vector) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                r,
            )
            db.execute(
                "INSERT INTO chunks_fts (rowid, symbol, path, text, idents) VALUES (?, ?, ?, ?, ?)",
                (cur.lastrowid, r[3] or "", r[0], r[6], split_identifiers(r[6] + " " + (r[3] or ""))),
            )

    def counts(self) -> tuple[int, int]:
        db = self.connect()
        return (
            db.execute("SELECT COUNT(*) FROM files").fetchone()[0],
            db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0],
        )

    def chunks(self, ids: list[int]) -> dict[int, ChunkRow]:
        if not ids:
            return {}
        q = (
            "SELECT id, path, start_line, end_line, symbol, kind, language, text FROM chunks "
            f"WHERE id IN ({','.join('?' * len(ids))})"
        )
        return {r[0]: ChunkRow(*r) for r in self.connect().execute(q, ids).fetchall()}

    def all_vectors(self, db: sqlite3.Connection) -> tuple[list[int], bytes]:
        ids, blobs = [], []
        for i, v in db.execute("SELECT id, vector FROM chunks ORDER BY id"):
            ids.append(i)
            blobs.append(v)
        return ids, b"".join(blobs)

    # --- faiss files ----------------------------------------------------------------------------
    def faiss_path(self, generation: int) -> Path:
        return self.dir / f"vectors.{generation}.faiss"

    def sweep(self) -> None:
        """Delete FAISS files the committed meta does not point to (left by a crash or a finished swap)."""
        current = self.meta().get("faiss_file")
        for f in self.dir.glob("vectors.*.faiss*"):
            if f.name != current:
                f.unlink(missing_ok=True)

    def size_bytes(self) -> int:
        return folder_bytes(self.dir)


class DamagedIndexError(NotFoundError):
    """An index whose database cannot be read: listed as damaged, dropped without opening it."""

    def __init__(self, name: str, exc: Exception) -> None:
        super().__init__(
            f"index '{name}' is damaged: its index.sqlite cannot be read ({exc}); search_drop name='{name}' "
            "removes it, then search_index builds it again"
        )


def damaged(exc: sqlite3.Error) -> bool:
    """The file is no database or a corrupt one (SQLITE_NOTADB, SQLITE_CORRUPT), not a passing condition."""
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)


def unless_damaged(directory: Path) -> IndexStore | None:
    """The index's store, or None when it cannot be opened (a drop then removes it as files)."""
    try:
        return IndexStore(directory)
    except DamagedIndexError:
        return None


def folder_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.iterdir() if f.is_file())


def fsync_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
