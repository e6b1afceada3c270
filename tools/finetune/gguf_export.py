"""GGUF export of a merged model whose base came from a GGUF file, with the `gguf` package alone.

The `gguf` package (gguf-py) can write GGUF files but does not ship llama.cpp's convert_hf_to_gguf.py, which
knows how to turn every HF tokenizer into GGUF vocabulary fields. When the base was itself a GGUF (the bundled
SmolLM2 is), that work is already done: the source file holds the tokenizer, chat template and hyper-parameters,
and merging LoRA changes only weight values. So the export copies every metadata field of the source, and writes
each of its tensors again from the merged weights, found through gguf's HF -> GGUF tensor-name map.

llama.cpp's converter stores the q/k projections of the `llama` architecture permuted for its rope layout
(convert_hf_to_gguf.py, LlamaModel.permute); transformers undoes that when it loads such a GGUF
(modeling_gguf_pytorch_utils.LlamaTensorProcessor), so the merged HF weights are unpermuted and the permutation
is applied again here. Architectures whose GGUF tensors transformers rewrites in other ways are refused: their
round trip is not an identity we can check here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # numpy and gguf come with the export's extras; the server imports this module on core installs
    import gguf
    import numpy as np

from gpubox.errors import InvalidInputError

OutType = Literal["f16", "f32", "q8_0"]
# transformers' GGUF loader rewrites these architectures' tensors beyond a rename (its TENSOR_PROCESSORS table,
# transformers 5.23); only llama's rewrite (the rope permutation) is undone here
REWRITTEN_ARCHS = {
    "qwen2moe", "qwen3moe", "gpt_oss", "bloom", "t5", "t5encoder", "gpt2", "mamba", "nemotron", "gemma2",
    "gemma3", "lfm2", "minimax-m2",
}  # fmt: skip
CONVERTER_HINT = (
    "convert the merged HF folder with llama.cpp's converter: python convert_hf_to_gguf.py <folder> --outtype f16 "
    "(https://github.com/ggml-org/llama.cpp, script at the repository root)"
)


def permute_for_rope(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: the inverse of transformers' _reverse_permute_weights."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def source_arch(source: Path) -> str:
    import gguf

    reader = gguf.GGUFReader(str(source))
    field = reader.fields.get("general.architecture")
    return str(field.contents()) if field is not None else ""


def check_exportable(source: Path) -> str:
    """The source GGUF's architecture, or InvalidInputError when this route cannot export it."""
    arch = source_arch(source)
    if not arch or arch in REWRITTEN_ARCHS:
        raise InvalidInputError(
            f"GGUF export from the base's own GGUF supports architectures stored as plain renames (llama, "
            f"mistral, qwen2, qwen3, phi3, ...), not '{arch or 'unknown'}'; {CONVERTER_HINT}"
        )
    return arch


def write_gguf(
    source: Path,
    weights: Mapping[str, Any],
    out: Path,
    outtype: OutType = "f16",
    name: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Write `out` with the metadata and tensor layout of `source` and the values of `weights` (HF names ->
    torch tensors or arrays). Returns counts for the result. Raises InvalidInputError on any mismatch, before
    anything is written."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = check_exportable(source)
    arch_enum = next((a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), None)
    if arch_enum is None:
        raise InvalidInputError(f"the gguf package does not know the architecture '{arch}'; {CONVERTER_HINT}")

    def kv(key: str) -> Any:
        f = reader.fields.get(f"{arch}.{key}")
        return None if f is None else f.contents()

    tmap = gguf.get_tensor_name_map(arch_enum, int(kv("block_count") or 0))
    wanted = {t.name: tuple(int(x) for x in reversed(t.shape)) for t in reader.tensors}
    source_of = _match_tensors(weights, tmap, wanted)
    heads = (kv("attention.head_count"), kv("attention.head_count_kv"))
    order = [t.name for t in reader.tensors]
    writer = gguf.GGUFWriter(str(out), arch=arch, endianess=reader.endianess)
    _copy_metadata(reader, writer, outtype, name)
    # tensor infos first, then one tensor at a time: a 7B model never sits in memory twice
    counts = _add_tensor_infos(writer, [(g, wanted[g]) for g in order], outtype)
    log(f"writing {len(order)} tensors ({counts}) to {out.name}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for gname in order:
        arr = _gguf_values(weights[source_of[gname]], gname, arch, heads)
        _write_tensor(writer, arr, _qtype(wanted[gname], outtype))
    writer.close()
    return {"architecture": arch, "tensors": len(order), "tensor_types": counts}


def _match_tensors(
    weights: Mapping[str, Any], tmap: gguf.TensorNameMap, wanted: dict[str, tuple[int, ...]]
) -> dict[str, str]:
    """GGUF tensor name -> the HF weight that fills it. Every tensor of the source needs one of the same shape."""
    source_of: dict[str, str] = {}
    for hf_name, value in weights.items():
        gname = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gname is None or gname not in wanted:
            continue  # e.g. lm_head tied to the embeddings: the source has no output.weight either
        if tuple(value.shape) != wanted[gname]:
            raise InvalidInputError(
                f"merged tensor {hf_name} has shape {tuple(value.shape)}, the base GGUF's {gname} has "
                f"{wanted[gname]}; the merged model does not match this GGUF. {CONVERTER_HINT}"
            )
        source_of[gname] = hf_name
    missing = [n for n in wanted if n not in source_of]
    if missing:
        raise InvalidInputError(
            f"no merged weight maps to {len(missing)} tensor(s) of the base GGUF (first: {missing[:3]}); "
            f"{CONVERTER_HINT}"
        )
    return source_of


def _gguf_values(value: Any, gname: str, arch: str, heads: tuple[Any, Any]) -> np.ndarray:
    """A merged weight as the float32 array GGUF stores: llama's q/k projections permuted back for llama.cpp's
    rope layout (module docstring). `heads`: the source's (head_count, head_count_kv)."""
    import numpy as np

    n_head, n_head_kv = heads
    arr = value.detach().float().cpu().numpy() if hasattr(value, "detach") else np.asarray(value, np.float32)
    if arch == "llama" and gname.endswith("attn_q.weight"):
        arr = permute_for_rope(arr, int(n_head), int(n_head))
    elif arch == "llama" and gname.endswith("attn_k.weight"):
        arr = permute_for_rope(arr, int(n_head), int(n_head_kv or n_head))
    return arr


def _qtype(shape: tuple[int, ...], outtype: OutType) -> gguf.GGMLQuantizationType:
    import gguf

    # llama.cpp keeps 1-D tensors (norms, biases) in f32 whatever the file type, as its converter does
    if len(shape) < 2 or outtype == "f32":
        return gguf.GGMLQuantizationType.F32
    if outtype == "q8_0" and shape[-1] % 32 == 0:
        return gguf.GGMLQuantizationType.Q8_0
    return gguf.GGMLQuantizationType.F16  # f16, or a q8_0 row that is not whole 32-value blocks


def _copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, outtype: OutType, name: str | None) -> None:
    """Every key-value field of the source (tokenizer, chat template, hyper-parameters), with the file type set
    by `outtype` and general.name by `name` when given."""
    import gguf

    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue  # the writer adds the header and the architecture; the file type follows outtype
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = name if key == "general.name" and name else field.contents()
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}.get(
        outtype, gguf.LlamaFileType.MOSTLY_Q8_0
    )
    writer.add_file_type(int(ftype))


def _add_tensor_infos(
    writer: gguf.GGUFWriter, tensors: list[tuple[str, tuple[int, ...]]], outtype: OutType
) -> dict[str, int]:
    """Declare each (name, shape) in its stored type; returns how many tensors each type has."""
    import gguf
    import numpy as np

    counts: dict[str, int] = {}
    for gname, shape in tensors:
        qtype = _qtype(shape, outtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
        if qtype == gguf.GGMLQuantizationType.Q8_0:
            byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
            writer.add_tensor_info(gname, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
        else:
            dt = np.dtype(np.float16 if qtype == gguf.GGMLQuantizationType.F16 else np.float32)
            writer.add_tensor_info(gname, shape, dt, int(np.prod(shape)) * dt.itemsize)
    return counts


def _write_tensor(writer: gguf.GGUFWriter, arr: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
    import gguf
    import numpy as np

    if qtype == gguf.GGMLQuantizationType.Q8_0:
        writer.write_tensor_data(gguf.quants.quantize(arr, qtype))
    else:
        writer.write_tensor_data(arr.astype(np.float16 if qtype == gguf.GGMLQuantizationType.F16 else np.float32))
