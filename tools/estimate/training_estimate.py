"""estimate_training's answer: a TrainingRequest turned into the training planner's inputs, planned on each device.

Separate from service.py because most of a training estimate is translation that inference has no counterpart
for: TRL/peft argument names into the planner's memory plan and run inputs, a dataset's size in samples into
tokens, and the assumptions that follow from them. The Estimator keeps the lookups (model, devices, stored
calibrations) this module plans with, and its `training` method hands the request here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpubox.errors import InvalidInputError
from gpubox.tools.estimate import bounds, training_notes
from gpubox.tools.estimate import training as tr
from gpubox.tools.estimate.catalog import ModelShape
from gpubox.tools.estimate.modelinfo import summary
from gpubox.tools.estimate.rankings import TRAINING_RANKING_NOTE, training_ranking
from gpubox.tools.estimate.requests import TrainingRequest
from gpubox.tools.estimate.schemas import TrainingEstimate, TrainingOnGpu
from gpubox.tools.estimate.targets import Target

if TYPE_CHECKING:
    from gpubox.tools.estimate.service import Estimator


def estimate(estimator: Estimator, req: TrainingRequest, detail: bool) -> TrainingEstimate:
    """Estimator.training's answer: `req` planned on each device `req.gpu` names, through `estimator`'s lookups."""
    rm = estimator.model(req.model)
    shape = rm.shape
    method = req.method
    fmt = tr.train_format(method, req.weight_format)
    targets = tr.lora_targets(req.lora_target_modules, method)
    if req.max_length > shape.max_context:
        raise InvalidInputError(f"max_length {req.max_length} exceeds {shape.id}'s maximum context {shape.max_context}")
    dataset_tokens = req.dataset_tokens
    if dataset_tokens is None and req.dataset_samples is not None:
        dataset_tokens = req.dataset_samples * req.max_length
    usd_kwh = estimator.settings.electricity_usd_per_kwh
    plan = _plan_input(req, fmt, targets)
    trainable = tr.trainable_params(shape, plan)
    run = _run_input(req, dataset_tokens, usd_kwh)
    dtype = "fp16" if req.fp16 else ("fp32" if fmt == "fp32" else "bf16")
    devices = estimator.targets(req.gpu, dtype)
    results, warnings = _plan_devices(estimator, req, shape, plan, run, devices)
    warnings += estimator.ignored("training", devices)
    compact = not detail and len(results) > 1
    est = bounds.finite(
        TrainingEstimate(
            model=summary(rm),
            method=method,
            weight_format=fmt,
            lora_rank=req.lora_r if method != "full" else None,
            target_modules=targets,
            trainable_params=trainable,
            trainable_pct=round(100 * trainable / shape.params(), 4),
            seq_len=req.max_length,
            gradient_checkpointing=req.gradient_checkpointing,
            optimizer=req.optim,
            optimizer_bytes_per_param=tr.optimizer_bytes(req.optim, 4 if method != "full" or fmt == "fp32" else 2),
            dataset_tokens=dataset_tokens,
            epochs=req.num_train_epochs,
            results=results,
            assumptions=_assumptions(req, devices, fmt, usd_kwh, dataset_tokens, compact),
            warnings=warnings,
        )
    )
    if compact:
        est.ranking, est.results = training_ranking(results), []
    return est


def _plan_input(req: TrainingRequest, fmt: str, targets: list[str]) -> tr.TrainingPlanInput:
    """The memory plan's input; checkpointing 'auto' enters as on (plan_on_gpu settles it per device)."""
    return tr.TrainingPlanInput(
        method=req.method,
        lora_rank=req.lora_r,
        target_modules=targets,
        seq_len=req.max_length,
        gradient_checkpointing=req.gradient_checkpointing is not False,
        optimizer=req.optim,
        headroom=req.headroom_pct / 100,
        weight_format=fmt,
    )


def _run_input(req: TrainingRequest, dataset_tokens: int | None, usd_per_kwh: float) -> tr.RunInput:
    gc_req = req.gradient_checkpointing
    return tr.RunInput(
        micro_batch=req.per_device_train_batch_size if isinstance(req.per_device_train_batch_size, int) else None,
        target_global_batch=req.target_global_batch,
        accumulation=req.gradient_accumulation_steps,
        checkpointing=None if gc_req == "auto" else gc_req,
        dataset_tokens=dataset_tokens,
        epochs=req.num_train_epochs,
        max_steps=req.max_steps,
        gpu_count=req.num_processes,
        usd_per_kwh=usd_per_kwh,
        tokens_per_s_override=req.tokens_per_s,
    )


def _plan_devices(
    estimator: Estimator,
    req: TrainingRequest,
    shape: ModelShape,
    plan: tr.TrainingPlanInput,
    run: tr.RunInput,
    devices: list[Target],
) -> tuple[list[TrainingOnGpu], list[str]]:
    """The plan on each device, best first (fits, then cheapest, then fastest), and a warning per device where a
    quoted tokens_per_s is implausible."""
    warnings: list[str] = []
    results = []
    for t in devices:
        if req.tokens_per_s is not None and (
            why := training_notes.plausibility(req.tokens_per_s, shape, plan, t.spec, req.num_processes)
        ):
            warnings.append(why)
        if req.bf16 and not t.spec.bf16_supported and t.spec.id != "cpu":
            warnings.append(
                f"{t.spec.id} has no bf16 arithmetic (its catalog entry): bf16=true does not run there; use fp16=true"
            )
        # a GPU is planned on its real memory; the CPU on the RAM available now
        vram = t.available_gb if t.spec.id == "cpu" else t.total_gb
        r = tr.plan_on_gpu(
            shape, plan, t.spec, run, catalog=estimator.catalog, store=estimator.store, vram_override_gb=vram
        )
        r.spec_source = t.source
        results.append(r)
    if results and all(r.micro_batch is None for r in results):
        least = min(results, key=lambda r: r.memory.total_gb)
        warnings.append(
            f"it fits on none of these devices, even at micro-batch 1 ({least.memory.total_gb:g} GB needed on "
            f"{least.gpu}, {least.safe_limit_gb:g} GB usable), so no time or cost is given; try method='qlora', a "
            "shorter max_length, gradient checkpointing or a larger GPU"
        )
    if len(results) > 1:
        results.sort(
            key=lambda r: (
                r.micro_batch is None,
                min((c.usd for c in r.costs), default=1e18),
                r.wall_hours if r.wall_hours is not None else -r.tokens_per_s,
            )
        )
    return results, warnings


def _assumptions(
    req: TrainingRequest, devices: list[Target], fmt: str, usd_kwh: float, dataset_tokens: int | None, compact: bool
) -> list[str]:
    method_notes = [TRAINING_RANKING_NOTE] if compact else training_notes.assumptions(req, fmt, usd_kwh)
    assumptions = [n for t in devices for n in t.notes] + method_notes
    if req.dataset_tokens is None and req.dataset_samples is not None:
        assumptions.append(f"Dataset tokens = {req.dataset_samples} samples x max_length {req.max_length} (packed).")
    if dataset_tokens is None and req.max_steps is None:
        assumptions.append(
            "No dataset size or max_steps given: the memory plan and micro-batch do not depend on it; "
            "wall_hours, costs and electricity are null. Pass dataset_tokens, dataset_samples or max_steps."
        )
    return assumptions
