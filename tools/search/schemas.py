"""Pydantic outputs of the search family."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

IndexState = Literal["ready", "indexing", "failed", "empty", "interrupted", "damaged"]


class IndexProgress(BaseModel):
    phase: str
    files_done: int
    files_total: int
    chunks_embedded: int
    chunks_to_embed: int
    elapsed_s: float


class DryRun(BaseModel):
    files_by_language: dict[str, int]
    chunks_by_language: dict[str, int]
    chunks_to_embed: int = Field(description="Chunks not yet in this index (what a real run would embed)")
    estimated_seconds: float
    estimated_disk_bytes: int
    embed_rate_chunks_per_s: float
    rate_source: str


class IndexResult(BaseModel):
    name: str
    root: str
    state: Literal["ready", "indexing", "failed", "dry_run"]
    message: str
    files: int = 0
    chunks: int = 0
    added_files: int = 0
    changed_files: int = 0
    removed_files: int = 0
    embedded_chunks: int = 0
    reused_chunks: int = Field(default=0, description="Chunks whose vectors were reused (unchanged text, renames)")
    seconds: float = 0.0
    excluded: dict[str, int] = Field(default_factory=dict, description="Skipped files/dirs by reason")
    languages: dict[str, int] = Field(default_factory=dict)
    progress: IndexProgress | None = None
    dry_run: DryRun | None = None


class SearchHit(BaseModel):
    path: str
    start_line: int
    end_line: int
    symbol: str | None
    kind: str
    language: str
    score: float = Field(description="Fused score (reciprocal rank fusion in hybrid mode, cosine or BM25 otherwise)")
    snippet: str
    snippet_truncated: bool
    matched_by: list[str] = Field(description="Which retrievers found it: vector, lexical, symbol")


class SearchResults(BaseModel):
    index: str
    query: str
    mode: str
    hits: list[SearchHit]
    offset: int
    next_offset: int | None = Field(description="Pass as offset for the next page; null when there is no more")
    candidates: int


class IndexInfo(BaseModel):
    name: str
    root: str | None
    files: int
    chunks: int
    model: str | None
    dim: int | None
    size_bytes: int
    last_indexed: str | None
    state: IndexState = Field(
        description="interrupted: the last run stopped (process killed) after committing some batches; "
        "search_index resumes it. damaged: its files cannot be read; search_drop it"
    )
    progress: IndexProgress | None = None
    error: str | None = None


class IndexList(BaseModel):
    indexes: list[IndexInfo]


class DropResult(BaseModel):
    name: str
    dropped: bool
    freed_bytes: int
