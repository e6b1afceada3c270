"""Chunk line numbers agree with tree-sitter's, and no file with content is left without a chunk."""

from __future__ import annotations

import pytest

from gpubox.tools.search.chunker import chunk_text, split_lines


def test_lines_are_cut_at_newlines_only() -> None:
    assert split_lines("a\nb\fc\vd\x85e\u2028f\n") == ["a", "b\fc\vd\x85e\u2028f"]
    assert split_lines("") == []
    assert split_lines("x") == ["x"]
    assert split_lines("x\n\n") == ["x", ""]


def test_a_form_feed_does_not_shift_the_symbols_after_it() -> None:
    # GNU-style sources separate pages with ^L on a line of its own; str.splitlines counted it as a line break
    source = "def first():\n    return 1\n\x0c\ndef second():\n    return 2\n"
    chunks = {c.symbol: c for c in chunk_text(source, "python")}
    assert (chunks["second"].start_line, chunks["second"].end_line) == (4, 5)
    assert chunks["second"].text == "def second():\n    return 2"


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_windows_and_classic_mac_newlines_count_lines_as_an_editor_does(newline: str) -> None:
    source = newline.join(["import os", "", "def f():", "    return 1", "", "def g():", "    return 2", ""])
    chunks = chunk_text(source, "python")
    assert [(c.symbol, c.start_line, c.end_line, c.text) for c in chunks] == [
        ("f", 3, 4, "def f():\n    return 1"),
        ("g", 6, 7, "def g():\n    return 2"),
    ]


@pytest.mark.parametrize(
    ("source", "language"),
    [
        ("pub use self::from_request::FromRequest;\n", "rust"),
        ("export * from './core';\nexport { z } from './z';\n", "typescript"),
        ("from .client import Client\n", "python"),
        ("x\n", "text"),
    ],
)
def test_a_file_of_a_line_or_two_and_no_symbol_is_one_chunk(source: str, language: str) -> None:
    chunks = chunk_text(source, language)
    assert len(chunks) == 1
    assert chunks[0].text == source.rstrip("\n")
    assert (chunks[0].start_line, chunks[0].end_line) == (1, source.count("\n"))


def test_short_gaps_beside_symbols_are_still_left_out() -> None:
    # imports above a function hold nothing a search asks for; only a file with nothing else keeps them
    chunks = chunk_text("import os\n\ndef f():\n    return os.sep\n", "python")
    assert [(c.symbol, c.start_line) for c in chunks] == [("f", 3)]


def test_a_blank_file_has_no_chunk() -> None:
    assert chunk_text("\n\n  \n", "python") == []


def test_a_stray_carriage_return_in_a_newline_file_is_no_line_break() -> None:
    # grep -n, sed and git number `f` line 2 here: only a file with no \n at all is a classic Mac file
    chunks = chunk_text("x = 1\r\r\ndef f():\r\n    return 1\r\n", "python")
    assert [(c.symbol, c.start_line, c.end_line) for c in chunks] == [("f", 2, 3)]


@pytest.mark.parametrize(
    ("source", "language"),
    [
        ("}\n", "javascript"),  # braces and comments only: nothing to find
        ("// generated\n/* empty */\n", "typescript"),
        ("!function(){" + "var a=1;" * 400 + "}();\n", "javascript"),  # a one-line bundle without a .min.js name
    ],
)
def test_a_short_file_of_nothing_to_find_stays_unchunked(source: str, language: str) -> None:
    assert chunk_text(source, language) == []
