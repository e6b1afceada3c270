"""The re-export rule: a name defined outside the index is found where the package hands it out."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpubox.tools.search.exports import reexports
from gpubox.tools.search.query_kind import classify
from gpubox.tools.search.rank import DEFAULT, Scored, rerank
from gpubox.tools.search.store import ChunkRow


def _row(i: int, path: str, language: str, text: str, symbol: str | None = None, kind: str = "module") -> ChunkRow:
    return ChunkRow(i, path, 1, text.count("\n") + 1, symbol, kind, language, text)


@pytest.mark.parametrize(
    ("path", "language", "text"),
    [
        (
            "src/extract/mod.rs",
            "rust",
            "pub use axum_core::extract::{\n    FromRef, FromRequest, FromRequestParts,\n};",
        ),
        ("src/lib.rs", "rust", "pub(crate) use crate::inner::FromRequest;"),
        ("src/lib.rs", "rust", "pub use crate::inner::Extractor as FromRequest;"),  # the name it exports
        ("src/index.ts", "typescript", 'export { FromRequest, Other as O } from "./core";'),
        ("src/index.ts", "typescript", 'export type {\n  FromRequest,\n} from "./types";'),
        ("pkg/__init__.py", "python", "from .core import (\n    Other,\n    FromRequest,\n)"),
        ("pkg/__init__.py", "python", "from pkg.core import FromRequest as FromRequest"),
        ("api.go", "go", "type FromRequest = core.FromRequest"),
        ("Api.kt", "kotlin", "public typealias FromRequest = io.core.FromRequest"),
    ],
)
def test_re_exports_in_each_language_family(path: str, language: str, text: str) -> None:
    assert reexports(_row(1, path, language, text), classify("FromRequest").identifiers)
    assert not reexports(_row(1, path, language, text), classify("FromReq").identifiers)  # in the text, not a name


@pytest.mark.parametrize(
    ("path", "language", "text"),
    [
        ("src/handler.rs", "rust", "use axum_core::extract::FromRequest;"),  # an import, not a re-export
        ("pkg/views.py", "python", "from pkg.core import FromRequest"),  # any module imports what it uses
        ("src/a.ts", "typescript", 'import { FromRequest } from "./core";'),
        ("api.go", "go", "type FromRequest = core.Other"),  # an alias to another name
        ("README.md", "markdown", "from mylib import FromRequest"),  # documentation shows imports
        ("src/lib.rs", "rust", "pub use crate::FromRequest::Settings;"),  # a path segment, not the leaf
        ("src/index.ts", "typescript", 'export { FromRequestParts } from "./core";'),
    ],
)
def test_imports_and_other_aliases_are_no_re_exports(path: str, language: str, text: str) -> None:
    assert not reexports(_row(1, path, language, text), classify("FromRequest").identifiers)


def test_the_re_export_leads_only_when_nothing_in_the_index_defines_the_name() -> None:
    # axum's FromRequest is defined in axum-core; usage sites outranked extract/mod.rs, which re-exports it
    profile = classify("FromRequest")
    usage = _row(1, "src/json.rs", "rust", "impl<S> FromRequest<S> for Json<T> {\n    type Rejection = R;\n}")
    usage = replace(usage, symbol="Json", kind="impl")
    reexport = _row(2, "src/extract/mod.rs", "rust", "mod rejection;\npub use axum_core::extract::{FromRequest};")
    rows = {1: usage, 2: reexport}
    fused = [Scored(1, 0.09, ["lexical"]), Scored(2, 0.05, ["lexical"])]
    assert rerank(fused, rows, profile)[0].id == 2
    assert rerank(fused, rows, profile, replace(DEFAULT, reexport=0))[0].id == 1  # the rule is what decides
    defined = _row(3, "src/from_request.rs", "rust", "pub trait FromRequest<S> {}", "FromRequest", "trait")
    rows[3] = defined
    with_def = [*fused, Scored(3, 0.04, ["symbol"])]
    no_boost = replace(DEFAULT, definition=0)  # the ablation: a definition still turns the re-export rule off
    assert rerank(with_def, rows, profile, no_boost) == rerank(with_def, rows, profile, replace(no_boost, reexport=0))
    ranked = rerank(with_def, rows, profile)
    assert ranked[0].id == 3  # the definition, once the index has it, and no re-export bonus then:
    assert [(s.id, s.score) for s in ranked] == [
        (s.id, s.score) for s in rerank(with_def, rows, profile, replace(DEFAULT, reexport=0))
    ]


def test_a_dollar_name_is_re_exported_and_a_constant_counts_as_defined() -> None:
    from gpubox.tools.search.exports import assigns

    row = _row(1, "src/index.ts", "typescript", 'export { $ZodType, ZodType } from "./schemas";')
    assert reexports(row, classify("$ZodType").identifiers)
    config = _row(2, "pkg/config.py", "python", "DEFAULT_TIMEOUT = 30\nOTHER: int = 1")
    assert assigns(config, ("DEFAULT_TIMEOUT",)) and assigns(config, ("OTHER",))
    assert not assigns(_row(3, "a.py", "python", "if DEFAULT_TIMEOUT == 30: pass"), ("DEFAULT_TIMEOUT",))
    init = _row(4, "pkg/__init__.py", "python", "from .config import DEFAULT_TIMEOUT")
    profile = classify("DEFAULT_TIMEOUT")
    fused = [Scored(2, 0.05, ["lexical"]), Scored(4, 0.05, ["lexical"])]
    ranked = rerank(fused, {2: config, 4: init}, profile)
    assert ranked == rerank(fused, {2: config, 4: init}, profile, replace(DEFAULT, reexport=0))  # no bonus


@pytest.mark.parametrize(
    "text",
    [
        "pub use " * 6250 + "abc",
        "pub use \n" * 6000 + "abc",
        "pub use a::{," + " " * 50_000 + "abd abc",
        "export {" * 6250 + "abc",
        "export {" + "abc, " * 10_000,
        "from x import (" + "abc, " * 10_000,
        ("static " * 100 + "\n") * 80 + "abc",
        "\n" * 50_000 + "abc",
    ],
)
def test_adversarial_chunks_are_read_in_linear_time(text: str) -> None:
    from gpubox.tools.search.exports import assigns

    for language in ("rust", "typescript", "python", "go", "java"):  # each took seconds to minutes when quadratic
        row = _row(1, "pkg/__init__.py", language, text)
        reexports(row, ("abc",))
        assigns(row, ("abc",))


def test_through_the_index_the_re_exporting_module_comes_first(tmp_path: Path) -> None:
    # the real chunker and index store, the lexical and symbol legs (no vectors): axum's layout in small
    from gpubox.tools.search.chunker import chunk_text
    from gpubox.tools.search.query import hybrid
    from gpubox.tools.search.store import IndexStore

    files = {
        # (the chunker keeps a top-level gap of three or more lines; a lone `pub use` line is not indexed)
        "extract/mod.rs": "//! Types and traits for extracting data from requests.\n\nmod rejection;\n\n"
        "pub use axum_core::extract::{FromRef, FromRequest, FromRequestParts};\n"
        "pub use self::rejection::*;\npub use self::json::Json;\n",
        "json.rs": "use axum_core::extract::FromRequest;\n\npub struct Json<T>(pub T);\n\n"
        "impl<T, S> FromRequest<S> for Json<T>\nwhere\n    T: DeserializeOwned,\n{\n"
        "    type Rejection = JsonRejection;\n"
        "    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {\n"
        "        let bytes = Bytes::from_request(req, state).await?;\n        Self::from_bytes(&bytes)\n    }\n}\n",
        "form.rs": "use axum_core::extract::FromRequest;\n\npub struct Form<T>(pub T);\n\n"
        "impl<T, S> FromRequest<S> for Form<T> {\n    type Rejection = FormRejection;\n"
        "    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {\n"
        "        todo_parse(req).await\n    }\n}\n",
    }
    for name in ("query", "path", "multipart", "bytes"):  # more usage sites, each naming the trait twice
        files[f"{name}.rs"] = (
            f"/// `{name}` as a [`FromRequest`] extractor.\npub struct Q{name};\n\n"
            f"impl<S> FromRequest<S> for Q{name} {{\n    type Rejection = Rejection;\n}}\n"
        )
    rows = [
        (path, c.start_line, c.end_line, c.symbol, c.kind, "rust", c.text, f"{path}:{c.start_line}", b"\0" * 16)
        for path, text in files.items()
        for c in chunk_text(text, "rust")
    ]
    store = IndexStore(tmp_path / "idx")
    try:
        with store.transaction() as db:
            store.insert_chunks(db, rows)
        ranked = hybrid(store, None, None, "FromRequest", "hybrid", 10, None, None)
        first = store.chunks([ranked[0].id])[ranked[0].id]
        assert first.path == "extract/mod.rs"
        off = hybrid(store, None, None, "FromRequest", "hybrid", 10, None, None, replace(DEFAULT, reexport=0))
        assert store.chunks([off[0].id])[off[0].id].path != "extract/mod.rs"  # the rule is what puts it first
    finally:
        store.close()
