"""A small llama GGUF with SmolLM2's BPE tokenizer and random weights (2 blocks, 64 wide, 8 MB), for GPU-box checks
that need a real llama.cpp load but not the 92 MB bundled model (one device call carries 64 MiB).

    python bench/tiny_gguf.py OUT.gguf
"""

import sys

import gguf
import numpy as np

from gpubox.bundled import smollm2_gguf

r = gguf.GGUFReader(str(smollm2_gguf()))
w = gguf.GGUFWriter(sys.argv[1], "llama")
E, FF, H, KV, L, V = 64, 128, 4, 2, 2, 49152
w.add_block_count(L)
w.add_context_length(2048)
w.add_embedding_length(E)
w.add_feed_forward_length(FF)
w.add_head_count(H)
w.add_head_count_kv(KV)
w.add_rope_freq_base(100000.0)
w.add_layer_norm_rms_eps(1e-5)
w.add_vocab_size(V)
w.add_rope_dimension_count(E // H)
w.add_file_type(1)
for k, f in r.fields.items():
    if k.startswith("tokenizer."):
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), vt, sub_type=sub)
rng = np.random.default_rng(0)


def t(name, *shape, dtype=np.float16):
    w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(dtype))


t("token_embd.weight", V, E)
t("output_norm.weight", E, dtype=np.float32)
for i in range(L):
    p = f"blk.{i}."
    t(p + "attn_norm.weight", E, dtype=np.float32)
    t(p + "ffn_norm.weight", E, dtype=np.float32)
    t(p + "attn_q.weight", E, E)
    t(p + "attn_k.weight", KV * E // H, E)
    t(p + "attn_v.weight", KV * E // H, E)
    t(p + "attn_output.weight", E, E)
    t(p + "ffn_gate.weight", FF, E)
    t(p + "ffn_up.weight", FF, E)
    t(p + "ffn_down.weight", E, FF)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
