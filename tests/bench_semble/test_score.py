"""bench/semble_eval: the port of semble's benchmark scoring (hand-computed NDCG values, path-suffix and
line-overlap matching, per-repository aggregation), the fixed tune/report split, and the snapshot extraction.
Fast and model-free: nothing here needs semble's snapshot, a corpus or the network."""

from __future__ import annotations

import json
import math
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import ROOT, load_bench_script

EVAL = ROOT / "bench" / "semble_eval"


score = load_bench_script(EVAL, "score")
split = load_bench_script(EVAL, "split")
fetch_repos = load_bench_script(EVAL, "fetch_repos")


def q(relevant: list, secondary: list | None = None, query: str = "how does routing work") -> dict:
    return {"query": query, "relevant": relevant, "secondary": secondary or [], "category": "architecture"}


def filler(n: int) -> list[tuple[str, int, int]]:
    return [(f"other/f{i}.py", 1, 10) for i in range(n)]


# ---- NDCG@10 on hand-computed examples


def test_perfect_ranking_scores_one() -> None:
    assert score.score_query([("src/flask/app.py", 1, 50)], q(["src/flask/app.py"]))["ndcg10"] == 1.0
    both = q(["src/flask/app.py"], ["src/flask/ctx.py"])
    assert score.score_query([("app.py", 1, 9), ("ctx.py", 1, 9), *filler(8)], both)["ndcg10"] == pytest.approx(1.0)


def test_relevant_file_at_rank_three() -> None:
    # DCG = 1/log2(3 + 1) = 0.5, ideal DCG = 1 (one target)
    out = score.score_query([*filler(2), ("app.py", 1, 9), *filler(7)], q(["src/flask/app.py"]))
    assert out["ndcg10"] == pytest.approx(0.5)
    assert out["ranks"] == [3] and out["n_relevant"] == 1


def test_two_targets_at_ranks_one_and_three() -> None:
    # (1 + 1/log2 4) / (1 + 1/log2 3) = 1.5 / 1.6309297535714575
    hits = [("a.py", 1, 9), ("x.py", 1, 9), ("b.py", 1, 9)]
    out = score.score_query(hits, q(["a.py"], ["b.py"]))
    assert out["ndcg10"] == pytest.approx(1.5 / (1 + 1 / math.log2(3)))
    assert out["ndcg10"] == pytest.approx(0.9197207891481876)


def test_ideal_counts_at_most_ten_targets_and_every_target_counts() -> None:
    twelve = [f"f{i}.py" for i in range(12)]
    assert score.score_query([(p, 1, 2) for p in twelve[:10]], q(twelve))["ndcg10"] == pytest.approx(1.0)
    # a target that is never found still counts in the ideal (n_relevant = all targets, as at the pinned commit)
    out = score.score_query([("a.py", 1, 2)], q(["a.py"], ["never.py"]))
    assert out["ndcg10"] == pytest.approx(1 / (1 + 1 / math.log2(3)))
    assert out["ranks"] == [1, None]


def test_only_the_top_ten_count_and_ndcg5_cuts_at_five() -> None:
    assert score.score_query([*filler(10), ("a.py", 1, 2)], q(["a.py"]))["ndcg10"] == 0.0
    out = score.score_query([*filler(5), ("a.py", 1, 2)], q(["a.py"]))
    assert out["ndcg5"] == 0.0 and out["ndcg10"] == pytest.approx(1 / math.log2(7))
    assert score.score_query([], q(["a.py"]))["ndcg10"] == 0.0
    assert score.score_query([("a.py", 1, 2)], q([]))["ndcg10"] == 0.0  # no targets: 0, as metrics.ndcg_at_k


def test_targets_first_found_at_the_same_rank_count_once() -> None:
    # semble sets relevances[rank - 1] = 1: one chunk covering two targets earns one gain, the ideal expects two
    item = q(["a.py"], [{"path": "a.py", "start_line": 5, "end_line": 8}])
    assert score.score_query([("a.py", 1, 20)], item)["ndcg10"] == pytest.approx(1 / (1 + 1 / math.log2(3)))


# ---- matching: path suffix and line overlap


@pytest.mark.parametrize(
    ("hit", "target", "match"),
    [
        ("src/flask/app.py", "src/flask/app.py", True),
        ("sansio/app.py", "src/flask/sansio/app.py", True),  # hit relative to the indexed folder
        ("app.py", "src/flask/sansio/app.py", True),  # either path may be the suffix, at a '/' boundary
        ("/tmp/bench/flask/src/flask/app.py", "src/flask/app.py", True),  # absolute hit
        ("pp.py", "src/flask/app.py", False),  # not at a '/' boundary
        ("flask/ctx.py", "src/flask/app.py", False),
        ("src\\flask\\app.py", "src/flask/app.py", True),  # backslashes normalised
        ("__init__.py", "src/flask/json/__init__.py", True),  # semble's rule, quirk included
    ],
)
def test_path_suffix_matching(hit: str, target: str, match: bool) -> None:
    assert score.path_matches(hit, target) is match
    assert (score.score_query([(hit, 1, 5)], q([target]))["ndcg10"] == 1.0) is match


@pytest.mark.parametrize(
    ("start", "end", "match"),
    [(1, 9, False), (1, 10, True), (12, 15, True), (20, 30, True), (21, 30, False), (1, 100, True)],
)
def test_line_overlap_is_inclusive(start: int, end: int, match: bool) -> None:
    item = q([{"path": "src/lib.rs", "start_line": 10, "end_line": 20}])
    assert (score.score_query([("lib.rs", start, end)], item)["ndcg10"] == 1.0) is match


def test_targets_without_span_match_any_lines_and_spans_may_be_strings() -> None:
    assert score.score_query([("lib.rs", 900, 950)], q(["src/lib.rs"]))["ndcg10"] == 1.0
    t = score.parse_target({"path": "a.py", "start_line": "3", "end_line": "7"})
    assert (t.start_line, t.end_line, t.has_span) == (3, 7, True)
    assert not score.parse_target({"path": "a.py", "start_line": 3}).has_span  # half a span is no span


def test_category_inference_for_items_without_one() -> None:
    assert score.infer_category("HandlerStack") == "symbol"
    assert score.infer_category("How are routes registered") == "architecture"
    assert score.infer_category("session management") == "semantic"
    assert score.parse_query({"query": "Router", "relevant": ["a.go"]}).category == "symbol"


# ---- aggregation


def test_aggregate_means_per_repository_then_over_repositories() -> None:
    rows = [
        {"repo": "a", "category": "symbol", "ndcg10": 1.0, "ndcg5": 1.0, "language": "go"},
        {"repo": "a", "category": "semantic", "ndcg10": 0.0, "ndcg5": 0.0, "language": "go"},
        {"repo": "b", "category": "semantic", "ndcg10": 1.0, "ndcg5": 1.0, "language": "rust"},
    ]
    out = score.aggregate(rows, half=None, split_path=Path("/nonexistent"))
    assert out["repos"]["a"]["ndcg10"] == 0.5 and out["repos"]["b"]["ndcg10"] == 1.0
    assert out["summary"]["ndcg10"] == 0.75  # not the query mean 2/3
    # a category is averaged over the repositories that have it: symbol only in a, semantic in a (0.0) and b (1.0)
    assert out["summary"]["by_category"] == {"semantic": 0.5, "symbol": 1.0}
    assert out["by_language"] == {"go": {"repos": 1, "ndcg10": 0.5}, "rust": {"repos": 1, "ndcg10": 1.0}}


def test_aggregate_restricts_to_a_half_and_names_missing_repositories() -> None:
    report = split.repos_in("report")
    rows = [{"repo": report[0], "category": "semantic", "ndcg10": 1.0, "ndcg5": 1.0}]
    rows.append({"repo": split.repos_in("tune")[0], "category": "semantic", "ndcg10": 0.0, "ndcg5": 0.0})
    out = score.aggregate(rows, half="report")
    assert list(out["repos"]) == [report[0]] and out["summary"]["ndcg10"] == 1.0
    assert out["missing"] == report[1:]


def test_published_numbers_reaggregate_to_semble_published_summary() -> None:
    published = json.loads((EVAL / "semble_published.json").read_text())
    assert published["source"]["commit"] and published["source"]["hybrid"]["path"].startswith("benchmarks/results/")
    mine = score.semble_published_summary(published["repos"])
    theirs = published["summary"]["hybrid"]
    assert round(mine["ndcg10"], 4) == theirs["ndcg10"]
    assert {c: round(v, 4) for c, v in mine["by_category"].items()} == theirs["by_category"]
    assert score.semble_published("chi", "bm25")["ndcg10"] < score.semble_published("chi")["ndcg10"]
    # semble's ablation file predates snapkit: the leg summary leaves it out and says so
    assert score.semble_published_summary(["snapkit", "chi"], "bm25")["missing"] == ["snapkit"]


# ---- the split


def test_split_is_fixed_by_names_and_languages_alone() -> None:
    entries = split.load()
    assert split.assign_halves({n: e["language"] for n, e in entries.items()}) == {
        n: e["half"] for n, e in entries.items()
    }


def test_split_covers_every_language_in_both_halves_and_halves_are_even() -> None:
    raw = json.loads(split.SPLIT.read_text())
    entries, excluded = raw["repos"], raw["excluded"]
    languages = {e["language"] for e in entries.values()} | {e["language"] for e in excluded.values()}
    assert len(entries) >= 30
    for half in ("tune", "report"):
        assert {e["language"] for e in entries.values() if e["half"] == half} == languages, half
    counts = Counter(e["half"] for e in entries.values())
    assert abs(counts["tune"] - counts["report"]) <= 1
    assert all(e["semble_chunks"] > split.MAX_SEMBLE_CHUNKS for e in excluded.values())
    assert all(e["semble_chunks"] <= split.MAX_SEMBLE_CHUNKS for e in entries.values())
    assert all(len(e["revision"]) == 40 for e in entries.values())


# ---- bringing a pinned revision out of a snapshot


def test_fetch_sources_and_index_roots() -> None:
    assert (
        fetch_repos.fetch_source("https://github.com/Kotlin/kotlinx.coroutines.git")
        == "github:Kotlin/kotlinx.coroutines"
    )
    root = fetch_repos.index_root("axum", {"folder": "axum/src"}, Path("/c"))
    assert root == Path("/c/axum/axum/src")
    assert fetch_repos.index_root("chi", {"folder": None}, Path("/c")) == Path("/c/chi")


def test_materialize_extracts_the_pinned_revision_only(tmp_path: Path) -> None:
    work, mirror = tmp_path / "work", tmp_path / "mirror" / "owner+proj" / "repo"
    env = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    (work / "lib").mkdir(parents=True)
    (work / "lib" / "a.py").write_text("old\n")
    (work / "top.txt").write_text("x\n")
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run(["git", "-C", str(work), *env, "add", "."], check=True)
    subprocess.run(["git", "-C", str(work), *env, "commit", "-qm", "one"], check=True)
    pinned = subprocess.run(["git", "-C", str(work), "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    (work / "lib" / "a.py").write_text("new\n")
    subprocess.run(["git", "-C", str(work), *env, "commit", "-qam", "two"], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mirror)], check=True)
    entry = {"url": "https://github.com/owner/proj.git", "revision": pinned.stdout.strip(), "folder": "lib"}
    corpora = tmp_path / "corpora"
    out = fetch_repos.materialize("proj", entry, root=tmp_path / "mirror", corpora=corpora)
    assert out.status == "extracted" and out.files == 1
    assert (corpora / "proj" / "lib" / "a.py").read_text() == "old\n"
    assert not (corpora / "proj" / "top.txt").exists()  # only the indexed folder
    assert fetch_repos.materialize("proj", entry, root=tmp_path / "mirror", corpora=corpora).status == "ok"
    gone = fetch_repos.materialize("proj", {**entry, "revision": "0" * 40}, root=tmp_path / "mirror", corpora=corpora)
    assert gone.status == "revision not in snapshot"
    other = {**entry, "url": "https://github.com/owner/absent.git"}
    assert fetch_repos.materialize("absent", other, root=tmp_path / "mirror", corpora=corpora).status == "not fetched"
