"""The probe run before training, on the real stack (bundled SmolLM2, LoRA, CPU): it measures memory and tokens/s,
its measurement becomes an estimator calibration that the next plan for the same shape uses, and it leaves the
training result unchanged (same losses as the same job without a probe)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from tests.conftest import call_ok
from tests.finetune.conftest import DATASET, follow_job, make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
SHAPE = {"dataset": str(DATASET), "max_length": 64, "learning_rate": 2e-3, "lora_r": 8, "seed": 3}


async def test_a_probe_is_measured_calibrates_the_estimator_and_does_not_change_training(
    tmp_path: Path, hf_base: Path
) -> None:
    settings = make_settings(tmp_path / "root", hf_base)
    mcp = build_server(settings)
    try:
        async with Client(mcp) as client:
            layout = {"per_device_train_batch_size": 2, "max_steps": 2}
            before = await call_ok(client, "finetune_plan", **SHAPE, **layout)
            assert before["estimate"]["results"][0]["mfu_source"].startswith("measured") is False
            probed: dict[str, Any] = {}
            for probe_steps in (2, 0):
                plan = await call_ok(client, "finetune_plan", **SHAPE, **layout, probe_steps=probe_steps)
                job = await call_ok(client, "finetune_launch", plan_id=plan["plan_id"])
                probed[str(probe_steps)] = await follow_job(client, job["job_id"])
            after = await call_ok(client, "finetune_plan", **SHAPE, **layout)
            calibrations = await call_ok(client, "estimate_calibrations", kind="training", gpu="cpu")
    finally:
        state_of(mcp).close()
    with_probe, without = probed["2"], probed["0"]
    assert with_probe["state"] == "completed" and without["state"] == "completed", (with_probe, without)

    probe = with_probe["probe"]
    assert probe["steps"] == 2 and probe["per_device_train_batch_size"] == 2
    assert probe["tokens_per_s"] > 0 and probe["peak_memory_gb"] > 0.1 and probe["memory_kind"] == "cpu_rss"
    metrics = settings.state_dir / "finetune" / "jobs" / with_probe["job_id"] / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines()]
    assert sum("probe" in r for r in records) == 1
    assert any(e.startswith("probe calibration recorded") for e in with_probe["events"]), with_probe["events"]
    assert without["probe"] is None and not any(e.startswith("probe") for e in without["events"])

    # the probe's throwaway run leaves the real one as it would have been: same LoRA init, data order, losses
    assert with_probe["first_loss"] == pytest.approx(without["first_loss"], rel=1e-4)
    assert with_probe["loss"] == pytest.approx(without["loss"], rel=1e-4)

    # probe + two finished jobs: three measured runs, and the next plan for this shape uses them
    notes = [m["note"] for m in calibrations["measurements"]]
    assert sum(with_probe["job_id"] in (n or "") for n in notes) == 2, notes
    measured = after["estimate"]["results"][0]
    assert measured["mfu_source"].startswith("measured: run #"), measured["mfu_source"]
    # and its memory plan for the same shape matches what the probe measured on this box within 10% (issue #23)
    assert measured["memory"]["total_gb"] == pytest.approx(probe["peak_memory_gb"], rel=0.10)
    assert measured["memory"]["activation_factor"] != before["estimate"]["results"][0]["memory"]["activation_factor"]
