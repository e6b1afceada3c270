"""bench/symbol_eval/build_queries.py: which ctags definitions become symbol queries (a name defined once, outside
tests and bundled code, at namespace scope), on a small tree labelled by the real universal-ctags."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, load_bench_script

build = load_bench_script(ROOT / "bench" / "symbol_eval", "build_queries")
pytestmark = pytest.mark.skipif(shutil.which("ctags") is None, reason="universal-ctags not installed")

FILES = {
    "src/cache.h": "namespace db {\nclass LruCache {\n public:\n  int Size() const;\n};\n}  // namespace db\n",
    "src/cache.cc": '#include "cache.h"\nnamespace db {\nint LruCache::Size() const { return 0; }\n'
    "int ComputeChecksum(int x) { return x * 31; }\n}  // namespace db\n",
    "src/a.h": "struct Options { int a; };\n",
    "src/b.h": "struct Options { int b; };\n",  # defined twice: no query can name one file
    "tests/cache_test.cc": "class FakeClock { int now; };\n",
    "src/x.h": "struct Ab { int a; };\n",  # shorter than four letters
}


def test_only_names_defined_once_outside_tests_become_queries(tmp_path: Path) -> None:
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    items = build.queries(tmp_path, "t", "C,C++")
    assert {(i["query"], i["relevant"][0]) for i in items} == {
        ("LruCache", "src/cache.h"),
        ("ComputeChecksum", "src/cache.cc"),
    }
    assert all(i["category"] == "symbol" and i["secondary"] == [] for i in items)
    assert items == build.queries(tmp_path, "t", "C,C++")  # the same draw every time
    json.dumps(items)  # written as semble's annotation files are


def test_prominent_names_are_the_most_mentioned_types_defined_once(tmp_path: Path) -> None:
    files = {
        **FILES,
        "src/user.cc": '#include "cache.h"\nnamespace db {\nLruCache* Make();\nvoid Use(LruCache& c, Options o);\n}\n',
        "src/other.cc": "namespace db {\nvoid Other(LruCache* c);\nstruct Rare { int r; };\n}\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    items = build.prominent_queries(tmp_path, "t", "C,C++")
    # LruCache (4 files name it) before Rare (1); Options is defined twice, FakeClock only in tests, Ab too short,
    # ComputeChecksum no type
    assert [(i["query"], i["relevant"][0]) for i in items] == [("LruCache", "src/cache.h"), ("Rare", "src/other.cc")]
