"""The code-search evaluation set (bench/search_eval): query files follow the shared format, labelled spans exist in
the fetched code bases, and the harness's pieces (digest check, extraction, BM25 baseline, metrics) behave."""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, load_bench_script

EVAL = ROOT / "bench" / "search_eval"


fetch = load_bench_script(EVAL, "fetch")
evalset = load_bench_script(EVAL, "evalset")
bm25 = load_bench_script(EVAL, "bm25")
QUERY_FILES = sorted((EVAL / "queries").glob("*.jsonl"))
SPECS = {s.name: s for s in fetch.load_specs()}
COMMENT = re.compile(r"^\s*(#|//|/\*|\*|--)")


def test_every_query_file_parses_and_belongs_to_a_corpus_spec() -> None:
    assert QUERY_FILES, "bench/search_eval/queries/ has no query file"
    ids: list[str] = []
    for path in QUERY_FILES:
        queries = evalset.load_queries(path.stem)
        assert path.stem in SPECS, f"{path.name} has no corpora/{path.stem}.json"
        assert {q.split for q in queries} == {"dev", "test"}, f"{path.name} needs both a dev and a test split"
        ids += [q.id for q in queries]
    assert not [i for i, n in Counter(ids).items() if n > 1], "query ids must be unique across files"


def test_conceptual_queries_name_several_targets() -> None:
    for path in QUERY_FILES:
        for q in evalset.load_queries(path.stem):
            if q.kind == "conceptual":
                assert len(q.targets) >= 2, f"{q.id}: a conceptual query spans several definitions"


@pytest.mark.parametrize("corpus", sorted(p.stem for p in QUERY_FILES))
def test_every_target_span_lies_on_code_in_the_fetched_corpus(corpus: str) -> None:
    root = fetch.DEFAULT_DEST / corpus
    marker = fetch.DEFAULT_DEST / f".{corpus}.sha256"
    if not (root.is_dir() and marker.exists() and marker.read_text().strip() == SPECS[corpus].sha256):
        pytest.skip(f"{corpus} is not fetched; run .venv/bin/python bench/search_eval/fetch.py {corpus}")
    problems = []
    for q in evalset.load_queries(corpus):
        for t in q.targets:
            file = root / t.path
            if not file.is_file():
                problems.append(f"{q.id}: {t.path} does not exist")
                continue
            lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
            if t.end > len(lines):
                problems.append(f"{q.id}: {t.path} has {len(lines)} lines, target ends at {t.end}")
            elif not lines[t.start - 1].strip() or COMMENT.match(lines[t.start - 1]):
                problems.append(f"{q.id}: {t.path}:{t.start} is blank or a comment, not a definition")
    assert not problems, "\n".join(problems)


def test_a_malformed_query_line_is_rejected_with_its_location() -> None:
    good = {"id": "x-nl-01", "corpus": "x", "kind": "nl", "query": "q", "split": "dev",
            "targets": [{"path": "a.py", "start": 3, "end": 9}]}  # fmt: skip
    assert evalset.parse_query(json.dumps(good), "x.jsonl:1").targets[0].end == 9
    for bad, msg in [
        ({**good, "kind": "fuzzy"}, "kind must be"),
        ({**good, "split": "train"}, "split must be"),
        ({**good, "targets": [{"path": "../a.py", "start": 1, "end": 2}]}, "relative to the corpus root"),
        ({**good, "targets": [{"path": "a.py", "start": 5, "end": 2}]}, "start <= end"),
        ({**good, "targets": []}, "no targets"),
    ]:
        with pytest.raises(evalset.EvalSetError, match=msg):
            evalset.parse_query(json.dumps(bad), "x.jsonl:1")


def test_a_hit_needs_the_right_file_and_an_overlapping_span() -> None:
    targets = (evalset.Target("src/a.py", 10, 20),)
    hits = [("src/b.py", 10, 20), ("src/a.py", 1, 9), ("src/a.py", 18, 40)]
    assert evalset.first_rank(hits, targets) == 3
    assert evalset.first_rank(hits[:2], targets) is None
    m = evalset.metrics([1, 3, None, 12])
    assert m == {"recall@1": 0.25, "recall@5": 0.5, "recall@10": 0.5, "mrr@10": pytest.approx((1 + 1 / 3) / 4)}


def _spec(tmp_path: Path, archive: Path, sha: str, subdir: str = "pkg-1.0/src") -> Any:
    return fetch.CorpusSpec(name="pkg", language="python", registry="pypi", package="pkg", version="1.0",
                            file=archive.name, sha256=sha, subdir=subdir, license="MIT")  # fmt: skip


def _tarball(tmp_path: Path) -> Path:
    archive = tmp_path / "cache" / "pkg-1.0.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tf:
        data = b"def hello():\n    return 1\n"
        info = tarfile.TarInfo("pkg-1.0/src/mod.py")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return archive


def test_a_cached_archive_with_the_pinned_digest_is_extracted_from_its_subdir_without_network(tmp_path: Path) -> None:
    archive = _tarball(tmp_path)
    spec = _spec(tmp_path, archive, fetch.sha256_of(archive))
    root = fetch.fetch(spec, archive.parent, tmp_path / "corpora")
    assert root == tmp_path / "corpora" / "pkg"
    assert (root / "mod.py").read_text().startswith("def hello")
    (root / "mod.py").write_text("changed")  # a second fetch with the same digest leaves the tree alone
    assert fetch.fetch(spec, archive.parent, tmp_path / "corpora") == root
    assert (root / "mod.py").read_text() == "changed"


def test_an_archive_whose_digest_differs_from_the_spec_is_refused(tmp_path: Path) -> None:
    archive = _tarball(tmp_path)
    spec = _spec(tmp_path, archive, "0" * 64)
    with pytest.raises(fetch.FetchError, match="refusing"):
        fetch.fetch(spec, archive.parent, tmp_path / "corpora")
    assert not (tmp_path / "corpora" / "pkg").exists()


def test_a_subdir_missing_from_the_archive_is_a_clear_error(tmp_path: Path) -> None:
    archive = _tarball(tmp_path)
    spec = _spec(tmp_path, archive, fetch.sha256_of(archive), subdir="pkg-1.0/lib")
    with pytest.raises(fetch.FetchError, match=re.escape("subdir 'pkg-1.0/lib' is not a directory")):
        fetch.fetch(spec, archive.parent, tmp_path / "corpora")


def test_bm25_tokens_split_camel_and_snake_case_and_keep_the_whole_identifier() -> None:
    assert bm25.tokenize("parseHTTPHeader") == ["parsehttpheader", "parse", "http", "header"]
    assert bm25.tokenize("max_retry_count") == ["max_retry_count", "max", "retry", "count"]


def test_bm25_cuts_definitions_and_ranks_the_one_with_the_rare_terms_first(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "import os\n\n\ndef read_config(path):\n    return open(path).read()\n\n\n"
        "class RetryPolicy:\n    def backoff_delay(self, attempt):\n        return 2 ** attempt\n"
    )
    (tmp_path / "b.go").write_text("package b\n\nfunc ParseConfig(s string) error {\n\treturn nil\n}\n")
    index = bm25.BM25Index(tmp_path)
    spans = {(c.path, c.start, c.end) for c in index.chunks}
    assert {("a.py", 1, 3), ("a.py", 4, 7), ("a.py", 8, 8), ("a.py", 9, 10), ("b.go", 3, 5)} <= spans
    top = index.search("exponential backoff delay for an attempt", 3)
    assert (top[0].path, top[0].start) == ("a.py", 9)
    assert index.search("zzz qqq") == []
