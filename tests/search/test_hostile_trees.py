"""Trees and timings that froze or crashed the search tools: a pathological .gitignore line, a header full of
unclosed comments, a one-line minified bundle, a file name that is not UTF-8, a very deep tree, and an index
dropped while other threads search it (closing their SQLite connections under them crashed the process)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpubox.errors import BusyError, GpuboxError, NotFoundError
from gpubox.settings import Settings
from gpubox.tools.search.service import DROPPED, SearchService
from gpubox.tools.search.walker import WalkOptions, walk, without_comments
from tests.search.conftest import finished


def walked(root: Path) -> tuple[list[str], dict[str, int]]:
    result = walk(root, WalkOptions(include=[], exclude=[], max_file_bytes=1_000_000))
    return [rel for rel, _ in result.files], dict(result.excluded)


def test_a_gitignore_line_that_backtracks_badly_is_left_out(tmp_path: Path) -> None:
    rules = "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b\n*a*a*a*a*b\nsecret.py\n**/build/**/*.py\n"
    (tmp_path / ".gitignore").write_text(rules)
    (tmp_path / ("a" * 200 + ".py")).write_text("x = 1\n")  # matched against those, this never finished
    (tmp_path / "secret.py").write_text("y = 2\n")
    (tmp_path / "x" / "build" / "y").mkdir(parents=True)
    (tmp_path / "x" / "build" / "y" / "z.py").write_text("w = 3\n")
    files, excluded = walked(tmp_path)
    assert files == ["a" * 200 + ".py"] and excluded[".gitignore"] == 2  # the sane rules still apply


def test_comments_are_blanked_in_linear_time_and_as_the_regex_did() -> None:
    old = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
    for text in ("a /* b */ c // d\ne", "/*/ x */ y", "x /* open // not a line\n", "// last", "/* a */ /* b"):
        assert without_comments(text) == old.sub(" ", text)
    assert without_comments("/*x" * 200_000) == "/*x" * 200_000  # 600 KB: the regex took minutes


def test_minified_files_names_that_are_not_utf8_and_very_deep_folders_are_skipped_with_reasons(
    tmp_path: Path,
) -> None:
    (tmp_path / "bundle.js").write_text("function a(){return 1};" * 1000)  # one 23 KB line, not named *.min.js
    (tmp_path / "ok.py").write_text("def f():\n    return 1\n")
    icon = "ICON = '<svg>" + "M0 0L1 1" * 700 + "</svg>'\n"  # one long line among ordinary code: indexed
    (tmp_path / "icons.py").write_text("import os\n" * 20 + icon + "def g():\n    return ICON\n" * 40)
    os.close(os.open(os.fsencode(tmp_path) + b"/caf\xe9.py", os.O_CREAT | os.O_WRONLY))
    deep = tmp_path.joinpath(*["d"] * 70)
    deep.mkdir(parents=True)
    (deep / "deep.py").write_text("w = 4\n")
    files, excluded = walked(tmp_path)
    assert files[:2] == ["icons.py", "ok.py"] and "bundle.js" not in files and all("caf" not in f for f in files)
    assert excluded["minified (lines over 4,000 characters)"] == 1 and excluded["file name is not UTF-8"] == 1
    assert excluded["deeper than 64 folders"] == 1 and "deep.py" not in " ".join(files)


@pytest.mark.slow  # builds an index
def test_dropping_an_index_while_others_search_it_ends_their_searches_cleanly(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "repo").mkdir(parents=True)
    for i in range(20):
        (root / "repo" / f"m{i}.py").write_text(f"def alpha_{i}():\n    return {i}\n")
    svc = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[root]))
    try:
        name, _, progress = svc.start_index(str(root / "repo"), "r", [], [], None)
        finished(progress)
        stop, errors = threading.Event(), []

        def search() -> None:
            while not stop.is_set():
                try:
                    svc.search("alpha", "r", 5, 0, None, None, "lexical", 800)
                except GpuboxError as exc:  # after the drop: "unknown index" or "was dropped", never a crash
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=search) for _ in range(3)]
        for t in threads:
            t.start()
        assert svc.drop(name).dropped
        stop.set()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert not list((tmp_path / "state" / "search").glob(f"*{DROPPED}*")) and svc.names() == []
        finished(svc.start_index(str(root / "repo"), "r", [], [], None)[2])  # the name is free again
        assert svc.search("alpha", "r", 5, 0, None, None, "lexical", 800).hits
    finally:
        svc.close()


def lock_held_elsewhere(lock: Path) -> subprocess.Popen[str]:
    """A second gpubox server's run holding the index's lock, until its stdin closes (`communicate("")`)."""
    other = subprocess.Popen(
        [sys.executable, "-c", f"import sys; from gpubox.filelock import try_exclusive; from pathlib import Path\n"
         f"held = try_exclusive(Path({str(lock)!r})); print('held' if held else 'no', flush=True)\n"
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert other.stdout is not None and other.stdout.readline().strip() == "held"
    return other


@pytest.mark.slow  # builds an index, starts a process
def test_an_index_another_server_is_building_is_neither_built_again_nor_dropped_here(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "repo").mkdir(parents=True)
    (root / "repo" / "m.py").write_text("def alpha():\n    return 1\n")
    svc = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[root]))
    try:
        finished(svc.start_index(str(root / "repo"), "r", [], [], None)[2])
        other = lock_held_elsewhere(tmp_path / "state" / "search" / "r" / "run.lock")
        try:
            with pytest.raises(BusyError, match="being built by another gpubox server"):
                svc.start_index(str(root / "repo"), "r", [], [], None)
            with pytest.raises(BusyError, match="drop it when that run ends"):  # was "search it": a drop's advice
                svc.drop("r")
            assert svc.indexing() == [] and svc.names() == ["r"]  # the refusal left no job and no reservation
            assert svc.ledger.state().holdings == []
        finally:
            other.communicate("")
        finished(svc.start_index(str(root / "repo"), "r", [], [], None)[2])  # free again once that run ends
    finally:
        svc.close()


@pytest.mark.slow  # builds an index
def test_paging_through_a_query_serves_each_hit_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "repo").mkdir(parents=True)
    for i in range(70):  # more hits than the first pool of 50 candidates
        (root / "repo" / f"m{i}.py").write_text(f"def handler_{i}(request):\n    return request.value + {i}\n")
    svc = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[root]))
    try:
        finished(svc.start_index(str(root / "repo"), "r", [], [], None)[2])
        seen: list[tuple[str, int]] = []
        offset: int | None = 0
        while offset is not None:
            page = svc.search("request handler", "r", 10, offset, None, None, "hybrid", 200)
            seen += [(h.path, h.start_line) for h in page.hits]
            offset = page.next_offset
        assert len(seen) == len(set(seen)) and len({p for p, _ in seen}) == 70  # none repeated, none skipped
    finally:
        svc.close()


def test_a_snippet_of_a_line_longer_than_its_budget_shows_the_lines_start() -> None:
    from gpubox.tools.search.query import snippet

    text, cut = snippet("x = [" + "1, " * 500 + "]\nnext line\n", "next", 40)
    assert cut and text.startswith("next line")  # a context line too long to show is left out, not the match
    text, cut = snippet("a = 1\nnext = [" + "1, " * 500 + "]\n", "next", 40)
    assert cut and text.startswith("a = 1\nnext = [1, ") and text.endswith("…")


@pytest.mark.slow  # builds two indexes
def test_an_index_dropped_and_built_again_under_its_name_never_serves_the_old_ones_hits(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for repo, body in (("one", "def alpha_old():\n    return 1\n"), ("two", "def alpha_new():\n    return 2\n")):
        (root / repo).mkdir(parents=True)
        (root / repo / f"{repo}.py").write_text(body)
    svc = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[root]))
    try:
        for repo in ("one", "two"):  # both at generation 1, under one name
            finished(svc.start_index(str(root / repo), "r", [], [], None)[2])
            for mode in ("hybrid", "vector", "lexical"):
                hits = svc.search("alpha", "r", 5, 0, None, None, mode, 800).hits
                assert hits and {h.path for h in hits} == {f"{repo}.py"}, (repo, mode)
            svc.drop("r")
    finally:
        svc.close()


def test_searching_an_index_another_server_is_building_says_so(tmp_path: Path) -> None:
    """Before that run's first commit, search_code said "the last indexing run was interrupted" while the other
    server's search_list said "indexing"."""
    svc = SearchService(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path]))
    try:
        svc.store("r", create=True)  # an index folder with no committed data, as a run makes it
        other = lock_held_elsewhere(tmp_path / "state" / "search" / "r" / "run.lock")
        try:
            with pytest.raises(NotFoundError, match="another gpubox server on this box is building it"):
                svc.search("alpha", "r", 5, 0, None, None, "lexical", 200)
        finally:
            other.communicate("")
        with pytest.raises(NotFoundError, match="not built"):  # that run gone: no longer said to be running
            svc.search("alpha", "r", 5, 0, None, None, "lexical", 200)
    finally:
        svc.close()
