"""The load plan (backend, device, GPU layers and context from the estimator's fit on the free VRAM), and opening
the backend it chose."""

from __future__ import annotations

from typing import Literal

import psutil

from gpubox.errors import CapacityError, GpuboxError, InvalidInputError
from gpubox.settings import Settings
from gpubox.tools.estimate import inference as est_inf
from gpubox.tools.estimate.catalog import package_catalog
from gpubox.tools.estimate.targets import local_spec
from gpubox.tools.gpu.devices import local_gpus
from gpubox.tools.gpu.nvml import gpu_status
from gpubox.tools.inference import load_probe
from gpubox.tools.inference.backends import LlamaBackend, TransformersBackend
from gpubox.tools.inference.llama_process import LlamaProcessBackend
from gpubox.tools.inference.registry import Discovered, MetaCache, size_of
from gpubox.tools.inference.schemas import LoadPlan

Backend = LlamaBackend | LlamaProcessBackend | TransformersBackend


def choose_backend(
    d: Discovered, adapter_d: Discovered | None, backend: Literal["auto", "llama.cpp", "transformers"]
) -> Literal["llama.cpp", "transformers"]:
    """The backend a load of `d` (with `adapter_d`) runs on: llama.cpp for a GGUF unless asked otherwise."""
    chosen = backend if backend != "auto" else ("llama.cpp" if d.format == "gguf" else "transformers")
    if adapter_d is not None and chosen == "llama.cpp" and not (adapter_d.path / "adapter.gguf").is_file():
        chosen = "transformers"  # peft adapters apply through transformers; GGUF LoRA through llama.cpp
    if chosen == "llama.cpp" and d.format != "gguf":
        raise InvalidInputError(f"{d.name} is an HF folder; llama.cpp needs a GGUF file (use backend=transformers)")
    return chosen


def plan(
    settings: Settings,
    meta: MetaCache,
    d: Discovered,
    backend: str,
    context_length: int | None,
    n_gpu_layers: int | None,
    kv_cache_type: str,
) -> LoadPlan:
    """How `d` loads here: backend, device, layers on the GPU, context; a context asked beyond the model's is capped
    and the plan's reason says so."""
    p = _plan(settings, meta, d, backend, context_length, n_gpu_layers, kv_cache_type)
    if context_length and p.context_length < context_length:
        p.reason += f"; context_length {context_length} capped to the model's maximum, {p.context_length}"
    return p


def _plan(
    settings: Settings,
    meta: MetaCache,
    d: Discovered,
    backend: str,
    context_length: int | None,
    n_gpu_layers: int | None,
    kv_cache_type: str,
) -> LoadPlan:
    status = gpu_status()
    # Plan on the GPU CUDA will use (its first visible device), matched to NVML by UUID: NVML's index order
    # and CUDA_VISIBLE_DEVICES' order can differ.
    visible = local_gpus() if status.gpus else []
    dev = next((g for g in status.gpus if visible and g.uuid == visible[0].uuid), None)
    if dev is None and status.gpus and not visible:
        dev = status.gpus[0]
    free = dev.memory_free_mib * 2**20 / 1e9 if dev is not None else None
    if d.format != "gguf":
        cfg = meta.json_file(d.path / "config.json")
        max_pos = cfg.get("max_position_embeddings")
        if max_pos is not None and (not isinstance(max_pos, int) or isinstance(max_pos, bool) or max_pos < 1):
            raise InvalidInputError(f"{d.path / 'config.json'}: max_position_embeddings must be a positive integer")
        ctx = min(context_length or settings.infer_context_length, max_pos or 10**9)
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
            + ("the GPU the box ledger reserves it on (cuda:0)" if free else "the CPU"),
        )
    rm = meta.gguf(d.path)
    shape = rm.shape
    ctx = min(context_length or settings.infer_context_length, shape.max_context)
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
    assert dev is not None  # free is set only when a device was found
    # NVML-derived spec: GPUs the catalog lacks (an RTX 4070, a B200) are still planned for
    gpu = local_spec(package_catalog(), uuid=dev.uuid)
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


def own_process(setting: Literal["auto", "always", "never"]) -> bool:
    """Whether llama.cpp models run in a child process: always on GPU builds unless told never (see
    llama_process for why); CPU builds run in the server's process, where nothing of the kind was seen."""
    return setting == "always" or (setting == "auto" and load_probe.gpu_build())


def open_backend(
    settings: Settings,
    d: Discovered,
    adapter_d: Discovered | None,
    chosen: str,
    p: LoadPlan,
    kv_cache_type: str,
    quantization: Literal["4bit", "8bit"] | None,
) -> Backend:
    try:
        if chosen == "llama.cpp":
            lora = adapter_d.path / "adapter.gguf" if adapter_d else None
            # llama-cpp-python defaults to half the logical CPUs (1 on a 2-core box): use physical cores
            threads = settings.infer_threads or psutil.cpu_count(logical=False) or 1
            if own_process(settings.infer_llama_process):
                return LlamaProcessBackend(d.path, p.context_length, p.n_gpu_layers, kv_cache_type, threads, lora)
            return LlamaBackend(d.path, p.context_length, p.n_gpu_layers, kv_cache_type, threads, lora)
        return TransformersBackend(d.path, quantization, adapter_d.path if adapter_d else None, p.context_length)
    except GpuboxError:
        raise
    except MemoryError as exc:
        raise CapacityError(f"out of memory loading {d.name}; unload other models or pick a smaller one") from exc
    except Exception as exc:  # a broken or unsupported file: name it and the problem, not a traceback
        what = f"{d.path}" + (f" with adapter {adapter_d.path}" if adapter_d else "")
        raise InvalidInputError(f"{what} could not be loaded by {chosen}: {type(exc).__name__}: {exc}") from exc
