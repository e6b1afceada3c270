"""A job's status as its files show it: the job row, config.json and the worker's metrics.jsonl (reads only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpubox.tools.finetune.jobs import read_metrics
from gpubox.tools.finetune.schemas import ACTIVE, JobStatus, ProbeResult

EMA = 0.8


def read_status(job_id: str, row: dict[str, Any], job_dir: Path) -> JobStatus:
    cfg = json.loads((job_dir / "config.json").read_text(encoding="utf-8"))
    metrics = read_metrics(job_dir)
    st = JobStatus(
        job_id=job_id,
        state=row["state"],
        adapter_name=row["adapter_name"],
        base_model=row["base_model"],
        method=row["method"],
        created=row["created"],
        total_steps=cfg["total_steps"],
        per_device_train_batch_size=cfg["per_device_train_batch_size"],
        gradient_accumulation_steps=cfg["gradient_accumulation_steps"],
        error=row["error"],
        num_processes=cfg.get("num_processes", 1),
    )
    smoothed = None
    started = None
    for m in metrics:
        if "probe" in m:
            st.probe = ProbeResult.model_validate(m["probe"])
            continue
        if "event" in m:
            st.events.append(m["event"])
            if m["event"].startswith("training started"):
                started = (m.get("t"), step_of(m["event"]))
            st.per_device_train_batch_size = m.get("per_device_train_batch_size", st.per_device_train_batch_size)
            st.gradient_accumulation_steps = m.get("gradient_accumulation_steps", st.gradient_accumulation_steps)
            continue
        st.step, st.epoch = m.get("step", st.step), m.get("epoch", st.epoch)
        st.tokens_per_s = m.get("tokens_per_s") or st.tokens_per_s
        st.peak_memory_gb = max(st.peak_memory_gb or 0, m.get("peak_memory_gb") or 0) or None
        if "loss" in m:
            st.loss = m["loss"]
            st.first_loss = st.first_loss if st.first_loss is not None else m["loss"]
            smoothed = m["loss"] if smoothed is None else EMA * smoothed + (1 - EMA) * m["loss"]
        st.eval_loss = m.get("eval_loss", st.eval_loss)
        st.learning_rate = m.get("learning_rate", st.learning_rate)
        if started and started[0] and st.step > started[1]:
            st.elapsed_s = round(m["t"] - started[0], 1)
            per_step = st.elapsed_s / (st.step - started[1])
            st.eta_s = round(per_step * max(0, cfg["total_steps"] - st.step), 1)
    st.smoothed_loss = round(smoothed, 4) if smoothed is not None else None
    ckpt = job_dir / "checkpoints"
    st.checkpoints = sorted((p.name for p in ckpt.glob("checkpoint-*")), key=step_of) if ckpt.is_dir() else []
    result = json.loads(row["result"]) if row["result"] else {}
    if row["state"] == "completed":
        st.adapter_path = result.get("adapter_path")
        st.eta_s = 0.0
        if result.get("peak_memory_gb"):
            st.peak_memory_gb = result["peak_memory_gb"]
    return st


def step_of(text: str) -> int:
    digits = "".join(c if c.isdigit() else " " for c in text).split()
    return int(digits[-1]) if digits else 0


def next_step(st: JobStatus) -> str:
    if st.state == "queued":
        return (
            f"waiting for memory (box_plan shows who holds it): poll finetune_status job_id='{st.job_id}' "
            "wait_seconds=60, or leave the queue with finetune_cancel"
        )
    if st.state in ACTIVE:
        return f"poll with finetune_status job_id='{st.job_id}' wait_seconds=60, or stop with finetune_cancel"
    if st.state == "completed":
        return f"infer_load name='{st.adapter_name}', then infer_chat model='{st.adapter_name}'"
    if st.state == "cancelled":
        return f"finetune_resume job_id='{st.job_id}' continues from the last checkpoint"
    return f"read log_tail; fix the cause, then finetune_resume job_id='{st.job_id}' or plan again"
