"""Repositories and index files that failed a whole index run or a whole tool (a read-only hostile pass): a
.gitignore rule pathspec refuses or one behind a byte-order mark, ~1,000 nested namespaces, a path over 4,096
bytes, one 300 KB line after ordinary ones, rules of the .gitignore above an indexed subfolder, a damaged
index.sqlite that hid every index, a truncated FAISS file, non-ASCII words the lexical leg dropped, and
'src/**/*.py' missing src/a.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpubox.errors import NotFoundError
from gpubox.settings import Settings
from gpubox.tools.search.chunker import chunk_text
from gpubox.tools.search.filters import matches
from gpubox.tools.search.service import SearchService
from gpubox.tools.search.walker import WalkOptions, walk
from tests.search.conftest import finished


def walked(root: Path, max_bytes: int = 1_000_000, roots: tuple[Path, ...] = ()) -> tuple[list[str], dict[str, int]]:
    result = walk(root, WalkOptions(include=[], exclude=[], max_file_bytes=max_bytes, roots=roots or (root,)))
    return [rel for rel, _ in result.files], dict(result.excluded)


def test_gitignore_rules_pathspec_refuses_or_a_bom_hides_leave_the_others_working(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_bytes(b"\xef\xbb\xbfsecret.py\r\n!\r\nbuild\\\r\n[z-a]\r\nother.py\r\n")
    for name in ("a.py", "secret.py", "other.py"):
        (tmp_path / name).write_text("x = 1\n")
    files, excluded = walked(tmp_path)  # '!' and a trailing backslash raised and failed the run
    assert files == ["a.py"] and excluded[".gitignore"] == 2  # the BOM hid secret.py's rule


def test_deep_nesting_is_windowed_and_a_too_long_path_is_counted_not_raised(tmp_path: Path) -> None:
    nested = "".join(f"namespace n{i} {{\n" for i in range(1000)) + "int x;\n" + "}\n" * 1000
    chunks = chunk_text(nested, "cpp")  # RecursionError failed the whole run
    assert chunks and chunks[0].kind == "window"
    fd = os.open(tmp_path, os.O_RDONLY)
    for i in range(20):  # 20 x 241 bytes, made relative to each parent: past PATH_MAX, under the depth limit
        name = f"{i:02d}" + "d" * 239
        os.mkdir(name, dir_fd=fd)
        fd, parent = os.open(name, os.O_RDONLY, dir_fd=fd), fd
        os.close(parent)
    os.close(fd)
    (tmp_path / "ok.py").write_text("x = 1\n")
    files, excluded = walked(tmp_path)
    assert files == ["ok.py"] and excluded.get("unreadable folder", 0) >= 1, excluded


def test_a_huge_line_keeps_its_start_and_the_file_its_lines() -> None:
    """The minified check reads the first 8 KB: a 20 MB line after them was one 20 MB chunk (4.8 GB of RAM)."""
    text = "var a = 1;\n" * 1000 + "var s = '" + "x" * 300_000 + "';\nvar z = 2;\n"
    chunks = chunk_text(text, "javascript")
    assert max(len(c.text) for c in chunks) < 10_000 and chunks[-1].end_line == 1002
    assert any(c.text.endswith("…") or "x" * 900 in c.text for c in chunks)


def test_an_indexed_subfolder_follows_the_gitignore_above_it_unless_it_is_ignored_itself(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".gitignore").write_text("secret_cfg.py\n/src/sub/*\nvendor/\n")
    (repo / "src" / "sub").mkdir(parents=True)
    for rel in ("src/a.py", "src/secret_cfg.py", "src/sub/d.py"):
        (repo / rel).write_text("x = 1\n")
    files, excluded = walked(repo / "src", roots=(tmp_path,))  # as git: the rules above apply below them
    assert files == ["a.py"] and excluded[".gitignore"] == 2
    assert walked(repo / "src", roots=(repo / "src",))[0] == ["a.py", "secret_cfg.py", "sub/d.py"]  # never read
    # outside the allowed roots
    (repo / "vendor" / "lib").mkdir(parents=True)
    (repo / "vendor" / "lib" / "v.py").write_text("y = 2\n")
    assert walked(repo / "vendor" / "lib", roots=(tmp_path,))[0] == ["v.py"]  # an ignored folder asked for by name


def test_query_words_fold_as_fts5_unicode61_stores_them() -> None:
    import sqlite3

    from gpubox.tools.search.query import fold

    words = ["größe", "Café", "naïve", "ελληνικά", "tiếng", "がぎぐ", "한국어", "İstanbul", "Ångström", "HTTPServer"]
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='unicode61')")
    db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'row')")
    db.execute("INSERT INTO t VALUES (?)", (" ".join(words),))
    vocab = {row[0] for row in db.execute("SELECT term FROM v")}
    assert [w for w in words if fold(w) not in vocab] == []


def test_globstar_also_matches_no_folder() -> None:
    assert matches("src/a.py", "src/**/*.py") and matches("src/sub/b.py", "src/**/*.py")
    assert matches("a/b/c.py", "a/**/b/**/c.py") and matches("setup.py", "**/setup.py")
    assert not matches("lib/c.py", "src/**/*.py")


@pytest.mark.slow  # builds an index
def test_damaged_index_files_are_reported_dropped_or_rebuilt_and_non_ascii_words_are_found(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "repo").mkdir(parents=True)
    (root / "repo" / "calc.py").write_text(
        'def größe_berechnen(pfad):\n    """Dateigröße in Bytes: naïve café."""\n    return len(pfad)\n'
    )
    (root / "repo" / "other.py").write_text("def unrelated():\n    return 2\n")
    svc = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[root]))
    try:
        finished(svc.start_index(str(root / "repo"), "r", [], [], None)[2])
        for word in ("größe", "Dateigröße", "café", "naïve"):  # cut to 'caf' or dropped: no hit
            hits = svc.search(word, "r", 5, 0, None, None, "lexical", 200).hits
            assert hits and hits[0].path == "calc.py", word
        store = svc.store("r")
        faiss = store.dir / store.meta()["faiss_file"]
        faiss.write_bytes(faiss.read_bytes()[:100])
        svc._faiss.clear()  # as after a restart: the file is read again
        assert svc.search("compute the size", "r", 5, 0, None, None, "vector", 200).hits  # RuntimeError before
        assert len(faiss.read_bytes()) > 100  # written back: the next start reads it again
        (svc.base / "zz").mkdir()
        (svc.base / "zz" / "index.sqlite").write_bytes(b"not a database" * 100)
        listed = {i.name: i for i in svc.list().indexes}  # a masked error for every index before
        assert (
            listed["r"].state == "ready"
            and listed["zz"].state == "damaged"
            and "search_drop" in str(listed["zz"].error)
        )
        with pytest.raises(NotFoundError, match="damaged"):
            svc.search("x", "zz", 5, 0, None, None, "lexical", 200)
        assert svc.drop("zz").dropped and [i.name for i in svc.list().indexes] == ["r"]
    finally:
        svc.close()
