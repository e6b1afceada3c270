"""A finished job's (or probe's) measurements as an estimator training calibration."""

from __future__ import annotations

from typing import Any

from gpubox.errors import GpuboxError
from gpubox.tools.estimate.service import Estimator
from gpubox.tools.finetune.planner import estimator_model
from gpubox.tools.finetune.schemas import ResolvedBase


def record_calibration(est: Estimator, info: dict[str, Any]) -> str:
    """Store a finished job's measured tokens/s and peak memory as a training calibration."""
    req = info["request"]
    device = info.get("device", "cpu")
    try:
        m = est.record_training(
            "cpu" if device == "cpu" else info.get("gpu_name", "local"),
            estimator_model(est, ResolvedBase.model_validate(info["base"])),
            req["method"],
            # the length the plan assumed (the longest row), as the estimator is asked for it at the next plan
            info.get("planned_length") or req["max_length"],
            info["per_device_train_batch_size"],
            bool(info["gradient_checkpointing"]),
            tokens_per_s=info.get("tokens_per_s"),
            peak_memory_gb=info.get("peak_memory_gb"),
            lora_r=req["lora_r"],
            lora_target_modules=req.get("lora_target_modules"),
            optim=req["optim"],
            weight_format=req.get("weight_format"),
            note=f"finetune job {info['job_id']} ({device}, peak memory as "
            + ("torch.cuda.max_memory_allocated)" if device != "cpu" else "process RSS)"),
        )
    except (GpuboxError, TypeError, ValueError) as exc:
        return f"calibration not recorded: {exc}"
    return f"calibration recorded: {getattr(m, 'tokens_per_s', None)} tokens/s on {getattr(m, 'gpu', device)}"
