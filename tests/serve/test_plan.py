"""The engine plan for devices this box does not have: the exact flags and environment gpubox would run for one
CPU, one and two GPUs and two nodes (Ray), from real model shapes in the estimator's catalog."""

from __future__ import annotations

import os

import pytest

from gpubox.errors import CapacityError, InvalidInputError
from gpubox.tools.estimate.catalog import package_catalog
from gpubox.tools.serve.plan import CPU_RUNTIME_GB, Gpu, Overrides, plan_engine


def shape(name: str):  # type: ignore[no-untyped-def]
    return package_catalog().model(name)


def test_cpu_plan_sizes_the_kv_space_and_reserves_host_ram() -> None:
    s = shape("llama-3.1-8b")
    plan, args = plan_engine(s, 16.0, "bfloat16", [], host_free_gb=64.0, default_len=2048, o=Overrides())
    assert plan.device == "cpu" and plan.max_model_len == 2048 and plan.dtype == "bfloat16"
    assert plan.kv_cache_space_gb is not None and plan.kv_cache_space_gb >= 1
    assert plan.env == {"VLLM_CPU_KVCACHE_SPACE": str(plan.kv_cache_space_gb)}
    assert plan.memory_gb["host"] == pytest.approx(16.0 + plan.kv_cache_space_gb + CPU_RUNTIME_GB)
    assert args[:4] == ["--max-model-len", "2048", "--dtype", "bfloat16"]
    with pytest.raises(CapacityError, match="host RAM"):
        plan_engine(s, 16.0, "bfloat16", [], host_free_gb=12.0, default_len=2048, o=Overrides())


def test_one_gpu_takes_the_share_the_ledger_has_free() -> None:
    s = shape("llama-3.1-8b")
    gpus = [Gpu(total_gb=80.0, free_gb=60.0)]
    plan, args = plan_engine(s, 16.0, "bfloat16", gpus, host_free_gb=64.0, default_len=4096, o=Overrides())
    assert plan.tensor_parallel_size == 1 and plan.gpu_memory_utilization == pytest.approx(0.75)
    assert "--tensor-parallel-size" not in args and args[-2:] == ["--gpu-memory-utilization", "0.750"]
    assert plan.memory_gb["cuda:0"] == pytest.approx(60.0)


def test_a_utilization_override_above_the_free_share_is_refused_not_over_committed() -> None:
    s = shape("llama-3.1-8b")
    gpus = [Gpu(total_gb=80.0, free_gb=30.0)]  # 0.375 of the card is free in the ledger
    with pytest.raises(CapacityError, match=r"asks vLLM for 72.0 GB.*gpu_memory_utilization <= 0.375"):
        plan_engine(s, 16.0, "bfloat16", gpus, 64.0, 4096, Overrides(gpu_memory_utilization=0.9))
    plan, args = plan_engine(s, 16.0, "bfloat16", gpus, 64.0, 4096, Overrides(gpu_memory_utilization=0.3))
    assert args[-2:] == ["--gpu-memory-utilization", "0.300"] and plan.memory_gb["cuda:0"] == pytest.approx(24.0)


def test_a_model_too_big_for_one_gpu_is_split_over_the_smallest_tensor_parallel_group() -> None:
    s = shape("llama-3.1-70b")  # ~141 GB of bf16 weights
    gpus = [Gpu(total_gb=80.0, free_gb=78.0) for _ in range(4)]
    plan, args = plan_engine(s, 141.0, "bfloat16", gpus, host_free_gb=256.0, default_len=8192, o=Overrides())
    assert plan.tensor_parallel_size == 2, plan.reasons
    assert "--tensor-parallel-size" in args and args[args.index("--tensor-parallel-size") + 1] == "2"
    assert set(plan.memory_gb) == {"cuda:0", "cuda:1", "host"}


def test_two_nodes_pipeline_across_ray() -> None:
    s = shape("llama-3.1-70b")
    gpus = [Gpu(total_gb=24.0, free_gb=23.0) for _ in range(4)]  # four 24 GB cards per node
    with pytest.raises(CapacityError, match="more nodes"):
        plan_engine(s, 141.0, "bfloat16", gpus, host_free_gb=256.0, default_len=4096, o=Overrides())
    plan, args = plan_engine(s, 141.0, "bfloat16", gpus, host_free_gb=256.0, default_len=4096, o=Overrides(nodes=2))
    assert (plan.tensor_parallel_size, plan.pipeline_parallel_size, plan.nodes) == (4, 2, 2)
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    assert args[args.index("--distributed-executor-backend") + 1] == "ray"


def test_overrides_are_checked_against_the_model_and_the_box() -> None:
    s = shape("llama-3.1-8b")
    gpus = [Gpu(total_gb=80.0, free_gb=80.0) for _ in range(2)]
    with pytest.raises(InvalidInputError, match="needs 4 GPUs; 2 are visible here"):
        plan_engine(s, 16.0, None, gpus, 64.0, 2048, Overrides(tensor_parallel_size=4))
    with pytest.raises(InvalidInputError, match="above the model's"):
        plan_engine(s, 16.0, None, [], 64.0, 2048, Overrides(max_model_len=10_000_000))
    plan, _ = plan_engine(s, 16.0, None, gpus, 64.0, 2048, Overrides(tensor_parallel_size=2, dtype="float16"))
    assert plan.tensor_parallel_size == 2 and plan.dtype == "float16" and "as asked" in plan.reasons[-2]


def test_a_lora_adapter_is_served_on_its_base_by_name_with_a_rank_vllm_accepts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from gpubox.tools.finetune.schemas import ResolvedBase
    from gpubox.tools.serve.service import Adapter, lora_args

    base = ResolvedBase(name="b", path="/m", format="hf", hf_path="/m", hf_ready=True)
    args = lora_args(Adapter(name="glimmer", path=Path("/a/glimmer"), rank=12, base=base))
    assert args == ["--enable-lora", "--lora-modules", "glimmer=/a/glimmer", "--max-lora-rank", "16"]
    assert lora_args(Adapter(name="x", path=Path("/x"), rank=4096, base=base))[-1] == "512"


def test_pipeline_stages_on_one_node_reserve_every_gpu_they_run_on_and_never_more_than_is_free() -> None:
    s = shape("llama-3.1-8b")
    gpus = [Gpu(total_gb=85.52, free_gb=80.2 + i / 100) for i in range(2)]  # shares that would round up
    plan, args = plan_engine(s, 16.0, None, gpus, 64.0, 2048, Overrides(pipeline_parallel_size=2))
    assert set(plan.memory_gb) == {"cuda:0", "cuda:1", "host"}  # stage 2 runs on cuda:1: reserved too
    assert all(plan.memory_gb[f"cuda:{i}"] <= g.free_gb for i, g in enumerate(gpus))  # the ledger can admit it
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"


def test_cpu_ranks_get_a_core_each_their_own_kv_space_and_runtime_and_pipeline_stages_compile() -> None:
    s = shape("llama-3.1-8b")  # 32 heads, 32 layers
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("needs 2 usable CPU cores for a 2-rank plan")
    o = Overrides(pipeline_parallel_size=2, enforce_eager=True, kv_cache_space_gb=2)
    plan, args = plan_engine(s, 16.0, "bfloat16", [], host_free_gb=64.0, default_len=2048, o=o)
    assert plan.pipeline_parallel_size == 2 and args[-2:] == ["--pipeline-parallel-size", "2"]
    assert plan.memory_gb["host"] == pytest.approx(16.0 + 2 * (2 + CPU_RUNTIME_GB))  # KV space and runtime per rank
    assert not plan.enforce_eager and "--enforce-eager" not in args  # vLLM's CPU pipeline fails in eager mode
    first, second = plan.env["VLLM_CPU_OMP_THREADS_BIND"].split("|")  # the usable cores split between the ranks
    assert set(first.split(",")).isdisjoint(second.split(",")) and len(first.split(",")) == cores // 2
    assert any("enforce_eager off" in r for r in plan.reasons) and any("2 CPU ranks" in r for r in plan.reasons)
    tp, _ = plan_engine(s, 16.0, "bfloat16", [], 64.0, 2048, Overrides(tensor_parallel_size=2, enforce_eager=True))
    assert tp.tensor_parallel_size == 2 and tp.enforce_eager
    with pytest.raises(InvalidInputError, match=f"needs {2 * cores} CPU cores; {cores} are usable"):
        too_many = Overrides(tensor_parallel_size=2, pipeline_parallel_size=cores)
        plan_engine(s, 16.0, "bfloat16", [], 64.0, 2048, too_many)
    with pytest.raises(InvalidInputError, match="does not divide the model's 9 attention heads"):
        plan_engine(shape("smollm2-135m"), 0.3, "bfloat16", [], 64.0, 2048, Overrides(tensor_parallel_size=2))
    with pytest.raises(InvalidInputError, match="nodes > 1 needs GPUs"):
        plan_engine(s, 16.0, "bfloat16", [], 64.0, 2048, Overrides(nodes=2))


def test_the_remembered_footprint_key_holds_every_flag_and_the_kv_space() -> None:
    from gpubox.tools.serve.plan import footprint_key

    args = ["--max-model-len", "4096", "--dtype", "bfloat16"]
    small, large = {"VLLM_CPU_KVCACHE_SPACE": "16"}, {"VLLM_CPU_KVCACHE_SPACE": "35"}
    assert footprint_key("/m", args, small) != footprint_key("/m", args, large)  # sized from the free memory
    assert footprint_key("/m", args, small) != footprint_key("/m", [*args, "--enforce-eager"], small)
    assert footprint_key("/m", args, small) == footprint_key("/m", list(args), dict(small))


def test_gpus_are_taken_in_their_numeric_order() -> None:
    from gpubox.tools.serve.service import _device_order

    devices = ["cuda:10", "host", "cuda:2", "cuda:0"]
    assert sorted(devices, key=_device_order) == ["cuda:0", "cuda:2", "cuda:10", "host"]
