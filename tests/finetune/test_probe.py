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
from tests.conftest import call_err, call_ok
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


async def test_a_job_is_calibrated_at_the_length_its_plan_assumed_and_a_changed_dataset_is_planned_again(
    tmp_path: Path, hf_base: Path
) -> None:
    settings = make_settings(tmp_path / "root", hf_base)
    dataset = tmp_path / "root" / "rows.jsonl"
    dataset.write_bytes(DATASET.read_bytes())
    shape = {**SHAPE, "dataset": str(dataset), "max_length": 2048, "per_device_train_batch_size": 2, "max_steps": 1}
    mcp = build_server(settings)
    try:
        async with Client(mcp) as client:
            plan = await call_ok(client, "finetune_plan", **shape, probe_steps=0)
            job = await call_ok(client, "finetune_launch", plan_id=plan["plan_id"])
            done = await follow_job(client, job["job_id"])
            calibrations = await call_ok(client, "estimate_calibrations", kind="training", gpu="cpu")
            again = await call_ok(client, "finetune_plan", **shape, probe_steps=0)
            with dataset.open("a", encoding="utf-8") as f:  # a row far longer than any the plan measured
                f.write(json.dumps({"messages": [{"role": "user", "content": "tell me " * 600},
                                                 {"role": "assistant", "content": "no"}]}) + "\n")  # fmt: skip
            refused = await call_err(client, "finetune_launch", plan_id=again["plan_id"])
    finally:
        state_of(mcp).close()
    assert done["state"] == "completed", done
    assert plan["planned_length"] == plan["dataset"]["token_length_percentiles"]["max"] + 8 < 2048
    # the measured run is stored at the length its memory was planned for, as the next plan will ask for it
    ours = [m for m in calibrations["measurements"] if job["job_id"] in (m["note"] or "")]
    assert ours and all(m["config"]["max_length"] == plan["planned_length"] for m in ours), ours
    assert "changed since plan" in refused and "finetune_plan again" in refused
