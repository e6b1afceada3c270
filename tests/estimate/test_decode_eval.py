"""Decode model vs the published validation set (bench/estimator_eval, issue #23): split rule and accuracy."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

EVAL = Path(__file__).resolve().parents[2] / "bench" / "estimator_eval"


def _load(name: str) -> ModuleType:
    """bench/ is not a package: load its scripts by path (run.py imports decode_split from its folder)."""
    if str(EVAL) not in sys.path:
        sys.path.insert(0, str(EVAL))
    spec = importlib.util.spec_from_file_location(f"estimator_eval_{name}", EVAL / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


split = _load("decode_split")
run = _load("run")

ROWS = split.load()
SCORED = run.score(ROWS)
CHECK = [s for s in SCORED if s["split"] == "check"]
# Check rows the model is known to miss by more than 25%. The M1 Max Q4_K_M row (27% slower than the M3 Max at
# the same 400 GB/s) was one until decode_model gained the k-quant compute term (Metal unpacks k-quants in FP32).
KNOWN_MISSES: set[tuple[str, str, str]] = set()  # none since the k-quant compute term (decode_model)


def test_the_set_has_at_least_30_rows_each_with_a_source_url_and_date() -> None:
    assert len(ROWS) >= 30
    assert all(r["source"].startswith("https://") and r["date"] for r in ROWS)


def test_the_stored_split_follows_the_rule_fixed_before_fitting() -> None:
    rule = split.assign_split(ROWS)
    assert all(r["split"] == rule[split.row_key(r)] for r in ROWS)
    classes = {str(s["gpu_class"]) for s in CHECK}
    assert {"datacenter-hbm", "consumer-gddr", "apple"} <= classes


@pytest.mark.parametrize("gpu_class", ["datacenter-hbm", "consumer-gddr", "workstation-gddr", "apple"])
def test_median_error_on_check_rows_is_within_15_percent(gpu_class: str) -> None:
    errs = [abs(float(str(s["error"]))) for s in CHECK if s["gpu_class"] == gpu_class]
    assert errs and statistics.median(errs) <= 0.15


def _params() -> list[object]:
    out: list[object] = []
    for s in CHECK:
        key = (str(s["gpu"]), str(s["model"]), str(s["quant"]))
        miss = pytest.mark.xfail(strict=True, reason="per-chip effect, see KNOWN_MISSES")
        marks = [miss] if key in KNOWN_MISSES else []
        out.append(pytest.param(s, id="-".join((*key, str(s["context"]))), marks=marks))
    return out


@pytest.mark.parametrize("row", _params())
def test_every_check_row_is_within_25_percent(row: dict[str, object]) -> None:
    assert abs(float(str(row["error"]))) <= 0.25


prefill = _load("prefill")


def test_prefill_rows_follow_their_split_rule_and_the_shipped_constants_are_their_fit() -> None:
    """bench/estimator_eval/prefill.py: the split was fixed before the fit; the package's prefill MFU per GPU class
    is what the fit rows give, so a changed row or constant shows here."""
    from gpubox.tools.estimate.inference import PREFILL_MFU_BY_CLASS, PREFILL_QUANTISED

    rows = prefill.load()
    rule = prefill.split_of(rows)
    assert len(rows) >= 30 and all(rule[f"{r['gpu']}|{r['model']}|{r['quant']}"] == r["split"] for r in rows)
    per_class, quantised = prefill.fit(rows)
    assert per_class == PREFILL_MFU_BY_CLASS and quantised == PREFILL_QUANTISED


def test_prefill_check_rows_are_closer_than_the_single_constant_it_replaced() -> None:
    from gpubox.tools.estimate.catalog import package_catalog
    from gpubox.tools.estimate.inference import prefill_mfu

    cat, errors = package_catalog(), []
    for r in prefill.load():
        if r["split"] != "check" or (r["gpu"], r["model"], r["quant"]) in prefill.OUTLIERS:
            continue
        gpu, params = cat.gpu(r["gpu"]), cat.models[r["model"]].params()
        errors.append(prefill_mfu(gpu, r["quant"]) * gpu.bf16_tflops * 1e12 / (2 * params) / float(r["pp_tok_s"]) - 1)
    assert statistics.median(abs(e) for e in errors) < 0.15 and max(abs(e) for e in errors) < 0.4, errors
