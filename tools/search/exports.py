"""Re-exports: where a package hands out a name that is defined elsewhere (another crate, package or module).

A symbol query for a name the index does not define (axum's `FromRequest` lives in axum-core; only
`axum/src/extract/mod.rs` says `pub use axum_core::extract::{..., FromRequest, ...}`) has no definition to boost, so
usage sites won first place. The file that re-exports the name is where its public API is, so it stands in for the
definition. Re-export forms per language, written at module level, the name in leaf position:

- Rust: `pub use path::{A, B};`, `pub use path::A;`, `pub use path::A as B;`
- JavaScript/TypeScript: `export { A, B as C } from "./x"`, `export type { A } from "./x"`
- Python: `from .x import A` in a package's `__init__.py`
- Go, Kotlin, Swift, Scala: an alias to the same name elsewhere (`type A = pkg.A`, `typealias A = x.A`)

Every pattern is linear in the chunk's length: a statement is cut out first with character classes that stop at
the next brace, parenthesis or semicolon, then searched for the name.
"""

from __future__ import annotations

import functools
import re

from gpubox.tools.search.store import ChunkRow, last_part

_RUST_USE = re.compile(r"^[ \t]*pub(?:\([^()\n]*\))?[ \t]+use[ \t]+([^;]*)", re.MULTILINE)
_JS_EXPORT = re.compile(r"\bexport[ \t]+(?:type[ \t]+)?\{([^{}]*)\}[ \t]*from\b")
_PY_IMPORT = re.compile(r"^[ \t]*from[ \t]+[\w.]+[ \t]+import[ \t]+(\([^()]*\)|[^\n]*)", re.MULTILINE)
_STATEMENTS = {"rust": _RUST_USE, "javascript": _JS_EXPORT, "typescript": _JS_EXPORT, "tsx": _JS_EXPORT}
_STATEMENTS["python"] = _PY_IMPORT
_ALIASES = ("go", "kotlin", "swift", "scala")
_PROSE = ("markdown", "rst", "text", "html")


@functools.lru_cache(maxsize=512)
def _leaf(name: str) -> re.Pattern[str]:
    """The name as an exported leaf: `a::N`, `{N,`, `N as M`, `M as N`; not a path segment (`N::Settings`)."""
    n = re.escape(name)
    return re.compile(rf"(?:^|::|[{{,(])\s*{n}[ \t]*(?=[,;}})]|\s|$)(?!\s*::)|\bas\s+{n}(?![\w$])")


@functools.lru_cache(maxsize=512)
def _alias(name: str) -> re.Pattern[str]:
    n = re.escape(name)
    return re.compile(rf"\b(?:type|typealias)[ \t]+{n}[ \t]*=[ \t]*[\w.]+\.{n}(?![\w$])")


@functools.lru_cache(maxsize=256)
def _assignment(name: str) -> re.Pattern[str]:
    keywords = r"export|pub(?:\([^()\n]*\))?|public|private|internal|static|final|readonly|const|let|var|val|mut"
    return re.compile(rf"^[ \t]*(?:(?:{keywords})[ \t]+)*{re.escape(name)}[ \t]*(?::[^=\n]*)?=(?![=>])", re.MULTILINE)


def _names(identifiers: tuple[str, ...], text: str) -> list[str]:
    names = {last_part(i) for i in identifiers}
    return [n for n in names if len(n) > 2 and n in text]


def reexports(row: ChunkRow, identifiers: tuple[str, ...]) -> bool:
    """The chunk re-exports a name the query asks for, in its own language's form (Python: only a package's
    `__init__.py` counts, since any module imports the names it uses; documentation never counts)."""
    names = _names(identifiers, row.text)
    if not names or (row.language == "python" and not row.path.endswith("__init__.py")):
        return False
    if row.language in _ALIASES:
        return any(_alias(n).search(row.text) for n in names)
    statement = _STATEMENTS.get(row.language)
    if statement is None:
        return False
    bodies = [m.group(1) for m in statement.finditer(row.text)]
    return any(_leaf(n).search(body) for n in names for body in bodies)


def assigns(row: ChunkRow, identifiers: tuple[str, ...]) -> bool:
    """The chunk binds the name at the start of a line (`DEFAULT_TIMEOUT = 30`, `export const ZodType = ...`): a
    definition the symbol rules do not see, so the name is defined in the index after all."""
    if row.language in _PROSE:
        return False
    return any(_assignment(n).search(row.text) for n in _names(identifiers, row.text))
