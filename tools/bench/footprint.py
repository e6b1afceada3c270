"""The memory a benchmark worker will hold, per ledger device, from its parameters (before it starts).

Sizes follow what the workers allocate: attention keeps Q, K, V and the output per shape plus an fp32 reference
of each, and the math backend materialises the B·H·N·N score and softmax matrices (the fp32 reference does so a
few heads at a time, under 2 GB);
backward doubles the tensors (their gradients). bench_device holds three bandwidth buffers, three square fp32
matrices and, on a GPU, a pinned host buffer. A torch worker process itself takes about 0.6 GB of host RAM, 1.0 GB
once CUDA is in use (0.99 GB in the H100 and H200 runs: bench/results/gpu_h100/, gpu_h200_20261127/), and a CUDA
context about 0.5 GB on its GPU.
"""

from __future__ import annotations

import json
from typing import Any

from gpubox.tools.bench.attention import CPU_DEFAULTS, GPU_DEFAULTS

GB = 1e9
TORCH_PROCESS_GB = 0.6
TORCH_CUDA_PROCESS_GB = 1.0  # its CUDA libraries (cuBLAS, cuDNN) mapped in
CUDA_CONTEXT_GB = 0.5
BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def on_gpu(params: dict[str, Any], gpus: bool) -> bool:
    return params.get("device", "auto") != "cpu" and gpus


def attention_gb(params: dict[str, Any], cuda: bool) -> float:
    d = GPU_DEFAULTS if cuda else CPU_DEFAULTS
    b = BYTES[params.get("dtype") or str(d["dtype"])]
    batch, heads = int(params["batch"]), int(params.get("heads") or d["heads"])
    worst = 0.0
    for n in params.get("seq_lens") or d["seq_lens"]:
        for dim in params.get("head_dims") or d["head_dims"]:
            tensors = 4 * batch * heads * n * dim * (b + 4)
            # the backend's scores and softmax in its dtype; the fp32 reference computes a few heads at a time
            # and stays under 2 GB (attention.reference)
            scores = 2 * batch * heads * n * n * b + min(2e9, 2 * batch * heads * n * n * 4)
            worst = max(worst, (tensors + scores) * (2 if params.get("backward") else 1))
    return worst / GB


def device_gb(params: dict[str, Any], cuda: bool) -> tuple[float, float]:
    """(on the device, pinned on the host)."""
    buffer = (params.get("buffer_mb") or (1024 if cuda else 256)) * 2**20
    n = params.get("matmul_size") or (8192 if cuda else 1024)
    on_dev = (3 * buffer + 3 * n * n * 4) / GB
    return on_dev, (min(buffer, 512 * 2**20) / GB if cuda else 0.0)


def needs(task: str, params: dict[str, Any], gpus: bool) -> dict[str, float]:
    cuda = on_gpu(params, gpus)
    if task == "attention":
        work, pinned = attention_gb(params, cuda), 0.0
    else:
        work, pinned = device_gb(params, cuda)
    if cuda:
        return {"cuda:0": work + CUDA_CONTEXT_GB, "host": TORCH_CUDA_PROCESS_GB + pinned}
    return {"host": TORCH_PROCESS_GB + work}


# the parameters footprint.needs reads: a run's memory depends on these, not on iterations or tolerances
MEMORY_PARAMS = {
    "attention": ("device", "dtype", "batch", "heads", "seq_lens", "head_dims", "backward"),
    "device": ("device", "buffer_mb", "matmul_size"),
}


def key(task: str, params: dict[str, Any], needs: dict[str, float]) -> str:
    """The benchmark configuration whose measured peak the box ledger remembers: task, devices and the parameters
    its memory depends on (box_plan's defaults and a tool call with the same shape share it)."""
    shape = {k: params.get(k) for k in MEMORY_PARAMS.get(task, ())}
    return f"bench|{task}|{','.join(sorted(needs))}|{json.dumps(shape, sort_keys=True, default=str)}"
