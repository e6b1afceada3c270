"""A capitalised word in a sentence is looked up as a type's name (compounds._capitalised)."""

from __future__ import annotations

from pathlib import Path

from gpubox.tools.search.chunker import chunk_text
from gpubox.tools.search.query import compounds
from gpubox.tools.search.query_kind import classify
from gpubox.tools.search.store import IndexStore


def test_capitalised_words_join_the_compound_names_and_sentence_words_do_not() -> None:
    profile = classify("how Key type is used as object field identifier")
    assert "key" in profile.compounds and "how" not in profile.compounds
    assert "type" not in profile.compounds  # lower case: an English word
    assert "response" in classify("Response type and HTTP response construction in Vapor").compounds
    # a qualified or written identifier is the symbol leg's, and an acronym or a two-letter word is no type name
    assert not {"flask", "route", "http", "io"} & set(classify("what does Flask.route do over HTTP and IO").compounds)
    for query in ("how does Foo::Bar work", "\\Monolog\\Logger in Data/Aeson/Key.hs", "is Rack#call rack"):
        assert not {"foo", "bar", "monolog", "logger", "data", "aeson", "key", "rack"} & set(classify(query).compounds)
    assert {"handler", "response"} <= set(classify("Responses are built by Handlers").compounds)  # singular too


def test_the_compound_leg_finds_the_type_a_capitalised_word_names(tmp_path: Path) -> None:
    # aeson's Data/Aeson/Key.hs: `newtype Key`, beside a helper whose name is the word in lower case
    files = {
        ("Data/Aeson/Key.hs", "haskell"): "module Data.Aeson.Key where\n\nnewtype Key = Key Text\n  deriving (Eq)\n",
        ("util.py", "python"): "def key(obj):\n    return obj.key\n",
    }
    store = IndexStore(tmp_path / "idx")
    with store.transaction() as db:
        store.insert_chunks(
            db,
            [
                (path, c.start_line, c.end_line, c.symbol, c.kind, lang, c.text, f"{path}{n}", b"\0" * 16)
                for (path, lang), text in files.items()
                for n, c in enumerate(chunk_text(text, lang))
            ],
        )
    try:
        found = compounds(store, classify("how Key type is used as object field identifier").compounds, 10, None)
        rows = store.chunks(found)
        assert [(r.path, r.symbol) for r in rows.values()] == [("Data/Aeson/Key.hs", "Key")]  # the type, not key()
    finally:
        store.close()
