"""search_code's `path_glob` and `language` filters: the chunks they leave, and a refusal that says why when they
leave nothing of the index (a misspelt language or a glob written from another folder gave 0 hits without a word).
"""

from __future__ import annotations

import fnmatch
import functools
import itertools

from gpubox.errors import InvalidInputError, UnknownNameError
from gpubox.tools.search.store import IndexStore
from gpubox.tools.search.walker import LANGUAGES, NAMED_FILES

# names people write for a language, beyond its extension ('rs', '.rs') which LANGUAGES already maps
ALIASES = {"c++": "cpp", "c#": "csharp", "golang": "go", "shell": "bash", "sh": "bash", "node": "javascript"}
# .tsx has its own grammar (and language name in the index) but is TypeScript to whoever asks for TypeScript
FAMILIES = {"typescript": {"typescript", "tsx"}}
KNOWN = set(LANGUAGES.values()) | set(NAMED_FILES.values())


def languages_of(name: str) -> set[str]:
    """The index language names `name` asks for: case-insensitive, by alias or extension."""
    key = name.strip().lower()
    key = ALIASES.get(key) or LANGUAGES.get("." + key.lstrip(".")) or key
    return FAMILIES.get(key, {key})


def relative_glob(path_glob: str, root: str | None) -> str:
    """Paths in an index are relative to its root, with '/': a glob written with the root in front, './' or
    Windows' '\\' is read so."""
    glob = path_glob.strip().replace("\\", "/")
    if root and glob.startswith(root.rstrip("/") + "/"):
        glob = glob[len(root.rstrip("/")) + 1 :]
    while glob.startswith("./"):
        glob = glob[2:]
    return glob


def matches(path: str, glob: str) -> bool:
    """fnmatch, with '**/' also matching no folder, as in git and ripgrep: '**/setup.py' finds the top-level one,
    'src/**/*.py' finds src/a.py (it found only deeper files). Up to four '/**/' are tried both ways."""
    return any(fnmatch.fnmatch(path, g) for g in _variants(glob))


@functools.lru_cache(maxsize=256)
def _variants(glob: str) -> tuple[str, ...]:
    heads = [glob, glob[3:]] if glob.startswith("**/") else [glob]
    out: list[str] = []
    for head in heads:
        parts = head.split("/**/")
        if len(parts) > 5:  # 2**k variants: past four, as written
            out.append(head)
            continue
        for mask in itertools.product(("/**/", "/"), repeat=len(parts) - 1):
            out.append(parts[0] + "".join(sep + part for sep, part in zip(mask, parts[1:], strict=True)))
    return tuple(dict.fromkeys(out))


def allowed(store: IndexStore, path_glob: str | None, language: str | None) -> list[int] | None:
    """Chunk ids the filters keep (None: no filter); refused with the reason when they keep none."""
    if not path_glob and not language:
        return None
    rows = store.connect().execute("SELECT id, path, language FROM chunks").fetchall()
    if not rows:
        return []
    name = store.dir.name
    langs = languages_of(language) if language else None
    if langs is not None and not any(lang in langs for *_, lang in rows):
        present = sorted({lang for *_, lang in rows})
        if not langs & KNOWN:
            raise UnknownNameError("language", language or "", present, hint=f"Those are index '{name}'s languages.")
        raise InvalidInputError(f"index '{name}' has no {language} files; its languages: {', '.join(present)}")
    glob = relative_glob(path_glob, store.meta().get("root")) if path_glob else None
    keep = [i for i, p, lang in rows if (langs is None or lang in langs) and (glob is None or matches(p, glob))]
    if not keep:
        paths = [p for _, p, lang in rows if langs is None or lang in langs]
        example = next((p for p in paths if "/" in p), paths[0])
        scope = f" among its {language} files" if language else ""
        raise InvalidInputError(
            f"path_glob '{path_glob}' matches no file of index '{name}'{scope}; paths are relative to the index "
            f"root, e.g. '{example}' ('*' also crosses '/': 'src/*.py' matches src/a/b.py)"
            + (
                "; braces ('{a,b}') are not expanded: one call per alternative, or a wider glob"
                if "{" in (glob or "")
                else ""
            )
        )
    return keep
