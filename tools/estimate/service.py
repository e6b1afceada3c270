"""The estimator service: catalog + calibration store + the inference/training planners."""

from __future__ import annotations

from pathlib import Path

from gpubox.errors import InvalidInputError, NotFoundError
from gpubox.settings import Settings
from gpubox.tools.estimate import inference as inf
from gpubox.tools.estimate import training as tr
from gpubox.tools.estimate.calibration import CalibrationStore
from gpubox.tools.estimate.catalog import Catalog, GpuSpec, ModelShape
from gpubox.tools.estimate.formats import kv_bytes, normalise_format
from gpubox.tools.estimate.modelinfo import ResolvedModel, resolve_model
from gpubox.tools.estimate.schemas import (
    GpuCatalog,
    GpuEntry,
    InferenceEstimate,
    Measurement,
    ModelSummary,
    TrainingEstimate,
)
from gpubox.tools.gpu.nvml import gpu_status

DEFAULT_CONTEXT = 8192
TRAIN_FORMATS = {
    "full": {"bf16", "f16", "fp16", "fp32"},
    "lora": {"bf16", "f16", "fp16", "fp32"},
    "qlora": {"nf4", "nf4_dq"},
}


def summary(rm: ResolvedModel) -> ModelSummary:
    s = rm.shape
    return ModelSummary(
        id=s.id,
        source=rm.source,
        params=s.params(),
        params_b=round(s.params() / 1e9, 3),
        layers=s.layers,
        hidden=s.hidden,
        heads=s.heads,
        kv_heads=s.kv_heads,
        head_dim=s.head_dim,
        intermediate=s.intermediate,
        vocab=s.vocab,
        tied_embeddings=s.tied_embeddings,
        max_context=s.max_context,
        sliding_window=s.sliding_window,
    )


class Estimator:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.catalog = Catalog(settings.state_dir)
        self.store = CalibrationStore(settings.state_dir / "calibration.sqlite")
        self.roots: list[Path] = [*settings.allowed_roots, *settings.model_dirs]

    # --- lookups --------------------------------------------------------------------------------
    def model(self, spec: str) -> ResolvedModel:
        return resolve_model(spec, self.catalog, self.roots)

    def gpus(self, spec: str) -> list[tuple[GpuSpec, float | None, float | None]]:
        """(spec, available GB or None, total GB or None) for 'auto', 'local', 'all' or a catalog name."""
        key = spec.strip().lower()
        if key in ("auto", "local"):
            status = gpu_status()
            if status.gpus:
                # local GPUs: plan against free memory; the NVML name maps to a catalog entry through aliases
                return [
                    (self.catalog.gpu(g.name), g.memory_free_mib * 2**20 / 1e9, g.memory_total_mib * 2**20 / 1e9)
                    for g in status.gpus
                ]
            if key == "local":
                raise NotFoundError(
                    f"no local GPU to estimate for ({status.reason}); pass gpu='all' or a catalog name such as 'A10'"
                )
            key = "all"
        if key == "all":
            return [(g, None, None) for g in self.catalog.gpus.values()]
        return [(self.catalog.gpu(spec), None, None)]

    # --- inference -----------------------------------------------------------------------------
    def inference(
        self,
        model: str,
        weight_format: str | None = None,
        context_length: int | None = None,
        batch: int = 1,
        kv_cache_type: str = "f16",
        gpu: str = "auto",
    ) -> InferenceEstimate:
        rm = self.model(model)
        shape = rm.shape
        fmt = normalise_format(weight_format or rm.weight_format or "bf16")
        kv_bytes(kv_cache_type)
        exact = rm.weight_bytes if rm.weight_format == fmt else None
        wp = inf.weight_plan(shape, fmt, exact)
        warnings: list[str] = []
        ctx = context_length or min(shape.max_context, DEFAULT_CONTEXT)
        if ctx > shape.max_context:
            raise InvalidInputError(
                f"context_length {ctx} exceeds {shape.id}'s maximum of {shape.max_context} tokens; pass at most that"
            )
        if rm.weight_format and weight_format and rm.weight_format != fmt:
            warnings.append(f"the file is {rm.weight_format}; estimated as if re-quantised to {fmt}")
        results = [
            inf.estimate_on_gpu(
                shape,
                wp,
                g,
                context=ctx,
                batch=batch,
                kv_type=kv_cache_type,
                catalog=self.catalog,
                available_gb=avail,
                store=self.store,
            )
            for g, avail, _ in self.gpus(gpu)
        ]
        if len(results) > 1:
            results.sort(
                key=lambda r: (
                    not r.fits,
                    r.cheapest_usd_per_million_tokens if r.cheapest_usd_per_million_tokens is not None else 1e18,
                    -r.decode_tokens_per_s,
                )
            )
        assumptions = list(inf.ASSUMPTIONS)
        if context_length is None:
            assumptions.insert(
                0,
                f"Context {ctx} = min(model maximum {shape.max_context}, {DEFAULT_CONTEXT}); "
                "the full_context line shows the model's whole window.",
            )
        return InferenceEstimate(
            model=summary(rm),
            weight_format=fmt,
            context_length=ctx,
            batch=batch,
            kv_cache_type=kv_cache_type,
            results=results,
            assumptions=assumptions,
            warnings=warnings,
        )

    # --- training ------------------------------------------------------------------------------
    def training(
        self,
        model: str,
        method: tr.Method = "qlora",
        lora_rank: int = 16,
        target_modules: list[str] | None = None,
        seq_len: int = 512,
        micro_batch: int | None = None,
        gradient_checkpointing: bool = True,
        optimizer: tr.Optimizer = "paged_adamw_8bit",
        weight_format: str | None = None,
        dataset_samples: int | None = None,
        dataset_tokens: int | None = None,
        epochs: float = 1.0,
        target_global_batch: int | None = None,
        gpu: str = "auto",
        gpu_count: int = 1,
        headroom_pct: float = 15.0,
        tokens_per_s: float | None = None,
    ) -> TrainingEstimate:
        rm = self.model(model)
        shape = rm.shape
        fmt = (weight_format or ("nf4_dq" if method == "qlora" else "bf16")).lower()
        if fmt not in TRAIN_FORMATS[method]:
            raise InvalidInputError(
                f"weight_format '{fmt}' does not go with method '{method}'; use one of {sorted(TRAIN_FORMATS[method])}"
            )
        targets = tr.ALL_LINEAR if not target_modules or target_modules == ["all-linear"] else target_modules
        if method == "full":
            targets = []
        if seq_len > shape.max_context:
            raise InvalidInputError(f"seq_len {seq_len} exceeds {shape.id}'s maximum context {shape.max_context}")
        if dataset_tokens is None:
            if dataset_samples is None:
                raise InvalidInputError(
                    "give dataset_tokens or dataset_samples (samples are counted as seq_len tokens)"
                )
            dataset_tokens = dataset_samples * seq_len
        plan = tr.TrainingPlanInput(
            method=method,
            lora_rank=lora_rank,
            target_modules=targets,
            seq_len=seq_len,
            gradient_checkpointing=gradient_checkpointing,
            optimizer=optimizer,
            headroom=headroom_pct / 100,
            weight_format=fmt,
        )
        trainable = tr.trainable_params(shape, plan)
        warnings: list[str] = []
        results = []
        for g, _avail, total in self.gpus(gpu):
            if tokens_per_s is not None and (why := tr.plausibility(tokens_per_s, shape, plan, g, gpu_count)):
                warnings.append(why)
            results.append(
                tr.plan_on_gpu(
                    shape,
                    plan,
                    g,
                    catalog=self.catalog,
                    store=self.store,
                    micro_batch=micro_batch,
                    target_global_batch=target_global_batch,
                    dataset_tokens=dataset_tokens,
                    epochs=epochs,
                    gpu_count=gpu_count,
                    usd_per_kwh=self.settings.electricity_usd_per_kwh,
                    tokens_per_s_override=tokens_per_s,
                    vram_override_gb=total,
                )
            )
        if len(results) > 1:
            results.sort(
                key=lambda r: (
                    r.micro_batch is None,
                    min((c.usd for c in r.costs), default=1e18),
                    r.wall_hours,
                )
            )
        assumptions = [
            f"Weights: {fmt}"
            + (" (linear layers; embeddings and lm_head in 16 bit)" if method == "qlora" else "")
            + "; trainable weights and gradients fp32; optimizer "
            f"{optimizer} = {tr.OPTIMIZER_BYTES[optimizer]:g} bytes per trainable parameter.",
            "Activations: textbook 16-bit count per token per layer (12h + 4 kv_dim + 8 ffn, SDPA attention); with "
            "checkpointing only each layer's input (2h) plus one recomputed layer; logits 10 bytes x vocab per "
            "token. Multiplied by the activation factor (" + tr.ACTIVATION_FACTOR_SOURCE + ", or a calibration).",
            f"Overhead {tr.TRAINING_OVERHEAD_GB} GB (CUDA context, workspaces). Safe limit = VRAM x "
            f"(1 - {headroom_pct:g}% headroom); between it and VRAM a batch is 'too_close'.",
            "Throughput = MFU x dense BF16 peak / FLOPs per token (LoRA 4N, full 6N, +2N with checkpointing, "
            "+ attention 6 L s h). Time = tokens x epochs / (tokens/s x 3600).",
            "Costs use on-demand prices (date shown per row); electricity = TDP x hours x $/kWh "
            f"({self.settings.electricity_usd_per_kwh}).",
        ]
        if dataset_samples is not None and dataset_tokens == dataset_samples * seq_len:
            assumptions.append(f"Dataset tokens = {dataset_samples} samples x seq_len {seq_len} (packed).")
        return TrainingEstimate(
            model=summary(rm),
            method=method,
            weight_format=fmt,
            lora_rank=lora_rank if method != "full" else None,
            target_modules=targets,
            trainable_params=trainable,
            trainable_pct=round(100 * trainable / shape.params(), 4),
            seq_len=seq_len,
            gradient_checkpointing=gradient_checkpointing,
            optimizer=optimizer,
            dataset_tokens=dataset_tokens,
            epochs=epochs,
            results=results,
            assumptions=assumptions,
            warnings=warnings,
        )

    # --- catalog and calibrations --------------------------------------------------------------
    def gpu_catalog(self, name_contains: str | None = None) -> GpuCatalog:
        entries = []
        for g in self.catalog.gpus.values():
            if name_contains and name_contains.lower() not in (g.id + " " + g.name).lower():
                continue
            prices = self.catalog.costs(g.id, lambda hourly: hourly)
            entries.append(
                GpuEntry(
                    id=g.id,
                    name=g.name,
                    vram_gb=g.vram_gb,
                    bandwidth_gbs=g.bandwidth_gbs,
                    bf16_tflops=g.bf16_tflops,
                    fp32_tflops=g.fp32_tflops,
                    tdp_w=g.tdp_w,
                    gpu_class=g.gpu_class,
                    sources=g.sources,
                    prices=prices,
                )
            )
        if name_contains and not entries:
            self.catalog.gpu(name_contains)  # raises with close matches
        note = (
            f"Prices are planning defaults with the date each was observed; add or override entries in "
            f"{self.settings.state_dir / 'catalog'}/{{gpus,prices,models}}.json"
        )
        return GpuCatalog(gpus=entries, note=note)

    def record_inference(
        self,
        gpu: str,
        model: str | ResolvedModel,
        weight_format: str | None,
        decode_tokens_per_s: float,
        prefill_tokens_per_s: float | None = None,
        peak_memory_gb: float | None = None,
        context_length: int = 0,
        batch: int = 1,
        note: str | None = None,
        config: dict[str, object] | None = None,
    ) -> Measurement:
        """Store a measured inference run; on a catalogued GPU derive the decode efficiency from it. `model` may be
        already resolved (a served model file, which need not lie in the allowed roots)."""
        rm = model if isinstance(model, ResolvedModel) else self.model(model)
        fmt = normalise_format(weight_format or rm.weight_format or "bf16")
        eff = None
        gpu_id = gpu
        if gpu.lower() != "cpu":
            spec = self.catalog.gpu(gpu)
            gpu_id = spec.id
            wp = inf.weight_plan(rm.shape, fmt, rm.weight_bytes if rm.weight_format == fmt else None)
            kv = inf.kv_bytes_per_token(rm.shape, "f16", max(context_length, 1)) * context_length / 2 * batch
            eff = decode_tokens_per_s / batch * (wp.total_bytes + kv) / (spec.bandwidth_gbs * 1e9)
        cfg = {"weight_format": fmt, "context_length": context_length, "batch": batch, **(config or {})}
        return self.store.record(
            "inference",
            gpu_id,
            rm.shape.id,
            params=rm.shape.params(),
            method=fmt,
            config=cfg,
            peak_memory_gb=peak_memory_gb,
            tokens_per_s=decode_tokens_per_s,
            prefill_tokens_per_s=prefill_tokens_per_s,
            decode_efficiency=round(eff, 4) if eff else None,
            note=note,
        )

    def record_training(
        self,
        gpu: str,
        model: str,
        method: tr.Method,
        seq_len: int,
        micro_batch: int,
        gradient_checkpointing: bool,
        tokens_per_s: float | None = None,
        peak_memory_gb: float | None = None,
        lora_rank: int = 16,
        target_modules: list[str] | None = None,
        optimizer: tr.Optimizer = "paged_adamw_8bit",
        weight_format: str | None = None,
        note: str | None = None,
    ) -> Measurement:
        """Store a measured training run; derive MFU and the activation-memory factor from it."""
        rm = self.model(model)
        spec: GpuSpec = self.catalog.gpu(gpu)
        fmt = (weight_format or ("nf4_dq" if method == "qlora" else "bf16")).lower()
        targets = [] if method == "full" else (target_modules or tr.ALL_LINEAR)
        plan = tr.TrainingPlanInput(method, lora_rank, targets, seq_len, gradient_checkpointing, optimizer, 0.15, fmt)
        mfu = factor = None
        if tokens_per_s:
            mfu = tokens_per_s * tr.flops_per_token(rm.shape, plan) / (spec.bf16_tflops * 1e12)
        if peak_memory_gb:
            factor = measured_activation_factor(rm.shape, plan, micro_batch, peak_memory_gb)
        cfg = {
            "seq_len": seq_len,
            "micro_batch": micro_batch,
            "gradient_checkpointing": gradient_checkpointing,
            "lora_rank": lora_rank,
            "target_modules": targets,
            "optimizer": optimizer,
            "weight_format": fmt,
        }
        return self.store.record(
            "training",
            spec.id,
            rm.shape.id,
            params=rm.shape.params(),
            method=method,
            config=cfg,
            peak_memory_gb=peak_memory_gb,
            tokens_per_s=tokens_per_s,
            mfu=round(mfu, 4) if mfu else None,
            activation_factor=round(factor, 3) if factor else None,
            note=note,
        )

    def close(self) -> None:
        self.store.close()


def measured_activation_factor(
    shape: ModelShape, plan: tr.TrainingPlanInput, micro_batch: int, peak_gb: float
) -> float | None:
    static = sum(tr.static_memory(shape, plan).values()) + tr.TRAINING_OVERHEAD_GB * 1e9
    acts, logits = tr.activation_bytes(shape, plan, micro_batch, plan.gradient_checkpointing)
    factor = (peak_gb * 1e9 - static) / (acts + logits)
    return factor if factor > 0 else None
