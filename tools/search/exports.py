"""Re-exports: where a package hands out a name that is defined elsewhere (another crate, package or module).

A symbol query for a name the index does not define (axum's `FromRequest` lives in axum-core; only
`axum/src/extract/mod.rs` says `pub use axum_core::extract::{..., FromRequest, ...}`) has no definition to boost, so
usage sites won first place. The file that re-exports the name is where its public API is, so it stands in for the
definition. Re-export forms, one per language family, written at module level:

- Rust: `pub use path::{A, B};`, `pub use path::A;`
- JavaScript/TypeScript: `export { A, B as C } from "./x"`, `export type { A } from "./x"`
- Python: `from .x import A` in a package's `__init__.py`
- Go, Kotlin, Swift, Scala: an alias to the same name elsewhere (`type A = pkg.A`, `typealias A = x.A`)
"""

from __future__ import annotations

import functools
import re

from gpubox.tools.search.store import QUALIFIER, ChunkRow


@functools.lru_cache(maxsize=256)
def _pattern(name: str) -> re.Pattern[str]:
    n = re.escape(name)
    return re.compile(
        rf"\bpub(?:\([^)]*\))?\s+use\s[^;]*\b{n}\b[^;]*;"  # Rust
        rf"|\bexport\s+(?:type\s+)?\{{[^}}]*\b{n}\b[^}}]*\}}\s*from\b"  # JS/TS
        rf"|^\s*from\s+[\w.]+\s+import\s+(?:\([^)]*\b{n}\b[^)]*\)|[^\n]*\b{n}\b)"  # Python
        rf"|\b(?:type|typealias)\s+{n}\s*=\s*[\w.]+\.{n}\b",  # Go, Kotlin, Swift, Scala aliases
        re.MULTILINE,
    )


def reexports(row: ChunkRow, identifiers: tuple[str, ...]) -> bool:
    """The chunk re-exports a name the query asks for (Python: only a package's `__init__.py` counts, since any
    module imports the names it uses)."""
    if row.language == "python" and not row.path.endswith("__init__.py"):
        return False
    names = {re.split(QUALIFIER, i)[-1] for i in identifiers}
    return any(len(n) > 2 and _pattern(n).search(row.text) for n in names)
