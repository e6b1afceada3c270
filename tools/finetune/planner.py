"""finetune_plan: resolve the base model and dataset, validate every row, and choose the batch layout.

Memory, tokens/s and time come from the estimator's training planner (tools/estimate), fed the dataset's real
size; the micro-batch is the planner's choice for the device present unless the request fixes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubox.errors import GpuboxError, InvalidInputError, NotFoundError
from gpubox.paths import resolve_inside
from gpubox.tools.estimate.requests import check_precision
from gpubox.tools.finetune import data
from gpubox.tools.finetune.base import hf_ready
from gpubox.tools.finetune.schemas import FORMATS_FOR, DatasetSummary, FinetuneRequest, ResolvedBase
from gpubox.tools.inference.registry import check_model_folder

if TYPE_CHECKING:
    from gpubox.tools.estimate.schemas import TrainingEstimate, TrainingOnGpu
    from gpubox.tools.estimate.service import Estimator

# tokens a row may gain over its measured length in training (the end-of-sequence token trl appends, a template's
# generation prompt)
TEMPLATE_MARGIN = 8
CPU_MICRO_BATCH = 4  # CPU training is compute-bound long before RAM runs out; 4 keeps steps short


def check_request(req: FinetuneRequest) -> None:
    """Refuse settings that cannot run together, before any file is read."""
    check_precision(req)
    allowed = FORMATS_FOR[req.method]
    if req.weight_format is not None and req.weight_format not in allowed:
        raise InvalidInputError(
            f"weight_format '{req.weight_format}' does not go with method '{req.method}'; use one of "
            f"{', '.join(allowed)}, or leave it null for {allowed[0]}"
        )


def resolve_base(
    model: str, registry: dict[str, Any], roots: Sequence[Path], base_dir: Path, own_models: Sequence[Path] = ()
) -> ResolvedBase:
    """A registry name (bundled GGUF, model dirs, `own_models`: the merged models in the state dir) or a path
    inside the allowed roots/model dirs. An HF folder is checked file by file: training opens all of them."""
    entry = registry.get(model.lower())
    if entry is not None:
        if entry.format == "lora":
            raise InvalidInputError(f"{model} is a LoRA adapter; fine-tune its base model '{entry.base_model}' instead")
        name, path, fmt = entry.name, Path(entry.path), entry.format
        if fmt == "hf":
            check_model_folder(path.resolve(), [*roots, *own_models])
    else:
        if "/" not in model and not model.endswith(".gguf"):
            names = sorted(k for k, v in registry.items() if v.format != "lora")
            raise NotFoundError(
                f"no model named '{model}'. Models here: {', '.join(names) or 'none'}; or pass a path to a .gguf "
                "file or an HF folder inside the allowed roots"
            )
        path = resolve_inside(model, roots, what="model")
        if path.is_file() and path.suffix == ".gguf":
            name, fmt = path.stem.lower(), "gguf"
        elif path.is_dir() and (path / "config.json").is_file():
            check_model_folder(path, roots)
            name, fmt = path.name.lower(), "hf"
        else:
            raise InvalidInputError(f"{path} is neither a .gguf file nor a Hugging Face folder with config.json")
    # a distinct folder name, so the HF copy never shadows the GGUF entry of the same model in infer_models
    hf_path = path if fmt == "hf" else base_dir / f"{name}-hf"
    return ResolvedBase(name=name, path=str(path), format=fmt, hf_path=str(hf_path), hf_ready=hf_ready(hf_path))


def load_tokenizer(base: ResolvedBase) -> Any:
    from transformers import AutoTokenizer

    if base.format == "hf" or base.hf_ready:
        return AutoTokenizer.from_pretrained(base.hf_path)
    p = Path(base.path)
    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


def summarise(
    req: FinetuneRequest, allowed_roots: Sequence[Path], tokenizer_of: Callable[[], Any]
) -> tuple[DatasetSummary, list[dict[str, Any]], int]:
    """Validated rows, their summary, and the training tokens after truncation."""
    path = resolve_inside(req.dataset, allowed_roots, what="dataset")
    fmt, rows = data.load(path, allowed_roots)
    lengths = data.token_lengths(rows, fmt, tokenizer_of())
    scale = len(rows) / len(lengths)
    n_eval = 0
    if req.eval_split > 0:
        n_eval = max(1, round(len(rows) * req.eval_split))
        if n_eval >= len(rows):
            raise InvalidInputError(f"eval_split {req.eval_split} leaves no training rows out of {len(rows)}")
    summary = DatasetSummary(
        path=str(path),
        format=fmt,
        rows=len(rows),
        train_rows=len(rows) - n_eval,
        eval_rows=n_eval,
        tokens_total=round(sum(lengths) * scale),
        token_length_percentiles=data.percentiles(lengths),
        truncated_rows=round(sum(n > req.max_length for n in lengths) * scale),
    )
    train_tokens = round(sum(min(n, req.max_length) for n in lengths) * scale * summary.train_rows / len(rows))
    return summary, rows, train_tokens


def estimator_model(estimator: Estimator, base: ResolvedBase) -> str:
    """How the estimator can read this base: its catalog entry (the bundled GGUF and the dequantized copies live
    outside the allowed roots the estimator reads), else the file or folder itself."""
    models = estimator.catalog.models
    matches = [m for m in models if base.name.startswith(m.lower())]
    if matches:
        return max(matches, key=len)
    return base.path


def planned_length(req: FinetuneRequest, summary: DatasetSummary) -> int:
    """The longest row a micro-batch can hold: trl pads each batch to its own longest row, so without packing no
    batch is longer than the dataset's longest row (when every row was measured). Planning every row at max_length
    put a QLoRA job whose rows were far shorter at 15x the memory it took (an H200, bench/results/gpu_h200/)."""
    if req.packing or summary.rows > data.SAMPLED_ROWS:
        return req.max_length
    return min(req.max_length, summary.token_length_percentiles["max"] + TEMPLATE_MARGIN)


def estimate(
    estimator: Estimator,
    req: FinetuneRequest,
    base: ResolvedBase,
    train_rows: int,
    tokens: int,
    device: str,
    seq_len: int | None = None,
) -> TrainingEstimate:
    """The estimator's TrainingEstimate for this request (rows planned at `seq_len` tokens), or raise GpuboxError."""
    from gpubox.tools.estimate.requests import TrainingRequest

    fields = {k: getattr(req, k) for k in TrainingRequest.model_fields}
    fields.update(model=estimator_model(estimator, base), gpu="local" if device == "cuda" else "cpu")
    fields.update(max_length=seq_len or req.max_length)
    fields.update(dataset_samples=train_rows, dataset_tokens=max(tokens, 1))
    if fields["per_device_train_batch_size"] == "auto":
        fields["per_device_train_batch_size"] = None
    return estimator.training(TrainingRequest(**fields))


def layout(
    req: FinetuneRequest,
    device: str,
    train_rows: int,
    train_tokens: int,
    est_result: TrainingOnGpu | None,
    warnings: list[str] | None = None,
) -> tuple[int, int, bool, int, str]:
    """(micro-batch, accumulation, checkpointing, total steps, why this micro-batch); what the request asks that
    the dataset cannot give goes to `warnings`."""
    if isinstance(req.per_device_train_batch_size, int):
        micro, why = req.per_device_train_batch_size, "set in the request"
    elif est_result is not None and est_result.micro_batch:
        micro = est_result.micro_batch
        why = f"the estimator's planner for {est_result.gpu}" + (
            f" ({est_result.calibration})" if est_result.calibration else ""
        )
        if device == "cpu":
            micro = min(micro, CPU_MICRO_BATCH)
            why += f", capped at {CPU_MICRO_BATCH} on CPU"
    else:
        micro, why = CPU_MICRO_BATCH if device == "cpu" else 1, "default (no memory plan available)"
    samples = math.ceil(train_tokens / req.max_length) if req.packing else train_rows
    micro = max(1, min(micro, samples))
    nproc = req.num_processes
    per_epoch = math.ceil(samples / (micro * nproc))  # micro-batches each process sees in one epoch
    warned = warnings if warnings is not None else []
    if req.gradient_accumulation_steps:
        accum = req.gradient_accumulation_steps
        if accum > per_epoch:
            warned.append(
                f"gradient_accumulation_steps {accum} is above the {per_epoch} micro-batches of an epoch: each "
                "epoch makes one optimizer step, over fewer samples than asked"
            )
    elif req.target_global_batch:
        accum = max(1, math.ceil(req.target_global_batch / (micro * nproc)))
        if accum > per_epoch:  # one optimizer step per epoch already takes every sample
            accum = per_epoch
            note = f"target_global_batch {req.target_global_batch} is above the {samples} training samples"
            warned.append(f"{note}: gradient accumulation capped at {accum}, one optimizer step per epoch")
    else:
        accum = 1
    if req.gradient_checkpointing == "auto":
        checkpointing = est_result is not None and device == "cuda" and _needs_gc(est_result)
    else:
        checkpointing = bool(req.gradient_checkpointing)
    steps = req.max_steps or max(1, math.ceil(math.ceil(samples / (micro * nproc)) / accum * req.num_train_epochs))
    return micro, accum, checkpointing, steps, why


def _needs_gc(est_result: TrainingOnGpu) -> bool:
    micro = est_result.micro_batch
    return not any(c.micro_batch == micro and c.status == "fits" for c in est_result.without_checkpointing)


def memory_at(est_result: TrainingOnGpu | None, micro: int) -> float | None:
    """The planner's memory total at the micro-batch actually chosen (which may be below its own choice)."""
    if est_result is None:
        return None
    if est_result.micro_batch == micro:
        return est_result.memory.total_gb
    points = sorted({c.micro_batch: c.total_gb for c in est_result.candidates}.items())
    for b, gb in points:
        if b == micro:
            return gb
    if len(points) < 2:
        return None
    # memory is affine in the micro-batch (fixed part + activations per sample): a batch between or past the ones
    # tried (3 rows: micro-batch 3) is read off the line through its neighbours; it was None, and the job reserved
    # a fallback a quarter of the estimate
    above = next((i for i, (b, _) in enumerate(points) if b > micro), len(points) - 1)
    (b0, m0), (b1, m1) = points[max(above - 1, 0)], points[max(above, 1)]
    return round(m0 + (m1 - m0) * (micro - b0) / (b1 - b0), 3)


def estimate_or_warning(
    estimator: Estimator | None,
    req: FinetuneRequest,
    base: ResolvedBase,
    rows: int,
    tokens: int,
    device: str,
    warnings: list[str],
    seq_len: int | None = None,
) -> tuple[TrainingEstimate | None, TrainingOnGpu | None]:
    if estimator is None:
        warnings.append("no memory/time estimate: no estimator was given")
        return None, None
    try:
        est = estimate(estimator, req, base, rows, tokens, device, seq_len)
    except (GpuboxError, TypeError, ValueError) as exc:
        warnings.append(f"no memory/time estimate: {exc}")
        return None, None
    return est, est.results[0] if est.results else None
