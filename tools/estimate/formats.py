"""Bytes per weight and per KV element for the formats llama.cpp, bitsandbytes and PyTorch use."""

from __future__ import annotations

from typing import Literal

from gpubox.errors import UnknownNameError

# Effective bits per weight of the whole file, as llama.cpp reports model sizes (k-quants mix types:
# Llama-3-8B Q4_K_M = 4.58 GiB -> 4.9 bpw; Llama-2-7B Q4_0 = 3.56 GiB -> 4.5 bpw, hardware.md).
BITS_PER_WEIGHT: dict[str, float] = {
    "f32": 32.0,
    "f16": 16.0,
    "bf16": 16.0,
    "q8_0": 8.5,
    "int8": 8.0,
    "q6_k": 6.5625,
    "q5_k_m": 5.69,
    "q5_k_s": 5.54,
    "q5_1": 6.0,
    "q5_0": 5.5,
    "q4_k_m": 4.89,
    "q4_k_s": 4.58,
    "q4_1": 5.0,
    "q4_0": 4.5,
    "q3_k_m": 3.91,
    "q3_k_s": 3.5,
    "q2_k": 3.35,
    "nf4": 4.5,  # bitsandbytes NF4, block 64 with an fp32 absmax
    "nf4_dq": 4.127,  # NF4 with double quantisation of the absmax constants
}

# llama.cpp KV-cache element sizes (blocks of 32 with an fp16 scale)
KV_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 1.0625,
    "q5_1": 0.75,
    "q4_0": 0.5625,
}

KvType = Literal["f16", "bf16", "q8_0", "q5_1", "q4_0", "f32"]

# bitsandbytes/transformers keep embeddings and lm_head in 16 bit when quantising to 4/8 bit
SIXTEEN_BIT_EMBEDDINGS = {"nf4", "nf4_dq", "int8"}


def bits_per_weight(fmt: str) -> float:
    key = fmt.lower().replace("-", "_")
    if key not in BITS_PER_WEIGHT:
        raise UnknownNameError("weight format", fmt, BITS_PER_WEIGHT)
    return BITS_PER_WEIGHT[key]


def kv_bytes(kv_type: str) -> float:
    key = kv_type.lower()
    if key not in KV_BYTES:
        raise UnknownNameError("KV-cache type", kv_type, KV_BYTES)
    return KV_BYTES[key]


def normalise_format(fmt: str) -> str:
    bits_per_weight(fmt)
    return fmt.lower().replace("-", "_")
