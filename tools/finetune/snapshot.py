"""A job's folder as the worker reads it: the dataset snapshotted (shuffled, split) and config.json."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpubox.errors import InvalidInputError
from gpubox.tools.finetune import data
from gpubox.tools.finetune.schemas import FinetunePlan


def snapshot(
    job_dir: Path,
    plan: FinetunePlan,
    plan_id: str,
    inject_oom: int,
    adapter_dir: Path,
    store_root: Path,
    allowed_roots: Sequence[Path],
) -> None:
    """Write the job's folder. The dataset is read again (it may have changed since the plan) and copied, so the
    job trains on what was checked."""
    req = plan.request
    path = Path(plan.dataset.path)
    planned = plan.planned_length
    if planned and planned < req.max_length and plan.dataset_stamp and data.stamp(path) != plan.dataset_stamp:
        # its memory was planned (and is reserved) at the longest row then; a longer row now would not fit that
        raise InvalidInputError(
            f"the dataset {path} changed since plan {plan_id}, whose memory was planned for rows up to {planned} "
            "tokens; run finetune_plan again"
        )
    _fmt, rows = data.load(path, allowed_roots)
    random.Random(req.seed).shuffle(rows)
    n_eval = plan.dataset.eval_rows
    job_dir.mkdir(parents=True)
    _write_jsonl(job_dir / "train.jsonl", rows[n_eval:])
    if n_eval:
        _write_jsonl(job_dir / "eval.jsonl", rows[:n_eval])
    config = {
        "job_id": job_dir.name,
        "store_root": str(store_root),
        "plan_id": plan_id,
        "request": req.model_dump(mode="json"),
        "base": plan.base.model_dump(mode="json"),
        "per_device_train_batch_size": plan.per_device_train_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "gradient_checkpointing": plan.gradient_checkpointing,
        "total_steps": plan.total_steps,
        "planned_length": planned or req.max_length,
        "num_processes": req.num_processes,
        "device": plan.device,
        "adapter_dir": str(adapter_dir),
        "inject_oom": inject_oom,
        "resume": False,
    }
    (job_dir / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
