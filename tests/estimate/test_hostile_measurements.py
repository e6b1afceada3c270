"""Hostile measurements (issue #25, item 5): a recorded figure must be finite, > 0 and within the device's
physical ceiling, and a stored row out of bounds (an older version's, or a hand edit) is ignored with a
warning, so one bad row can never turn later estimates into nulls that break their own output schema."""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from gpubox.app import build_server, state_of
from gpubox.errors import InvalidInputError
from gpubox.settings import Settings
from gpubox.tools.bench import calibrate
from gpubox.tools.bench.schemas import DeviceFigure
from gpubox.tools.estimate.adapter import estimator
from gpubox.tools.estimate.calibration import CalibrationStore
from gpubox.tools.estimate.catalog import package_catalog
from gpubox.tools.estimate.inference import prefill_mfu
from tests.conftest import call_err, call_ok

pytestmark = pytest.mark.anyio
RUN = {"kind": "inference", "gpu": "A10", "model": "Qwen2.5-0.5B"}
TRAIN = {**RUN, "kind": "training"}
UPPER, LOWER, FINITE = "is above the upper bound", "is below the lower bound", "must be a finite number"


@pytest.mark.parametrize(
    ("args", "field", "said"),
    [
        ({**RUN, "tokens_per_s": 1e308}, "tokens_per_s", UPPER),
        ({**RUN, "tokens_per_s": 10**100}, "tokens_per_s", UPPER),
        ({**RUN, "tokens_per_s": 5e-324}, "tokens_per_s", LOWER),
        ({**RUN, "tokens_per_s": 2000.0}, "tokens_per_s", UPPER),  # 3x the A10's bandwidth ceiling
        ({**RUN, "tokens_per_s": 100.0, "peak_memory_gb": 1e308}, "peak_memory_gb", UPPER),
        ({**RUN, "tokens_per_s": 100.0, "peak_memory_gb": 40.0}, "peak_memory_gb", UPPER),  # the A10 has 24 GB
        ({**RUN, "tokens_per_s": 100.0, "peak_memory_gb": 5e-324}, "peak_memory_gb", LOWER),
        ({**RUN, "tokens_per_s": 100.0, "prefill_tokens_per_s": 1e308}, "prefill_tokens_per_s", UPPER),
        ({**RUN, "gpu": "cpu", "tokens_per_s": 1e308}, "tokens_per_s", UPPER),
        ({**TRAIN, "tokens_per_s": 1e308}, "tokens_per_s", UPPER),
        ({**TRAIN, "tokens_per_s": 5e-324}, "tokens_per_s", LOWER),
        ({**TRAIN, "tokens_per_s": 1000.0, "peak_memory_gb": 1e308}, "peak_memory_gb", UPPER),
    ],
)
async def test_a_hostile_measurement_is_refused_naming_the_field_and_bound(
    client: Client, args: dict[str, Any], field: str, said: str
) -> None:
    msg = await call_err(client, "estimate_record_measurement", **args)
    assert f"{field} " in msg and said in msg and "Nothing was stored" in msg, msg
    assert (await call_ok(client, "estimate_calibrations"))["measurements"] == []
    est = await call_ok(client, "estimate_inference", model="Qwen2.5-0.5B", gpu="A10")
    assert est["results"][0]["decode_tokens_per_s"] > 0 and "default" in est["results"][0]["efficiency_source"]


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
async def test_non_finite_figures_are_refused(server: object, value: float) -> None:
    # JSON Infinity/NaN reach the server as floats over stdio and HTTP (the in-memory client sends them as
    # null), so the service is called here directly, as the tool does with the parsed arguments
    est = estimator(state_of(server))  # type: ignore[arg-type]
    for field in ("decode_tokens_per_s", "peak_memory_gb", "prefill_tokens_per_s"):
        args: dict[str, Any] = {"decode_tokens_per_s": 100.0, field: value}
        with pytest.raises(InvalidInputError, match=field.removeprefix("decode_") + " must be a finite number"):
            est.record_inference("A10", "Qwen2.5-0.5B", None, **args)
    for field in ("tokens_per_s", "peak_memory_gb"):
        with pytest.raises(InvalidInputError, match=f"{field} must be a finite number"):
            est.record_training("A10", "Qwen2.5-0.5B", **{"tokens_per_s": 900.0, field: value})
    assert est.store.list() == []


async def test_a_plausible_measurement_is_stored_and_used(client: Client) -> None:
    row = await call_ok(client, "estimate_record_measurement", **RUN, tokens_per_s=150.0, peak_memory_gb=2.0)
    assert 0 < row["decode_efficiency"] < 1 and row["ignored"] is None
    est = await call_ok(client, "estimate_inference", model="Qwen2.5-0.5B", gpu="A10")
    assert est["results"][0]["efficiency_source"].startswith(f"measured: run #{row['id']}")


async def test_a_small_cpu_box_s_real_figures_are_accepted(client: Client) -> None:
    # infer_benchmark on a 2-core VM (SmolLM2-135M q4_1): the host's upper bound is the fastest host, but the
    # lower bound must not follow it (1/10,000 of 1,000 TFLOPS refused this 235 tok/s prefill)
    row = await call_ok(
        client, "estimate_record_measurement", kind="inference", gpu="cpu", model="Qwen2.5-0.5B",
        tokens_per_s=20.0, prefill_tokens_per_s=60.0, peak_memory_gb=0.6,
    )  # fmt: skip
    assert row["ignored"] is None


def test_the_bounds_are_the_store_s_too(tmp_path: Path) -> None:
    # a caller that writes to the store directly (bench, fine-tune jobs) meets the same device-free bounds
    store = CalibrationStore(tmp_path / "c.sqlite")
    for fields in ({"tokens_per_s": math.inf}, {"decode_efficiency": 40.0}, {"mfu": -1.0}):
        with pytest.raises(InvalidInputError, match=next(iter(fields))):
            store.record("inference", "A10", "Qwen2.5-0.5B", **fields)
    assert store.list() == []
    store.close()


# --- device profiles: bench_device's calibrations -------------------------------------------------------
@pytest.mark.parametrize(
    ("bandwidth", "tflops", "field"),
    [
        (1e308, {"bf16": 100.0}, "memory_bandwidth_gbs"),
        (5000.0, {"bf16": 100.0}, "memory_bandwidth_gbs"),  # the A10's datasheet says 600 GB/s
        (500.0, {"bf16": math.inf}, "tflops['bf16']"),
        (500.0, {"fp32": 1e6}, "tflops['fp32']"),
        (math.nan, {}, "memory_bandwidth_gbs"),
    ],
)
async def test_bench_device_calibrations_meet_the_same_bounds(
    server: object, bandwidth: float, tflops: dict[str, float], field: str
) -> None:
    state = state_of(server)  # type: ignore[arg-type]
    spec = estimator(state).device_spec("A10")
    figures = [DeviceFigure(name="memory_copy", unit="GB/s", measured=bandwidth)]
    figures += [DeviceFigure(name=f"matmul_{k}", unit="TFLOPS", measured=v) for k, v in tflops.items()]
    said = calibrate.record(estimator(state), "cuda", spec, figures, "20200101-000000-device-abcdef")
    assert said.startswith("nothing stored") and field in said, said
    assert estimator(state).store.devices() == []


# --- rows already on disk --------------------------------------------------------------------------------
async def record_good(client: Client) -> dict[str, Any]:
    """A plausible inference and training run, recorded through the tool; returns their rows by label."""
    good = await call_ok(client, "estimate_record_measurement", **RUN, tokens_per_s=150.0)
    train = await call_ok(
        client, "estimate_record_measurement", **TRAIN, tokens_per_s=900.0, gradient_checkpointing=False
    )
    return {"good": good, "good_train": train}


def plant(path: Path, train_config: dict[str, Any]) -> dict[str, int]:
    """Rows out of bounds or broken, newer than the good ones, as an older version or a hand edit leaves them
    (training rows with the good run's config, so estimates would pick them); returns their ids by label."""
    cfg = json.dumps(train_config, sort_keys=True)
    rows = {
        "huge_eff": ("inference", "{}", None, 1e308, None, math.inf, None, None),
        "tiny_prefill": ("inference", "{}", None, 150.0, 5e-324, 0.25, None, None),
        "text": ("inference", "{}", None, "fast", None, 0.25, None, None),
        "bad_config": ("inference", "not json", None, 150.0, None, 0.25, None, None),
        "inf_mfu": ("training", cfg, None, 900.0, None, None, math.inf, None),
        "huge_factor": ("training", cfg, 10.0, 900.0, None, None, 0.2, 1e308),
    }
    ids = {}
    # closing(): sqlite3's own context manager commits but leaves the connection open (a ResourceWarning on 3.13)
    with closing(sqlite3.connect(path)) as db, db:
        for label, (kind, config, peak, tps, prefill, eff, mfu, factor) in rows.items():
            cur = db.execute(
                "INSERT INTO measurements (kind, gpu, model, params, method, config, peak_memory_gb, tokens_per_s, "
                "prefill_tokens_per_s, decode_efficiency, mfu, activation_factor, created_at) "
                "VALUES (?, 'A10', 'Qwen2.5-0.5B', 494032768, ?, ?, ?, ?, ?, ?, ?, ?, '2024-01-01T00:00:00')",
                (kind, "qlora" if kind == "training" else "bf16", config, peak, tps, prefill, eff, mfu, factor),
            )
            ids[label] = cur.lastrowid or 0
        devices = [("good_device", 550.0, '{"bf16": 100.0}'), ("huge_bw", 1e308, "{}")]
        devices += [("inf_tflops", 500.0, '{"bf16": 1e999}'), ("junk_tflops", 500.0, "junk")]
        for label, bw, tflops in devices:
            cur = db.execute(
                "INSERT INTO devices (gpu, memory_bandwidth_gbs, tflops, created_at) "
                "VALUES ('A10', ?, ?, '2024-01-01T00:00:00')",
                (bw, tflops),
            )
            ids[label] = cur.lastrowid or 0
    return ids


def check_estimates_ignore(ids: dict[str, int], inference: dict[str, Any], training: dict[str, Any]) -> None:
    r = inference["results"][0]
    for key in ("decode_tokens_per_s", "decode_tokens_per_s_ceiling", "prefill_tokens_per_s", "decode_efficiency"):
        assert isinstance(r[key], float | int) and math.isfinite(r[key]) and r[key] > 0, (key, r[key])
    assert r["efficiency_source"].startswith(f"measured: run #{ids['good']} ")
    default = prefill_mfu(package_catalog().gpu("A10"), inference["weight_format"])
    assert r["prefill_mfu"] == round(default, 3)  # the tiny stored prefill rate is not used: the default stands
    said = " ".join(inference["warnings"])
    for label in ("huge_eff", "tiny_prefill", "text", "bad_config"):
        assert f"calibration #{ids[label]} (inference" in said, (label, said)
    for label in ("huge_bw", "inf_tflops", "junk_tflops"):
        assert f"device profile #{ids[label]} for A10 is ignored" in said, (label, said)
    assert "tokens_per_s 1e+308 is above the upper bound 1e+08" in said
    assert "tokens_per_s must be a finite number, got 'fast'" in said
    assert "prefill_tokens_per_s 4.94066e-324 is below the lower bound" in said
    assert f"device profile #{ids['good_device']}" in " ".join(inference["assumptions"])  # the good one is used
    t = training["results"][0]
    assert math.isfinite(t["tokens_per_s"]) and t["memory"]["total_gb"] > 0 and 0 < t["mfu"] <= 1
    assert t["mfu_source"].startswith(f"measured: run #{ids['good_train']} ")
    said = " ".join(training["warnings"])
    for label in ("inf_mfu", "huge_factor"):
        assert f"calibration #{ids[label]} (training" in said, (label, said)


async def estimates(client: Client) -> tuple[dict[str, Any], dict[str, Any]]:
    inference = await call_ok(client, "estimate_inference", model="Qwen2.5-0.5B", gpu="A10")
    training = await call_ok(client, "estimate_training", model="Qwen2.5-0.5B", gpu="A10", dataset_tokens=10**6)
    return inference, training


async def test_stored_rows_out_of_bounds_are_ignored_with_a_warning_also_after_a_restart(
    client: Client, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    good = await record_good(client)
    ids = plant(settings.state_dir / "calibration.sqlite", good["good_train"]["config"])
    ids.update({label: row["id"] for label, row in good.items()})
    with caplog.at_level(logging.WARNING, logger="gpubox.estimate"):
        check_estimates_ignore(ids, *await estimates(client))
    assert f"calibration #{ids['huge_eff']} " in caplog.text and "ignored by estimates" in caplog.text
    everything = await call_ok(client, "estimate_inference", model="Qwen2.5-0.5B", gpu="all", detail=True)
    assert all(math.isfinite(r["decode_tokens_per_s"]) for r in everything["results"])
    ranked = await call_ok(client, "estimate_inference", model="Qwen2.5-0.5B", gpu="all")
    assert all(math.isfinite(row[3]) for row in ranked["ranking"]["rows"])
    listed = await call_ok(client, "estimate_calibrations")  # the client validates the listing's schema too
    flagged = {m["id"] for m in listed["measurements"] if m["ignored"]}
    assert flagged == {ids[k] for k in ("huge_eff", "text", "bad_config", "inf_mfu", "huge_factor")}
    bad_devices = {ids[k] for k in ("huge_bw", "inf_tflops", "junk_tflops")}
    assert {d["id"] for d in listed["devices"] if d["ignored"]} == bad_devices

    again = build_server(settings)  # a restart: a new server on the same state dir
    try:
        async with Client(again) as fresh:
            check_estimates_ignore(ids, *await estimates(fresh))
    finally:
        state_of(again).close()


async def test_a_non_finite_estimate_is_an_error_naming_the_field_not_a_null(
    client: Client, settings: Settings
) -> None:
    # the last guard: a catalog entry out of range (a user GPU with 1e308 TFLOPS) gives a clear error
    catalog = settings.state_dir / "catalog"
    catalog.mkdir(parents=True)
    huge = {**package_catalog().gpus["A10"].model_dump(), "id": "HUGE", "aliases": [], "bf16_tflops": 1e308}
    (catalog / "gpus.json").write_text(json.dumps({"gpus": [huge]}))
    with pytest.raises(MCPError, match=r"non-finite at results\[0\]\.prefill_tokens_per_s"):
        await client.call_tool("estimate_inference", {"model": "Qwen2.5-0.5B", "gpu": "HUGE"})
