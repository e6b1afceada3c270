"""The estimator service: catalog + calibration store + the inference/training planners.

A training estimate is assembled in training_estimate.py; this class holds the lookups it plans with.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpubox.errors import InvalidInputError, UnknownNameError
from gpubox.settings import Settings
from gpubox.tools.estimate import bounds, training_estimate
from gpubox.tools.estimate import inference as inf
from gpubox.tools.estimate import training as tr
from gpubox.tools.estimate.calibration import CalibrationStore
from gpubox.tools.estimate.catalog import Catalog, GpuSpec, norm
from gpubox.tools.estimate.formats import kv_bytes, normalise_format
from gpubox.tools.estimate.modelinfo import ResolvedModel, resolve_model, summary
from gpubox.tools.estimate.rankings import RANKING_NOTE, ranking
from gpubox.tools.estimate.requests import TrainingRequest, check_precision
from gpubox.tools.estimate.schemas import (
    DeviceProfile,
    GpuCatalog,
    GpuEntry,
    GpuTable,
    InferenceEstimate,
    Measurement,
    TrainingEstimate,
)
from gpubox.tools.estimate.targets import Target, cpu_target, local_target, resolve, with_measured
from gpubox.tools.gpu.devices import local_gpus

DEFAULT_CONTEXT = 8192
Runnable = tuple[dict[str, Path], list[Path]]  # infer_models' names -> files, and the roots they may live in


class Estimator:
    def __init__(self, settings: Settings, runnable: Callable[[], Runnable] | None = None) -> None:
        """`runnable()`: the models infer_models lists (name -> GGUF file or HF folder) and the roots they may
        live in (a symlink in a model dir may point into the state dir; the bundled model lives in its package)."""
        self.settings = settings
        self.catalog = Catalog(settings.state_dir)
        self.store = CalibrationStore(settings.state_dir / "calibration.sqlite")
        self.roots: list[Path] = [*settings.allowed_roots, *settings.model_dirs]
        self._runnable = runnable or (lambda: ({}, []))

    # --- lookups --------------------------------------------------------------------------------
    def model(self, spec: str) -> ResolvedModel:
        """A catalog name, a path, else a model here by its infer_models name (read from its file: shape and
        quantisation as it loads). The catalog is asked first: it needs no walk of the model dirs."""
        try:
            return resolve_model(spec, self.catalog, self.roots)
        except UnknownNameError as exc:
            here, roots = self._runnable()
            local = here.get(spec.lower())
            if local is not None:  # found by the model registry, inside its roots
                return resolve_model(str(local), self.catalog, [*self.roots, *roots])
            if not here:
                raise
            raise UnknownNameError("model", spec, [*self.catalog.models, *here], hint=exc.hint) from None

    def targets(self, spec: str, dtype: str = "bf16") -> list[Target]:
        """Devices for 'auto', 'local', 'cpu', 'all' or a catalog name, with measured profiles applied."""
        return [with_measured(t, self.store, dtype) for t in resolve(spec, self.catalog)]

    def device_spec(self, name: str) -> GpuSpec:
        """A catalog GPU, 'cpu', or a local GPU by its NVML name (described from NVML when not catalogued)."""
        if name.strip().lower() == "cpu":
            return cpu_target().spec
        found = self.catalog.find_gpu(name)
        if found is not None:
            return found
        for f in local_gpus():
            if norm(f.name) == norm(name):
                return local_target(f, self.catalog).spec
        return self.catalog.gpu(name)  # raises: ambiguous or unknown, with candidates

    # --- inference -----------------------------------------------------------------------------
    def inference(
        self,
        model: str,
        weight_format: str | None = None,
        context_length: int | None = None,
        batch: int = 1,
        kv_cache_type: str = "f16",
        gpu: str = "auto",
        tokens_per_s: float | None = None,
        detail: bool = True,
    ) -> InferenceEstimate:
        """Fit, speed and cost on each device of `gpu`; several devices without `detail` come as a ranking."""
        rm = self.model(model)
        shape = rm.shape
        fmt = normalise_format(weight_format or rm.weight_format or "bf16")
        kv_bytes(kv_cache_type)
        exact = rm.weight_bytes if rm.weight_format == fmt else None
        wp = inf.weight_plan(shape, fmt, exact)
        warnings: list[str] = []
        quoted: list[str] = []  # a quoted speed's verdict per GPU
        ctx = context_length or min(shape.max_context, DEFAULT_CONTEXT)
        if ctx > shape.max_context:
            raise InvalidInputError(
                f"context_length {ctx} exceeds {shape.id}'s maximum of {shape.max_context} tokens; pass at most that"
            )
        if rm.weight_format and weight_format and rm.weight_format != fmt:
            warnings.append(f"the file is {rm.weight_format}; estimated as if re-quantised to {fmt}")
        targets = self.targets(gpu)
        results = []
        for t in targets:
            r = inf.estimate_on_gpu(
                shape,
                wp,
                t.spec,
                context=ctx,
                batch=batch,
                kv_type=kv_cache_type,
                catalog=self.catalog,
                available_gb=t.available_gb,
                store=self.store,
            )
            r.spec_source = t.source
            if tokens_per_s is not None and (why := inf.check_quoted(r, tokens_per_s, shape.id, fmt, self.catalog)):
                quoted.append(why)
            results.append(r)
        if len(results) > 1:
            results.sort(
                key=lambda r: (
                    not r.fits,
                    r.cheapest_usd_per_million_tokens if r.cheapest_usd_per_million_tokens is not None else 1e18,
                    -r.decode_tokens_per_s,
                )
            )
        compact = not detail and len(results) > 1
        warnings += inf.quoted_summary(results, tokens_per_s, shape.id, fmt) if compact and len(quoted) > 3 else quoted
        warnings += self.ignored("inference", targets)
        assumptions = [n for t in targets for n in t.notes] + ([RANKING_NOTE] if compact else list(inf.ASSUMPTIONS))
        if context_length is None:
            assumptions.insert(
                0,
                f"Context {ctx} = min(model maximum {shape.max_context}, {DEFAULT_CONTEXT}); "
                "the full_context line shows the model's whole window.",
            )
        if tokens_per_s is not None:
            assumptions.append(
                f"Quoted {tokens_per_s:g} tok/s checked against each GPU's bandwidth ceiling; where plausible, "
                "costs per million tokens use the quoted speed."
            )
        est = bounds.finite(
            InferenceEstimate(
                model=summary(rm),
                weight_format=fmt,
                context_length=ctx,
                batch=batch,
                kv_cache_type=kv_cache_type,
                results=results,
                assumptions=assumptions,
                warnings=warnings,
            )
        )
        if compact:
            est.ranking, est.results = ranking(results), []
        return est

    # --- training ------------------------------------------------------------------------------
    def training(self, req: TrainingRequest, detail: bool = True) -> TrainingEstimate:
        """Memory plan, micro-batch and (when the run length is known) time and cost of `req` on each device;
        several devices without `detail` come as a ranking."""
        check_precision(req)
        return training_estimate.estimate(self, req, detail)

    def ignored(self, kind: str, targets: list[Target]) -> list[str]:
        """Stored device profiles and runs of `kind` on these devices that estimates left out, and why."""
        found = [w for t in targets for w in [*t.warnings, *self.store.ignored(kind, t.spec)]]
        return list(dict.fromkeys(found))

    # --- catalog and calibrations --------------------------------------------------------------
    def gpu_catalog(self, name_contains: str | None = None, detail: bool = True) -> GpuCatalog:
        """The GPU catalog; without `detail`, one row per GPU with its cheapest price."""
        needle = name_contains.strip().lower() if name_contains is not None else ""
        if name_contains is not None and not needle:  # ' ' matched every entry through the joining space
            raise InvalidInputError("name_contains is blank; give part of a GPU name (e.g. 'H100') or leave it out")
        entries = []
        for g in self.catalog.gpus.values():
            if needle and needle not in g.id.lower() and needle not in g.name.lower():
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
        if detail:
            return GpuCatalog(gpus=entries, note=note)
        rows = []
        for g in entries:
            c = min(g.prices, key=lambda p: p.usd_per_hour, default=None)
            usd, provider = (c.usd_per_hour, c.provider) if c else (None, None)
            rows.append((g.id, g.vram_gb, g.bandwidth_gbs, g.bf16_tflops, usd, provider))
        note += "; detail=true adds names, FP32 TFLOPS, TDP, sources and every provider's dated price"
        return GpuCatalog(gpus=[], table=GpuTable(rows=rows), note=note)

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
        spec = self.device_spec(gpu)
        wp = inf.weight_plan(rm.shape, fmt, rm.weight_bytes if rm.weight_format == fmt else None)
        kv = inf.kv_bytes_per_token(rm.shape, "f16", max(context_length, 1)) * context_length / 2 * batch
        step_bytes = wp.total_bytes + kv  # read once per decode step
        bounds.raise_if(
            [
                *bounds.inference_problems(
                    spec, step_bytes, batch, rm.shape.params(), decode_tokens_per_s, prefill_tokens_per_s
                ),
                bounds.memory_problem(spec, peak_memory_gb),
            ]
        )
        # a CPU's bandwidth is a default until calibrated, so no efficiency is derived from it
        eff = None if spec.id == "cpu" else decode_tokens_per_s / batch * step_bytes / (spec.bandwidth_gbs * 1e9)
        cfg = {"weight_format": fmt, "context_length": context_length, "batch": batch, **(config or {})}
        return self.store.record(
            "inference",
            spec.id,
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
        method: tr.Method = "qlora",
        max_length: int = 512,
        per_device_train_batch_size: int = 1,
        gradient_checkpointing: bool = True,
        tokens_per_s: float | None = None,
        peak_memory_gb: float | None = None,
        lora_r: int = 16,
        lora_target_modules: list[str] | str | None = None,
        optim: str = "paged_adamw_8bit",
        weight_format: str | None = None,
        note: str | None = None,
    ) -> Measurement:
        """Store a measured training run (TrainingRequest names); derive MFU and the activation-memory factor.
        Later plans reuse them only for comparable runs: same GPU, method, rank, targets, optimizer and
        checkpointing."""
        rm = self.model(model)
        spec = self.device_spec(gpu)
        fmt = tr.train_format(method, weight_format)
        targets = tr.lora_targets(lora_target_modules, method)
        if optim not in tr.OPTIMIZER_BYTES:
            raise UnknownNameError("optimizer", optim, tr.OPTIMIZER_BYTES)
        plan = tr.TrainingPlanInput(method, lora_r, targets, max_length, gradient_checkpointing, optim, 0.15, fmt)
        tr.trainable_params(rm.shape, plan)  # validates the target names
        fpt = tr.flops_per_token(rm.shape, plan)
        bounds.raise_if([bounds.training_problem(spec, fpt, tokens_per_s), bounds.memory_problem(spec, peak_memory_gb)])
        mfu = tokens_per_s * fpt / (spec.bf16_tflops * 1e12) if tokens_per_s else None
        factor = None
        if peak_memory_gb:
            factor = tr.measured_activation_factor(rm.shape, plan, per_device_train_batch_size, peak_memory_gb)
            floor = tr.static_bytes(rm.shape, plan) / 1e9
            if peak_memory_gb < floor:  # stored as if measured, though the weights alone take more
                raise InvalidInputError(
                    f"peak_memory_gb {peak_memory_gb:g} is below the {floor:.3g} GB this run holds before any "
                    "activation (weights, adapter, gradients, optimizer state); check the figure and its unit (GB). "
                    "Nothing was stored."
                )
            why = " (measured / textbook activation bytes, from peak_memory_gb)"
            bounds.raise_if([bounds.problem("activation_factor", factor, *bounds.ACTIVATION_FACTOR, why)])
        cfg = {
            "max_length": max_length,
            "per_device_train_batch_size": per_device_train_batch_size,
            **tr.comparable(plan, gradient_checkpointing),
            "weight_format": fmt,
            "memory_model": tr.MEMORY_MODEL,
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

    def record_device(
        self, gpu: str, memory_bandwidth_gbs: float | None, tflops: dict[str, float], note: str | None = None
    ) -> DeviceProfile:
        """Store a device profile measured on this box (`gpu`: catalog name, local NVML name or 'cpu')."""
        spec = self.device_spec(gpu)
        return self.store.record_device(spec.id, memory_bandwidth_gbs, tflops, note, spec=spec)

    def close(self) -> None:
        self.store.close()
