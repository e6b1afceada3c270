"""Resident models: load with the estimator's fit plan, LRU eviction, memory budget, keep-alive, one request
at a time per model."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import psutil

from gpubox.errors import CapacityError, InvalidInputError, NotFoundError, UnknownNameError
from gpubox.settings import Settings
from gpubox.tools.estimate import inference as est_inf
from gpubox.tools.estimate.catalog import package_catalog
from gpubox.tools.estimate.modelinfo import read_gguf
from gpubox.tools.gpu.nvml import gpu_status
from gpubox.tools.inference.backends import LlamaBackend, TransformersBackend
from gpubox.tools.inference.registry import DEFAULT_MODEL, Discovered, discover, size_of
from gpubox.tools.inference.schemas import LoadedInfo, LoadPlan, LoadResult, ModelEntry, ModelList, UnloadResult

log = logging.getLogger("gpubox.inference")
Backend = LlamaBackend | TransformersBackend


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


@dataclass
class Resident:
    name: str
    entry: Discovered
    backend: Backend
    plan: LoadPlan
    keep_alive: float
    adapter: str | None = None
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    busy: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def info(self) -> LoadedInfo:
        return LoadedInfo(
            backend=self.backend.name,
            device=self.plan.device,
            n_gpu_layers=self.plan.n_gpu_layers,  # type: ignore[arg-type]
            context_length=self.plan.context_length,
            memory_gb=self.plan.estimated_memory_gb,
            loaded_at=iso(self.loaded_at),
            last_used=iso(self.last_used),
            keep_alive_s=self.keep_alive,
            adapter=self.adapter,
        )


class ModelManager:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.dirs = [*settings.model_dirs, settings.state_dir / "models"]
        self.resident: dict[str, Resident] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="gpubox-keepalive", daemon=True)
        self._reaper.start()

    # --- registry -------------------------------------------------------------------------------
    def discovered(self) -> dict[str, Discovered]:
        return discover(self.dirs)

    def entry(self, d: Discovered) -> ModelEntry:
        arch = params = quant = ctx = None
        template = False
        if d.format == "gguf":
            try:
                rm = read_gguf(d.path)
                arch, params, quant, ctx = rm.shape.source, rm.shape.params(), rm.weight_format, rm.shape.max_context
                template = rm.chat_template
            except Exception as exc:  # a broken file is listed, not fatal
                log.warning("cannot read %s: %s", d.path, exc)
        elif d.format == "hf":
            import json

            cfg = json.loads((d.path / "config.json").read_text())
            arch = (cfg.get("architectures") or [cfg.get("model_type")])[0]
            ctx = cfg.get("max_position_embeddings")
            quant = (cfg.get("quantization_config") or {}).get("quant_method") or str(cfg.get("torch_dtype", ""))
            template = (d.path / "chat_template.jinja").is_file() or "chat_template" in (
                (d.path / "tokenizer_config.json").read_text() if (d.path / "tokenizer_config.json").is_file() else ""
            )
        r = self.resident.get(d.name)
        return ModelEntry(
            name=d.name,
            path=str(d.path),
            format=d.format,
            architecture=arch,
            params=params,  # type: ignore[arg-type]
            quantization=quant,
            context_length=ctx,
            size_bytes=size_of(d),
            chat_template=template,
            base_model=d.base_model,
            bundled=d.bundled,
            loaded=r.info() if r else None,
        )

    def list(self) -> ModelList:
        return ModelList(
            models=[self.entry(d) for d in self.discovered().values()],
            resident_limit=self.settings.infer_max_resident,
            memory_budget_gb=self.settings.infer_memory_budget_gb,
        )

    def find(self, name: str) -> Discovered:
        found = self.discovered()
        if name.lower() in found:
            return found[name.lower()]
        raise UnknownNameError(
            "model", name, found.keys(), hint="infer_models lists them; add folders with GPUBOX_MODEL_DIRS."
        )

    # --- planning -------------------------------------------------------------------------------
    def plan(
        self, d: Discovered, backend: str, context_length: int | None, n_gpu_layers: int | None, kv_cache_type: str
    ) -> LoadPlan:
        status = gpu_status()
        free = status.gpus[0].memory_free_mib * 2**20 / 1e9 if status.gpus else None
        if d.format != "gguf":
            import json

            cfg = json.loads((d.path / "config.json").read_text())
            ctx = min(context_length or self.settings.infer_context_length, cfg.get("max_position_embeddings") or 10**9)
            size = size_of(d) / 1e9
            device = "cuda" if free is not None else "cpu"
            return LoadPlan(
                backend="transformers",
                device=device,
                n_gpu_layers=-1 if free else 0,
                context_length=ctx,
                kv_cache_type="f16",
                free_vram_gb=free,
                estimated_memory_gb=round(size * 1.2, 3),
                fits=free is None or size * 1.2 <= free,
                reason="transformers loads all weights on "
                + ("the GPU (device_map=auto spills to CPU)" if free else "the CPU"),
            )
        rm = read_gguf(d.path)
        shape = rm.shape
        ctx = min(context_length or self.settings.infer_context_length, shape.max_context)
        wp = est_inf.weight_plan(shape, rm.weight_format or "f16", rm.weight_bytes)
        mem = est_inf.memory(shape, wp, kv_cache_type, ctx, 1)
        if backend == "transformers":
            return LoadPlan(
                backend="transformers",
                device="cuda" if free else "cpu",
                n_gpu_layers=-1 if free else 0,
                context_length=ctx,
                kv_cache_type="f16",
                free_vram_gb=free,
                estimated_memory_gb=round(shape.params() * 4 / 1e9, 3),
                fits=True,
                reason="GGUF dequantised to fp32/bf16 by transformers",
            )
        if free is None:
            ram = psutil.virtual_memory().available / 1e9
            if mem.total_gb - est_inf.RUNTIME_OVERHEAD_GB > ram:
                raise CapacityError(
                    f"{d.name} needs about {mem.total_gb:.1f} GB at context {ctx}, but only {ram:.1f} GB of RAM is "
                    "free and there is no GPU; pass a smaller context_length or a smaller quantisation"
                )
            return LoadPlan(
                backend="llama.cpp",
                device="cpu",
                n_gpu_layers=0,
                context_length=ctx,
                kv_cache_type=kv_cache_type,
                free_vram_gb=None,
                estimated_memory_gb=mem.total_gb,
                fits=True,
                reason="no GPU visible to NVML: running on the CPU",
            )
        gpu = package_catalog().gpu(status.gpus[0].name)
        fit = est_inf.estimate_on_gpu(
            shape, wp, gpu, context=ctx, batch=1, kv_type=kv_cache_type, catalog=package_catalog(), available_gb=free
        )
        layers = fit.n_gpu_layers if n_gpu_layers is None else n_gpu_layers
        if n_gpu_layers is None and layers == 0:
            raise CapacityError(
                f"{d.name} does not fit even partly in the {free:.1f} GB free on {gpu.id} at context {ctx} "
                f"(needs {mem.total_gb:.1f} GB); free GPU memory (infer_unload), lower context_length, or pass "
                "n_gpu_layers=0 to run on the CPU"
            )
        return LoadPlan(
            backend="llama.cpp",
            device="cuda" if layers >= shape.layers else f"cuda ({layers}/{shape.layers} layers)",
            n_gpu_layers=-1 if layers >= shape.layers else layers,
            context_length=ctx,
            kv_cache_type=kv_cache_type,
            free_vram_gb=round(free, 3),
            estimated_memory_gb=mem.total_gb,
            fits=fit.fits,
            reason=f"estimator fit on {free:.1f} GB free ({gpu.id}): margin {fit.margin_gb:.2f} GB",
        )

    # --- load / unload --------------------------------------------------------------------------
    def load(
        self,
        name: str,
        backend: Literal["auto", "llama.cpp", "transformers"] = "auto",
        context_length: int | None = None,
        n_gpu_layers: int | None = None,
        kv_cache_type: str = "f16",
        quantization: Literal["4bit", "8bit"] | None = None,
        adapter: str | None = None,
        keep_alive_s: float | None = None,
    ) -> LoadResult:
        t0 = time.perf_counter()
        d = self.find(name)
        adapter_d: Discovered | None = None
        if d.format == "lora":
            adapter_d, d = d, self._base_of(d)
        elif adapter:
            adapter_d = self.find(adapter)
            if adapter_d.format != "lora":
                raise InvalidInputError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
        chosen = backend if backend != "auto" else ("llama.cpp" if d.format == "gguf" else "transformers")
        if adapter_d is not None and chosen == "llama.cpp" and not (adapter_d.path / "adapter.gguf").is_file():
            chosen = "transformers"  # peft adapters apply through transformers; GGUF LoRA through llama.cpp
        if chosen == "llama.cpp" and d.format != "gguf":
            raise InvalidInputError(f"{d.name} is an HF folder; llama.cpp needs a GGUF file (use backend=transformers)")
        key = adapter_d.name if adapter_d else d.name
        with self._lock:
            if key in self.resident:
                self.unload(key)
            plan = self.plan(d, chosen, context_length, n_gpu_layers, kv_cache_type)
            evicted = self._make_room(plan.estimated_memory_gb)
            if chosen == "llama.cpp":
                lora = adapter_d.path / "adapter.gguf" if adapter_d else None
                be: Backend = LlamaBackend(
                    d.path,
                    plan.context_length,
                    plan.n_gpu_layers,
                    kv_cache_type,
                    # llama-cpp-python defaults to half the logical CPUs (1 on a 2-core box): use physical cores
                    self.settings.infer_threads or psutil.cpu_count(logical=False) or 1,
                    lora,
                )
            else:
                be = TransformersBackend(
                    d.path, quantization, adapter_d.path if adapter_d else None, plan.context_length
                )
            keep = self.settings.infer_keep_alive_seconds if keep_alive_s is None else keep_alive_s
            self.resident[key] = Resident(key, adapter_d or d, be, plan, keep, adapter_d.name if adapter_d else None)
            entry = self.entry(adapter_d or d)
        return LoadResult(model=entry, plan=plan, evicted=evicted, load_seconds=round(time.perf_counter() - t0, 3))

    def _base_of(self, adapter: Discovered) -> Discovered:
        base = (adapter.base_model or "").rstrip("/").split("/")[-1].lower()
        found = self.discovered()
        for cand in (base, Path(adapter.base_model or "").name.lower()):
            if cand in found and found[cand].format != "lora":
                return found[cand]
        raise NotFoundError(
            f"adapter {adapter.name} was trained on '{adapter.base_model}', which is not among the models here; "
            "put the base model in a model dir"
        )

    def _make_room(self, need_gb: float) -> list[str]:
        evicted: list[str] = []
        budget = self.settings.infer_memory_budget_gb
        if budget is not None and need_gb > budget:
            raise CapacityError(
                f"the model needs ~{need_gb:.1f} GB, above the {budget} GB budget (infer_memory_budget_gb)"
            )

        def over() -> bool:
            used = sum(r.plan.estimated_memory_gb for r in self.resident.values())
            return len(self.resident) >= self.settings.infer_max_resident or (
                budget is not None and used + need_gb > budget
            )

        while self.resident and over():
            idle = sorted((r for r in self.resident.values() if r.busy == 0), key=lambda r: r.last_used)
            if not idle:
                raise CapacityError("every resident model is generating; retry when one finishes")
            self.unload(idle[0].name)
            evicted.append(idle[0].name)
        return evicted

    def unload(self, name: str) -> UnloadResult:
        with self._lock:
            r = self.resident.pop(name.lower(), None)
        if r is None:
            if name.lower() not in self.discovered():
                raise UnknownNameError("model", name, self.discovered().keys())
            return UnloadResult(name=name, unloaded=False)
        with r.lock:  # wait for a running request to finish
            r.backend.close()
        return UnloadResult(name=name, unloaded=True)

    def acquire(self, name: str | None) -> Resident:
        """The model to run: the named one (loading it if needed), else the most recently used, else the default."""
        with self._lock:
            if name is None:
                recent = max(self.resident.values(), key=lambda r: r.last_used) if self.resident else None
                name = recent.name if recent else DEFAULT_MODEL
            key = name.lower()
            if key not in self.resident:
                self.load(key)
            r = self.resident[key]
            r.busy += 1
            r.last_used = time.time()
            return r

    def release(self, r: Resident) -> None:
        with self._lock:
            r.busy -= 1
            r.last_used = time.time()

    # --- keep-alive -----------------------------------------------------------------------------
    def reap(self, now: float | None = None) -> list[str]:
        now = now or time.time()
        with self._lock:
            idle = [
                r.name
                for r in self.resident.values()
                if r.keep_alive > 0 and r.busy == 0 and now - r.last_used >= r.keep_alive
            ]
        for name in idle:
            log.info("unloading %s after %.0f s idle", name, self.resident[name].keep_alive)
            self.unload(name)
        return idle

    def _reap_loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.reap()
            except Exception:  # the reaper must survive a failed unload
                log.exception("keep-alive reaper")

    def close(self) -> None:
        self._stop.set()
        for name in list(self.resident):
            self.unload(name)
