"""Query embeddings on ONNX Runtime: the sentence-transformers model's transformer and mean pooling exported once to
an ONNX file, then run by ONNX Runtime for every query on a CPU.

A query is a dozen tokens, so its forward pass is ~40 small matrix products whose cost in eager PyTorch is mostly
per-operator dispatch and weight reads; ONNX Runtime fuses the graph (attention, GELU, layer norm) and keeps its
weights prepacked. bench/results/search.md, MiniLM-L6 on this project's 2-core CPU: 12 ms a query vs 24 ms in
PyTorch fp32 (16 ms bf16), cosine to sentence-transformers' own vector 1.0000. Documents are still embedded in
PyTorch (bf16 on AMX/AVX512-BF16 CPUs), where batches keep the matrix units busy.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger("gpubox.search")

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# one thread, measured against two beside the lexical leg in bench/results/search.md
THREADS = 1
_EXPORTED: dict[str, Path] = {}  # file name (model + versions key) -> where this process last wrote it
PROBE = "parse the configuration file and report the line of each error"


def available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))


def _cache_key(model_dir: Path) -> str:
    """Same model files, torch and transformers -> same export; anything else exports afresh."""
    import torch
    import transformers

    h = hashlib.sha256(f"v1 torch={torch.__version__} transformers={transformers.__version__}".encode())
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


class OnnxQueryEncoder:
    """Mean-pooled (unnormalised) embeddings of single texts; built by `load`, which checks it against PyTorch."""

    def __init__(self, session: Any, tokenizer: Any, max_length: int, input_names: list[str]) -> None:
        self.session = session
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.input_names = input_names

    def encode(self, text: str) -> Any:
        import numpy as np

        enc = self.tokenizer([text], truncation=True, max_length=self.max_length, return_tensors="np")
        feeds = {k: np.asarray(enc[k], dtype=np.int64) for k in self.input_names}
        return self.session.run(None, feeds)[0][0]


def load(st_model: Any, model_dir: Path, cache_dir: Path, reference: Any) -> OnnxQueryEncoder | None:
    """The ONNX query encoder for this sentence-transformers model (exported to `cache_dir` on first use), or None
    when the export or its check fails: then queries stay on PyTorch. `reference(text)` is PyTorch's mean-pooled
    vector for the check."""
    import numpy as np
    import onnxruntime as ort

    transformer = st_model[0]
    path = cache_dir / f"{model_dir.name}-{_cache_key(model_dir)}.onnx"
    try:
        if not path.is_file():
            earlier = _EXPORTED.get(path.name)
            if earlier is not None and earlier.is_file():  # another state dir in this process: copy, don't export
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(earlier, path)
            else:
                _export(transformer.auto_model, st_model.tokenizer, path)
        _EXPORTED[path.name] = path
        opts = ort.SessionOptions()
        # one thread, and no spinning: the server shares the CPU with the lexical leg, indexing and other clients
        opts.intra_op_num_threads = THREADS
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        encoder = OnnxQueryEncoder(session, st_model.tokenizer, st_model.max_seq_length, names)
        got, want = encoder.encode(PROBE), np.asarray(reference(PROBE), dtype=np.float32)
        cos = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
        if cos < 0.99:  # bf16 vs fp32 moves it by ~1e-3; a broken export lands far lower
            log.warning("ONNX query encoder disagrees with PyTorch (cosine %.4f); queries stay on PyTorch", cos)
            return None
        return encoder
    except Exception as e:  # an export a model's code does not support: the PyTorch path still works
        log.warning("ONNX export of %s failed (%s: %s); queries stay on PyTorch", model_dir, type(e).__name__, e)
        path.unlink(missing_ok=True)  # a corrupt cached file is exported afresh by the next start
        _EXPORTED.pop(path.name, None)
        return None
