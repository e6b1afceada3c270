"""Bytes per weight and per KV element for the formats llama.cpp, bitsandbytes and PyTorch use.

GGUF formats come from the `gguf` package's own enums (`LlamaFileType` for whole files, `GGMLQuantizationType`
with `GGML_QUANT_SIZES` for bits per weight), so every type llama.cpp knows (IQ1..IQ4, TQ1/TQ2, MXFP4 ...) is
costed at its real size. Without `gguf` installed a core table covers the common types.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any, Literal

from gpubox.errors import UnknownNameError

# Effective bits per weight of a whole file as llama.cpp reports model sizes: k-quant files mix block types
# (Llama-3-8B Q4_K_M = 4.58 GiB -> 4.9 bpw; Llama-2-7B Q4_0 = 3.56 GiB -> 4.5 bpw, llama-bench output in
# github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference). These override the pure block sizes below.
FILE_BITS_PER_WEIGHT: dict[str, float] = {
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
    "q3_k_l": 4.27,
    "q3_k_m": 3.91,
    "q3_k_s": 3.5,
    "q2_k": 3.35,
    # bitsandbytes NF4: 4 bits + one fp32 absmax per 64 weights; double quantisation stores the absmax in
    # 8 bits with an fp32 constant per 256 blocks (QLoRA paper, arXiv 2305.14314, section 3)
    "nf4": 4.5,
    "nf4_dq": 4.127,
}
# Core fallback for GGUF block types when `gguf` is not installed (block bytes * 8 / block size, ggml-common.h)
FALLBACK_BLOCK_BITS: dict[str, float] = {
    "iq1_s": 1.5625,
    "iq1_m": 1.75,
    "iq2_xxs": 2.0625,
    "iq2_xs": 2.3125,
    "iq2_s": 2.5625,
    "iq3_xxs": 3.0625,
    "iq3_s": 3.4375,
    "iq4_nl": 4.5,
    "iq4_xs": 4.25,
    "tq1_0": 1.6875,
    "tq2_0": 2.0625,
    "q2_k_s": 2.625,
    "mxfp4": 4.25,
}
# llama.cpp file types named after a block type with a suffix, for when `gguf` is not installed
FALLBACK_FILE_TYPES = frozenset({"iq3_xs", "iq3_m", "iq2_m", "mxfp4_moe", *FILE_BITS_PER_WEIGHT})
NOT_WEIGHT_FORMATS = frozenset({"i8", "i16", "i32", "i64", "f64", "q8_1", "q8_k"})
# names published GGUF repositories use for llama.cpp types with Q8_0 embeddings and output (e.g. bartowski's
# Q4_K_L): costed as the type they build on
COMMUNITY_NAMES = {"q2_k_l": "q2_k", "q3_k_xl": "q3_k_l", "q4_k_l": "q4_k_m", "q5_k_l": "q5_k_m", "q6_k_l": "q6_k"}
# Kept for callers that read the table directly (the inference family's fit plan).
BITS_PER_WEIGHT = FILE_BITS_PER_WEIGHT

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


def _gguf() -> Any | None:
    try:
        import gguf
    except ImportError:
        return None
    return gguf


def _key(fmt: str) -> str:
    return fmt.strip().lower().replace("-", "_")


@cache
def gguf_block_bits() -> dict[str, float]:
    """Bits per weight of every ggml block type the installed `gguf` package knows."""
    g = _gguf()
    if g is None:
        return dict(FALLBACK_BLOCK_BITS)
    out: dict[str, float] = {}
    for qtype, (block, size) in g.GGML_QUANT_SIZES.items():
        out[qtype.name.lower()] = size * 8 / block
    return out


def file_type_name(code: int) -> str | None:
    """llama.cpp `general.file_type` -> our format name (e.g. 15 -> 'q4_k_m', 19 -> 'iq2_xxs')."""
    g = _gguf()
    if g is None:
        return None
    try:
        name = g.LlamaFileType(code).name
    except ValueError:
        return None
    return re.sub(r"^(MOSTLY_|ALL_)", "", name).lower()


def _block_bits_for(key: str) -> float | None:
    """A file type's base block type: 'iq3_m' -> iq3_s, 'q2_k_s' -> q2_k, 'mxfp4_moe' -> mxfp4."""
    blocks = gguf_block_bits()
    if key in blocks:
        return blocks[key]
    if key in FALLBACK_BLOCK_BITS:
        return FALLBACK_BLOCK_BITS[key]
    base = re.sub(r"_(xxs|xs|s|m|l|moe)$", "", key)
    for cand in (base, base + "_s", base + "_0"):
        if cand in blocks:
            return blocks[cand]
    return None


@cache
def file_type_names() -> frozenset[str]:
    """llama.cpp's whole-file types ('iq3_m', 'mxfp4_moe'), whose size is their base block type's."""
    g = _gguf()
    if g is None:
        return FALLBACK_FILE_TYPES
    names = {re.sub(r"^(MOSTLY_|ALL_)", "", t.name).lower() for t in g.LlamaFileType}
    return frozenset(names - {"guessed"})


@cache
def known_formats() -> list[str]:
    """Every weight format costed: the file table, ggml block types and llama.cpp file types, without the
    block types no weight file is made of (integer tensors, f64, the activation-only q8_1/q8_k)."""
    names = {*FILE_BITS_PER_WEIGHT, *gguf_block_bits(), *FALLBACK_BLOCK_BITS, *file_type_names()}
    costed = {n for n in names - NOT_WEIGHT_FORMATS if _block_bits_for(n) or n in FILE_BITS_PER_WEIGHT}
    return sorted(costed | set(COMMUNITY_NAMES))


def bits_per_weight(fmt: str) -> float:
    key = COMMUNITY_NAMES.get(_key(fmt), _key(fmt))
    if key in FILE_BITS_PER_WEIGHT:
        return FILE_BITS_PER_WEIGHT[key]
    bits = _block_bits_for(key) if key in known_formats() else None  # a made-up 'q4_k_xxs' is not q4_k
    if bits is None:
        raise UnknownNameError("weight format", fmt[:64], known_formats())
    return bits


def kv_bytes(kv_type: str) -> float:
    key = kv_type.lower()
    if key not in KV_BYTES:
        raise UnknownNameError("KV-cache type", kv_type, KV_BYTES)
    return KV_BYTES[key]


def normalise_format(fmt: str) -> str:
    bits_per_weight(fmt)
    return _key(fmt)
