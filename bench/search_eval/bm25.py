"""A plain Okapi BM25 baseline over definition chunks, computed outside gpubox (no gpubox imports).

Chunks: each definition (a line that opens a def/class/func/fn/function/struct/...) runs to the line before the
next definition in the same file; the lines before the first definition form a header chunk; files with no
definitions are cut into 50-line windows. Tokens: identifiers split at snake_case and camelCase boundaries,
lower-cased, the whole identifier kept too. Scoring: Okapi BM25 with k1=1.2, b=0.75 (Robertson & Zaragoza,
"The Probabilistic Relevance Framework: BM25 and Beyond", 2009).
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

K1 = 1.2
B = 0.75
WINDOW = 50
MAX_FILE_BYTES = 1_000_000
SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv", "venv", "dist", "build", "vendor", "target"}

DEF_PATTERNS: dict[str, re.Pattern[str]] = {
    "python": re.compile(r"^\s*(?:async\s+def|def|class)\s+\w"),
    "go": re.compile(r"^(?:func\s|type\s+\w+\s)"),
    "rust": re.compile(
        r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+|unsafe\s+|const\s+)*(?:fn|struct|enum|trait|impl|mod)\b"
    ),
    "javascript": re.compile(
        r"^\s*(?:export\s+)?(?:default\s+)?(?:async\s+)?(?:function\b|class\s+\w"
        r"|(?:const|let|var)\s+\w+\s*=\s*(?:async\s+)?(?:function\b|\([^)]*\)\s*=>|\w+\s*=>))"
        r"|^\s*(?:static\s+|async\s+|get\s+|set\s+)*[A-Za-z_$][\w$]*\s*\([^)]*\)\s*\{\s*$"
    ),
}
EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".go": "go", ".rs": "rust",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "javascript", ".tsx": "javascript", ".mts": "javascript", ".cts": "javascript",
    ".md": "text", ".rst": "text", ".txt": "text", ".toml": "text", ".yaml": "text", ".yml": "text",
    ".json": "text", ".cfg": "text", ".ini": "text", ".sh": "text", ".html": "text", ".c": "text", ".h": "text",
}  # fmt: skip
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def tokenize(text: str) -> list[str]:
    """'parseArgs_fromCLI' -> ['parseargs_fromcli', 'parse', 'args', 'from', 'cli']."""
    out: list[str] = []
    for word in WORD.findall(text):
        parts = [p.lower() for piece in word.split("_") if piece for p in CAMEL.findall(piece)]
        low = word.lower().strip("_")
        if low and (len(parts) != 1 or parts[0] != low):
            out.append(low)
        out.extend(parts)
    return out


@dataclass(frozen=True)
class Chunk:
    path: str  # relative posix path
    start: int  # 1-based inclusive
    end: int


def chunk_file(path: str, text: str, language: str) -> list[tuple[Chunk, str]]:
    lines = text.splitlines()
    if not lines:
        return []
    pattern = DEF_PATTERNS.get(language)
    starts = [i for i, line in enumerate(lines) if pattern and pattern.match(line)]
    if not starts:
        return [
            (Chunk(path, i + 1, min(i + WINDOW, len(lines))), "\n".join(lines[i : i + WINDOW]))
            for i in range(0, len(lines), WINDOW)
        ]
    bounds = ([0] if starts[0] > 0 else []) + starts + [len(lines)]
    return [(Chunk(path, a + 1, b), "\n".join(lines[a:b])) for a, b in itertools.pairwise(bounds) if b > a]


def walk(root: Path) -> list[tuple[str, str]]:
    files: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            lang = EXTENSIONS.get(os.path.splitext(name)[1].lower())
            full = Path(dirpath) / name
            if lang and not full.is_symlink() and full.stat().st_size <= MAX_FILE_BYTES:
                files.append((full.relative_to(root).as_posix(), lang))
    return files


class BM25Index:
    def __init__(self, root: Path) -> None:
        self.chunks: list[Chunk] = []
        self.tfs: list[Counter[str]] = []
        for rel, lang in walk(root):
            text = (root / rel).read_text(encoding="utf-8", errors="replace")
            for chunk, body in chunk_file(rel, text, lang):
                # the path is part of what a developer searches by ("the completion code"), so it is indexed too
                self.chunks.append(chunk)
                self.tfs.append(Counter(tokenize(rel) + tokenize(body)))
        self.lengths = [sum(tf.values()) for tf in self.tfs]
        self.avgdl = sum(self.lengths) / max(1, len(self.lengths))
        df: Counter[str] = Counter()
        for tf in self.tfs:
            df.update(tf.keys())
        n = len(self.tfs)
        self.idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}
        self.postings: dict[str, list[int]] = {}
        for i, tf in enumerate(self.tfs):
            for t in tf:
                self.postings.setdefault(t, []).append(i)

    def search(self, query: str, k: int = 10) -> list[Chunk]:
        scores: dict[int, float] = {}
        for term in set(tokenize(query)):
            idf = self.idf.get(term)
            if idf is None:
                continue
            for i in self.postings[term]:
                f = self.tfs[i][term]
                norm = K1 * (1 - B + B * self.lengths[i] / self.avgdl)
                scores[i] = scores.get(i, 0.0) + idf * f * (K1 + 1) / (f + norm)
        best = sorted(scores, key=lambda i: (-scores[i], i))[:k]  # ties: earlier chunk first, deterministic
        return [self.chunks[i] for i in best]
