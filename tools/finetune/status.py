"""A job's status as its files show it: the job row, config.json and the worker's metrics.jsonl (reads only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

from gpubox.errors import InvalidInputError
from gpubox.tools.finetune.jobs import created_of, read_metrics
from gpubox.tools.finetune.schemas import ACTIVE, JobState, JobStatus, ProbeResult

EMA = 0.8


DAMAGED = "this job's files are damaged"  # how a status built without them starts its error
CONFIG_INTS = ("total_steps", "per_device_train_batch_size", "gradient_accumulation_steps")
STATES = get_args(JobState)


def read_config(job_dir: Path) -> dict[str, Any]:
    """The job's config.json, with the figures status reads; InvalidInputError saying what is wrong otherwise."""
    path = job_dir / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"{path} cannot be read as JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise InvalidInputError(f"{path} is not a JSON object")
    bad = [k for k in (*CONFIG_INTS, "num_processes") if k in cfg and not _whole(cfg[k])]
    if missing := [k for k in CONFIG_INTS if k not in cfg]:
        bad.append(f"{', '.join(missing)} (missing)")
    if bad:
        raise InvalidInputError(f"{path} has no whole number for {', '.join(bad)}")
    return cfg


def config_to_restart(job_id: str, job_dir: Path) -> dict[str, Any]:
    """config.json for a resume or a queued start; a damaged one is refused with what to do instead."""
    try:
        return read_config(job_dir)
    except InvalidInputError as exc:
        raise InvalidInputError(f"job {job_id} cannot start again: {exc}; plan it again with finetune_plan") from None


def row_problem(row: dict[str, Any]) -> str | None:
    """What in the job's row status cannot read (a hand edit, another program's write), or None."""
    if row["state"] not in STATES:
        return f"its state {str(row['state'])[:40]!r} is none of {', '.join(STATES)}"
    if not isinstance(row["created"], int | float):
        return f"its created time {str(row['created'])[:40]!r} is not a number"
    if any(not isinstance(row[k], str) for k in ("adapter_name", "base_model", "method")):
        return "its adapter_name, base_model or method is missing"
    try:
        result = json.loads(row["result"]) if row["result"] else {}
    except (TypeError, json.JSONDecodeError):
        result = None
    return None if isinstance(result, dict) else f"its result {str(row['result'])[:40]!r} is not a JSON object"


def read_status(job_id: str, row: dict[str, Any], job_dir: Path) -> JobStatus:
    """The job's status; one whose row or config.json is damaged gets a status that says so and what to do."""
    why = row_problem(row)
    cfg: dict[str, Any] = {}
    try:
        cfg = read_config(job_dir)
    except InvalidInputError as exc:
        why = why or str(exc)
    if why is not None:
        return damaged_status(job_id, row, job_dir, why)
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
    _apply_metrics(st, read_metrics(job_dir), cfg["total_steps"])
    ckpt = job_dir / "checkpoints"
    st.checkpoints = sorted((p.name for p in ckpt.glob("checkpoint-*")), key=step_of) if ckpt.is_dir() else []
    result = json.loads(row["result"]) if row["result"] else {}
    if row["state"] == "completed":
        path, peak = result.get("adapter_path"), result.get("peak_memory_gb")
        st.adapter_path = path if isinstance(path, str) else None
        st.eta_s = 0.0
        if isinstance(peak, int | float) and peak > 0:
            st.peak_memory_gb = peak
    return st


def damaged_status(job_id: str, row: dict[str, Any], job_dir: Path, why: str) -> JobStatus:
    """What can be said of a job whose row or files are damaged: its row's fields that still read, and the fix."""
    state = row["state"] if row["state"] in STATES else "failed"
    if state in (*ACTIVE, "queued"):
        fix = f"stop it with finetune_cancel job_id='{job_id}', then delete its folder {job_dir}"
    else:
        fix = f"it cannot be resumed; delete its folder {job_dir} and its row in {job_dir.parent.parent}/jobs.sqlite"
    earlier = f" (its error before: {row['error']})" if row["error"] else ""

    def text(key: str) -> str:
        return row[key] if isinstance(row[key], str) else "(unknown)"

    error = f"{DAMAGED}: {why}; {fix}{earlier}"
    return JobStatus(
        job_id=job_id, state=state, created=created_of(row), error=error, next_step=fix,
        adapter_name=text("adapter_name"), base_model=text("base_model"), method=text("method"),
    )  # fmt: skip


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _apply_metrics(st: JobStatus, metrics: list[dict[str, Any]], total_steps: int) -> None:
    """Fold the worker's metric records into `st`: progress, loss (and its moving average), events, probe, ETA."""
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
        if m.get("loss") is not None:
            st.loss = m["loss"]
            st.first_loss = st.first_loss if st.first_loss is not None else m["loss"]
            smoothed = m["loss"] if smoothed is None else EMA * smoothed + (1 - EMA) * m["loss"]
        st.eval_loss = m.get("eval_loss", st.eval_loss)
        st.learning_rate = m.get("learning_rate", st.learning_rate)
        if started and started[0] and st.step > started[1] and m.get("t") is not None:
            st.elapsed_s = round(m["t"] - started[0], 1)
            per_step = st.elapsed_s / (st.step - started[1])
            st.eta_s = round(per_step * max(0, total_steps - st.step), 1)
    st.smoothed_loss = round(smoothed, 4) if smoothed is not None else None


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
