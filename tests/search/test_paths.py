"""Path priors (tools/search/paths.py): which folders hold an API's older copy, and how the ranking stage treats
them, on real chunks in a real index store."""

from __future__ import annotations

from pathlib import Path

from gpubox.tools.search.chunker import chunk_text
from gpubox.tools.search.paths import superseded_dirs, under
from gpubox.tools.search.query import hybrid, superseded_of
from gpubox.tools.search.query_kind import classify
from gpubox.tools.search.rank import DEFAULT
from gpubox.tools.search.store import IndexStore


def test_older_copies_are_found_from_the_index_paths() -> None:
    zod = ["packages/zod/src/index.ts", "packages/zod/src/v3/types.ts", "packages/zod/src/v4/core/errors.ts"]
    pydantic = ["pydantic/main.py", "pydantic/fields.py", "pydantic/v1/fields.py", "pydantic/v1/main.py"]
    pydantic.append("pydantic/deprecated/json.py")
    exposed = ["org/jetbrains/exposed/v1/core/Table.kt", "org/jetbrains/exposed/v1/jdbc/Database.kt"]
    assert superseded_dirs(zod) == {"packages/zod/src/v3/"}  # v4 is the newest: kept
    assert superseded_dirs(pydantic) == {"pydantic/v1/", "pydantic/deprecated/"}  # beside the current modules
    assert superseded_dirs(exposed) == frozenset()  # a lone v1 in a folder of no files is the current API
    k8s = ["apps/types.go", "apps/v1/types.go", "apps/v1beta1/types.go", "apps/v1beta2/types.go"]
    assert superseded_dirs(k8s) == {"apps/v1beta1/", "apps/v1beta2/"}  # the stable v1 is the newest
    assert superseded_dirs(["go.mod", "client.go", "v2/client.go"]) == frozenset()  # a Go module's major version
    assert superseded_dirs(["api/__init__.py", "api/deps.py", "api/v1/users.py"]) == frozenset()  # no copy
    assert superseded_dirs(["pkg/__init__.py", "pkg/v1/__init__.py", "pkg/v1/users.py"]) == frozenset()  # boilerplate
    assert under("pydantic/v1/fields.py", superseded_dirs(pydantic)) == "pydantic/v1/"
    assert under("pydantic/fields.py", superseded_dirs(pydantic)) is None


FILES = {
    "pkg/fields.py": 'def field_validator(name):\n    """Validate one value of a model."""\n    return name\n',
    "pkg/v1/fields.py": (
        'def field_validator(name):\n    """Validate a model field by name: the field name."""\n    return name\n'
    ),
    "pkg/main.py": "class Model:\n    pass\n",
    "pkg/v1/main.py": "class Model:\n    pass\n",  # v1 repeats its parent's modules: an older copy
}


def _store(tmp_path: Path) -> IndexStore:
    st = IndexStore(tmp_path / "idx")
    with st.transaction() as db:
        rows = []
        for path, text in FILES.items():
            for c in chunk_text(text, "python"):
                rows.append((path, c.start_line, c.end_line, c.symbol, c.kind, "python", c.text, path, b"\0" * 16))
        st.insert_chunks(db, rows)
        db.executemany("INSERT INTO files VALUES (?, ?, ?, 'python')", [(p, p, len(t)) for p, t in FILES.items()])
    return st


def test_the_current_module_outranks_its_older_copy_unless_the_query_names_it(tmp_path: Path) -> None:
    st = _store(tmp_path)
    assert superseded_of(st) == {"pkg/v1/"}
    first = hybrid(st, None, None, "field name validate model", "lexical", 10, None, None)
    assert [st.chunks([r.id])[r.id].path for r in first][:2] == ["pkg/v1/fields.py", "pkg/fields.py"]  # BM25: v1
    ranked = hybrid(st, None, None, "field name validate model", "hybrid", 10, None, None)
    assert st.chunks([ranked[0].id])[ranked[0].id].path == "pkg/fields.py"
    asked = hybrid(st, None, None, "field name validate model in v1", "hybrid", 10, None, None)
    assert st.chunks([asked[0].id])[asked[0].id].path == "pkg/v1/fields.py"
    assert "v1" in classify("fields in v1").words and DEFAULT.superseded < 1.0
    st.close()
