"""bench/semble_eval/paired.py: the paired bootstrap over repositories behind the noise statement."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, load_bench_script

EVAL = ROOT / "bench" / "semble_eval"
paired = load_bench_script(EVAL, "paired")


def test_equal_differences_have_no_spread() -> None:
    observed, lo, hi = paired.interval([(0.9, 0.8)] * 12, draws=500)
    assert observed == pytest.approx(0.1)
    assert lo == pytest.approx(0.1) and hi == pytest.approx(0.1)


def test_a_difference_of_mixed_signs_spans_zero_and_one_of_one_sign_does_not() -> None:
    mixed = [(0.9, 0.8), (0.7, 0.8)] * 10
    observed, lo, hi = paired.interval(mixed, draws=2000)
    assert observed == pytest.approx(0.0, abs=1e-12)
    assert lo < 0 < hi
    ahead = [(0.9, 0.8), (0.82, 0.8)] * 10
    _, lo, hi = paired.interval(ahead, draws=2000)
    assert 0 < lo <= 0.06 <= hi


def test_pairs_take_each_category_where_both_have_it(monkeypatch: pytest.MonkeyPatch) -> None:
    published = {
        "a": {"ndcg10": 0.5, "by_category": {"symbol": 1.0, "semantic": 0.4}},
        "b": {"ndcg10": 0.6, "by_category": {"semantic": 0.6}},
    }
    monkeypatch.setattr(paired.score, "semble_published", lambda repo: published[repo])
    ours = {
        "repos": {
            "a": {"ndcg10": 0.7, "by_category": {"symbol": 0.5, "semantic": 0.6}},
            "b": {"ndcg10": 0.6, "by_category": {"semantic": 0.5, "symbol": 1.0}},
        }
    }
    assert paired._pairs(ours, "overall") == [(0.7, 0.5), (0.6, 0.6)]
    assert paired._pairs(ours, "symbol") == [(0.5, 1.0)]  # b: semble has no symbol queries there
    assert "| symbol | 1 | -0.5000 |" in paired.table(ours, draws=200)
