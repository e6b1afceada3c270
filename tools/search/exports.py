"""Re-exports: where a package hands out a name that is defined elsewhere (another crate, package or module).

A symbol query for a name the index does not define (axum's `FromRequest` lives in axum-core; only
`axum/src/extract/mod.rs` says `pub use axum_core::extract::{..., FromRequest, ...}`) has no definition to boost, so
usage sites won first place. The file that re-exports the name is where its public API is, so it stands in for the
definition. Re-export forms per language, written at module level, the name in leaf position:

- Rust: `pub use path::{A, B};`, `pub use path::A;`, `pub use path::A as B;`
- JavaScript/TypeScript: `export { A, B as C } from "./x"`, `export type { A } from "./x"`
- Python: `from .x import A` in a package's `__init__.py`
- Go, Kotlin, Swift, Scala: an alias to the same name elsewhere (`type A = pkg.A`, `typealias A = x.A`)
"""

from __future__ import annotations

import functools
import re

from gpubox.tools.search.store import QUALIFIER, ChunkRow

_ALIAS = r"\b(?:type|typealias)\s+{n}\s*=\s*[\w.]+\.{n}(?![\w$])"
_FORMS = {
    "rust": r"\bpub(?:\([^)]*\))?\s+use\s[^;]*(?:::|[{{,]\s*){n}\s*(?:[,}};]|\bas\b)",
    "javascript": r"\bexport\s+(?:type\s+)?\{{[^}}]*(?<![\w$]){n}(?![\w$])[^}}]*\}}\s*from\b",
    "python": r"^\s*from\s+[\w.]+\s+import\s+(?:\([^)]*(?<![\w$]){n}(?![\w$])[^)]*\)|[^\n]*(?<![\w$]){n}(?![\w$]))",
    "go": _ALIAS,
    "kotlin": _ALIAS,
    "swift": _ALIAS,
    "scala": _ALIAS,
}
_FORMS["typescript"] = _FORMS["tsx"] = _FORMS["javascript"]


@functools.lru_cache(maxsize=512)
def _pattern(language: str, name: str) -> re.Pattern[str]:
    return re.compile(_FORMS[language].format(n=re.escape(name)), re.MULTILINE)


@functools.lru_cache(maxsize=256)
def _assignment(name: str) -> re.Pattern[str]:
    n = re.escape(name)
    return re.compile(
        rf"^\s*(?:(?:export|pub(?:\([^)]*\))?|public|private|internal|static|final|readonly)\s+)*"
        rf"(?:(?:const|let|var|val|static|mut)\s+)*{n}\s*(?::[^=\n]*)?=(?!=)",
        re.MULTILINE,
    )


def _names(identifiers: tuple[str, ...]) -> set[str]:
    return {n for n in (re.split(QUALIFIER, i)[-1] for i in identifiers) if len(n) > 2}


def reexports(row: ChunkRow, identifiers: tuple[str, ...]) -> bool:
    """The chunk re-exports a name the query asks for, in its own language's form (Python: only a package's
    `__init__.py` counts, since any module imports the names it uses; documentation never counts)."""
    if row.language not in _FORMS or (row.language == "python" and not row.path.endswith("__init__.py")):
        return False
    return any(_pattern(row.language, n).search(row.text) for n in _names(identifiers))


def assigns(row: ChunkRow, identifiers: tuple[str, ...]) -> bool:
    """The chunk binds the name at the start of a line (`DEFAULT_TIMEOUT = 30`, `export const ZodType = ...`): a
    definition the symbol rules do not see, so the name is defined in the index after all."""
    return any(_assignment(n).search(row.text) for n in _names(identifiers))
