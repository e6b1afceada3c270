"""Load a GGUF once in a child process set up like this one, before a GPU build of llama.cpp loads it here.

On an H200 box (bench/results/gpu_h200/) a CUDA build of llama-cpp-python loaded and ran a model alone, but ended
the process with SIGSEGV when torch had been imported first, and `infer_load` ended the server the same way. So on
a GPU build (a CUDA, Vulkan, Metal or ROCm ggml library beside llama.cpp's), each model is first loaded in a short
child that imports what this process has (torch, ...) and loads through the same code with one layer offloaded
and a small context; a crash there costs one clear error, not the server. A model that passed is not probed again
in this process. CPU builds are not probed: nothing of this kind was seen there.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from gpubox.errors import ConfigError

PROBE_TIMEOUT_S = 300.0
# native libraries this process may hold that the child loads first, as the server did
FIRST = ("torch", "onnxruntime", "faiss", "sentence_transformers", "transformers")
GPU_LIBS = ("ggml-cuda", "ggml-vulkan", "ggml-metal", "ggml-hip")

_CHILD = r"""
import json, sys
from pathlib import Path
a = json.loads(sys.argv[1])
for name in a["first"]:
    __import__(name)
if a["torch_cuda"]:
    import torch
    torch.cuda.init()
from gpubox.tools.inference.backends import LlamaBackend
lora = Path(a["lora"]) if a["lora"] else None
LlamaBackend(Path(a["path"]), a["n_ctx"], a["n_gpu_layers"], a["kv"], a["threads"], lora, probe=False).close()
"""

_passed: set[tuple[str, tuple[str, ...]]] = set()
_lock = threading.Lock()


@functools.cache
def gpu_build() -> bool:
    """Whether the installed llama-cpp-python ships a GPU ggml library (read from its files: nothing is loaded)."""
    spec = importlib.util.find_spec("llama_cpp")
    roots = list(spec.submodule_search_locations or []) if spec else []
    names = [p.name for root in roots for p in Path(root).rglob("*ggml*") if p.is_file()]
    return any(lib in n for n in names for lib in GPU_LIBS)


def check(path: Path, n_ctx: int, n_gpu_layers: int, kv: str, threads: int | None, lora: Path | None) -> None:
    """Raise ConfigError if loading `path` ends a child process set up like this one; no-op on CPU builds."""
    first = tuple(m for m in FIRST if m in sys.modules)
    key = (str(path), first)
    with _lock:
        if key in _passed:
            return
    if not gpu_build():
        return
    torch = sys.modules.get("torch")
    args = {
        "first": first,
        "torch_cuda": bool(torch is not None and getattr(torch.cuda, "is_initialized", lambda: False)()),
        "path": str(path),
        "n_ctx": min(n_ctx, 512),
        "n_gpu_layers": min(n_gpu_layers, 1) if n_gpu_layers >= 0 else 1,
        "kv": kv,
        "threads": threads,
        "lora": str(lora) if lora else None,
    }
    _run_child(args, path, first)
    with _lock:
        _passed.add(key)


def _run_child(args: dict[str, object], path: Path, first: tuple[str, ...]) -> bool:
    """True when the child loaded the model; False when it refused it with an exception (the real load reports
    that with its reason); ConfigError when a signal ended it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, timeout=PROBE_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"loading {path} did not finish within {PROBE_TIMEOUT_S:.0f} s in a test process; not loaded here"
        ) from None
    if proc.returncode >= 0:
        return proc.returncode == 0
    sig = -proc.returncode
    name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
    with_first = f" after importing {', '.join(first)}" if first else ""
    raise ConfigError(
        f"loading {path} with this GPU build of llama-cpp-python crashed a process set up like this server "
        f"({name}{with_first}); it was not loaded here, so the server is unaffected. Two sets of CUDA libraries in "
        "one process (llama.cpp's and torch's) did this on an H200 box: load it with backend='transformers', or "
        "build llama-cpp-python against the CUDA that torch uses, or run GGUF models in a server where nothing "
        "has imported torch (bench/llama_cuda_bisect.py names the setting that crashes)"
    )
