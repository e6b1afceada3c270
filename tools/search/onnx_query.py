"""Query embeddings on ONNX Runtime: the sentence-transformers model's transformer and mean pooling exported once to
an ONNX file, then run by ONNX Runtime for every query on a CPU.

A query is a dozen tokens, so its forward pass is ~40 small matrix products whose cost in eager PyTorch is mostly
per-operator dispatch and weight reads; ONNX Runtime fuses the graph (attention, GELU, layer norm) and keeps its
weights prepacked. bench/results/search.md, MiniLM-L6 on this project's 2-core CPU: 12 ms a query vs 24 ms in
PyTorch fp32 (16 ms bf16), cosine to sentence-transformers' own vector 1.0000. Documents are still embedded in
PyTorch (bf16 on AMX/AVX512-BF16 CPUs), where batches keep the matrix units busy.

A query's pass reads every weight once, so an 8-bit copy of the export (weights in blocks of 32, int8 compute) is
faster again where the CPU has int8 dot products: 5.8 vs 8.4 ms, cosine to fp32 >= 0.9996, and the same recall on
the 112 labelled queries. It is made once beside the fp32 file, and used only when it passes both checks at load.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("gpubox.search")

# ONNX Runtime (1.30 on Linux) starts its telemetry when imported: a device id and an event database under
# ~/.cache/Microsoft/DeveloperTools/.onnxruntime, outside the state dir, and HTTPS uploads. A server keeps its files
# in its state dir and sends nothing home; the variable is read once, when onnxruntime is first imported, and in
# gpubox that import is below. An operator's explicit setting is kept.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# one thread, measured against two beside the lexical leg in bench/results/search.md
THREADS = 1
_EXPORTED: dict[str, Path] = {}  # file name (model + versions key) -> where this process last wrote it
PROBE = "parse the configuration file and report the line of each error"
# the 8-bit encoder must match fp32 on all of these: prose, identifiers, and a long mixed text
CHECKS = (
    PROBE,
    "verify_password refresh_token HTTPException",
    'def read_config(path: str) -> dict:\n    """Load settings, environment variables override the file."""' * 4,
)
INT8_MIN_COSINE = 0.999  # measured 0.9996-0.9999 on 40 real queries; bf16 vs fp32 is ~0.998


def available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))


def _cache_key(model_dir: Path, variant: str = "") -> str:
    """Same model files (and adapter), torch and transformers -> same export; anything else exports afresh."""
    import torch
    import transformers

    key = f"v1 torch={torch.__version__} transformers={transformers.__version__}"
    h = hashlib.sha256((key + (f" adapter={variant}" if variant else "")).encode())  # plain keys as before
    for f in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(model_dir)} {st.st_size} {st.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


def _export(auto_model: Any, tokenizer: Any, dest: Path) -> None:
    import torch

    class MeanPooled(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1)

    import copy

    model = copy.deepcopy(auto_model).float().eval()  # the documents' copy may be bf16; the export is fp32
    example = tokenizer([PROBE], return_tensors="pt")
    axes = {k: {0: "batch", 1: "tokens"} for k in INPUTS}
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        # the TorchScript exporter is deprecated in favour of torch.export's (which needs onnxscript) and traces
        # with TracerWarnings about shape-dependent Python branches; the check in load() is what vouches for it
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                MeanPooled(model),
                tuple(example[k] for k in INPUTS),
                tmp,
                input_names=list(INPUTS),
                output_names=["embedding"],
                dynamic_axes={**axes, "embedding": {0: "batch"}},
                opset_version=17,
                dynamo=False,  # the TorchScript exporter: no onnxscript needed, and BERT-style graphs export as is
            )
        os.replace(tmp, dest)  # atomic: a concurrent or killed export never leaves a half-written file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _materialise(path: Path, make: Callable[[], None]) -> None:
    """Make `path` unless it exists; a file this process already made for another state dir is copied instead."""
    if not path.is_file():
        earlier = _EXPORTED.get(path.name)
        if earlier is not None and earlier != path and earlier.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
            os.close(fd)
            try:
                shutil.copyfile(earlier, tmp)
                os.replace(tmp, path)  # atomic, as the export: another server never reads half a file
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        else:
            make()
    _EXPORTED[path.name] = path


def _quantize(src: Path, dest: Path) -> None:
    """8-bit weights in blocks of 32 for every MatMul (ONNX Runtime's MatMulNBits), int8 compute (accuracy level 4).

    A query's forward pass reads every weight once, so its time follows the bytes read: 8-bit blocks read ~4x fewer
    than fp32. Blocks of 32 (one scale each) keep the vectors at cosine >= 0.9996 to fp32's on real queries, where
    per-channel int8 (one scale per output row) lands at 0.98 and loses retrieval quality (bench/results/search.md).
    """
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, accuracy_level=4, bits=8)
    quiet = logging.getLogger("onnxruntime.quantization")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # it logs every node it skips at INFO
    try:
        q = MatMulNBitsQuantizer(
            onnx.load(str(src)), bits=8, block_size=32, is_symmetric=True, accuracy_level=4, algo_config=config
        )
        q.process()
        fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".onnx.tmp")
        os.close(fd)
        try:
            quantized: Any = q.model  # an ONNXModel wrapper on this (default, weight-only) path
            quantized.save_model_to_file(tmp, use_external_data_format=False)
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    finally:
        quiet.setLevel(level)


def _session(path: Path) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    # one thread, and no spinning: the server shares the CPU with the lexical leg, indexing and other clients
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


class OnnxQueryEncoder:
    """Mean-pooled (unnormalised) embeddings of single texts; built by `load`, which checks it against PyTorch."""

    def __init__(self, session: Any, tokenizer: Any, max_length: int, precision: str = "float32") -> None:
        self.session = session
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.input_names = [i.name for i in session.get_inputs()]
        self.precision = precision  # "float32", or "int8" for 8-bit weight blocks

    def encode(self, text: str) -> Any:
        import numpy as np

        enc = self.tokenizer([text], truncation=True, max_length=self.max_length, return_tensors="np")
        feeds = {k: np.asarray(enc[k], dtype=np.int64) for k in self.input_names}
        return self.session.run(None, feeds)[0][0]


def _cosine(a: Any, b: Any) -> float:
    import numpy as np

    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _seconds(encoder: OnnxQueryEncoder, rounds: int = 5) -> float:
    import time

    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        encoder.encode(PROBE)
        best = min(best, time.perf_counter() - t)
    return best


def _int8(path: Path, fp32: OnnxQueryEncoder) -> OnnxQueryEncoder | None:
    """The 8-bit encoder when it agrees with fp32 on every check text and is faster on this CPU, else None."""
    import importlib.util

    if importlib.util.find_spec("onnx_ir") is None:  # what ONNX Runtime's weight quantiser imports
        log.info("onnx-ir is not installed: query embeddings stay fp32")
        return None
    qpath = path.with_name(f"{path.stem}-q8b32.onnx")
    try:
        _materialise(qpath, lambda: _quantize(path, qpath))
        q8 = OnnxQueryEncoder(_session(qpath), fp32.tokenizer, fp32.max_length, "int8")
        worst = min(_cosine(q8.encode(t), fp32.encode(t)) for t in CHECKS)
        if worst < INT8_MIN_COSINE:
            log.warning("8-bit query encoder disagrees with fp32 (cosine %.4f); queries stay fp32", worst)
            return None
        # without int8 dot-product instructions ONNX Runtime dequantises every block: slower than fp32
        t8, t32 = _seconds(q8), _seconds(fp32)
        if t8 >= 0.9 * t32:
            log.info("8-bit query encoder is not faster here (%.1f vs %.1f ms): queries stay fp32", t8 * 1e3, t32 * 1e3)
            return None
        return q8
    except Exception as e:
        log.warning("8-bit query encoder failed (%s: %s); queries stay fp32", type(e).__name__, e)
        qpath.unlink(missing_ok=True)
        _EXPORTED.pop(qpath.name, None)
        return None


def load(
    st_model: Any, model_dir: Path, cache_dir: Path, reference: Any, int8: bool = True, variant: str = ""
) -> OnnxQueryEncoder | None:
    """The ONNX query encoder for this sentence-transformers model (exported to `cache_dir` on first use), or None
    when the export or its check fails: then queries stay on PyTorch. `reference(text)` is PyTorch's mean-pooled
    vector for the check. With `int8`, the 8-bit copy when it passes its own checks (see _int8). `variant` names
    weights merged into the model after loading (the code adapter's digest): part of the cache key."""
    import numpy as np

    transformer = st_model[0]
    path = cache_dir / f"{model_dir.name}-{_cache_key(model_dir, variant)}.onnx"
    try:
        _materialise(path, lambda: _export(transformer.auto_model, st_model.tokenizer, path))
        encoder = OnnxQueryEncoder(_session(path), st_model.tokenizer, st_model.max_seq_length)
        cos = _cosine(encoder.encode(PROBE), np.asarray(reference(PROBE), dtype=np.float32))
        if cos < 0.99:  # bf16 vs fp32 moves it by ~1e-3; a broken export lands far lower
            log.warning("ONNX query encoder disagrees with PyTorch (cosine %.4f); queries stay on PyTorch", cos)
            return None
    except Exception as e:  # an export a model's code does not support: the PyTorch path still works
        log.warning("ONNX export of %s failed (%s: %s); queries stay on PyTorch", model_dir, type(e).__name__, e)
        path.unlink(missing_ok=True)  # a corrupt cached file is exported afresh by the next start
        _EXPORTED.pop(path.name, None)
        return None
    return (_int8(path, encoder) if int8 else None) or encoder
