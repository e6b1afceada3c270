"""Load a GGUF once in a child process set up like this one, before a GPU build of llama.cpp loads it here.

On H200 and H100 boxes (bench/results/gpu_h200/, gpu_h100/) a CUDA build of llama-cpp-python loaded and ran a
model alone, but ended the process with SIGSEGV when torch had been imported first, and `infer_load` ended the
server the same way (on the H100, also with nothing but gpubox imported). GPU builds now run each model in a
process of its own (llama_process); with infer_llama_process='never', on a GPU build (a CUDA, HIP, Vulkan, Metal,
SYCL or MUSA ggml library in the package), a model is first loaded in a short child that imports what this process
has (torch, ..., in the same order), loads through the same code with at most one layer offloaded and a small
context, and decodes two tokens; a crash there costs one clear error, not the server. A load that passed is not
probed again in this process with the same settings. Not covered: torch imported after a model is loaded here.
CPU builds are not probed: nothing of this kind was seen there.
The crash's cause was found later (llama_import: libstdc++ loaded privately by numpy first) and is fixed before
every llama_cpp import; the probe stays as the guard against a native fault of a kind not yet seen.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from gpubox.child import import_path
from gpubox.errors import ConfigError

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 300.0
# native libraries this process may hold that the child loads first, as the server did
FIRST = frozenset({"torch", "onnxruntime", "faiss", "sentence_transformers", "transformers"})
GPU_LIBS = ("ggml-cuda", "ggml-hip", "ggml-vulkan", "ggml-metal", "ggml-sycl", "ggml-musa")
SHARED = (".so", ".dylib", ".dll")
LOADED, SETUP_FAILED = "gpubox-probe: loaded", 3

_CHILD = r"""
import json, os, sys
from pathlib import Path
a = json.loads(sys.argv[1])
try:
    for name in a["first"]:
        __import__(name)
    if a["torch_cuda"]:
        import torch
        torch.cuda.init()
    from gpubox.tools.inference.backends import LlamaBackend
except BaseException as exc:
    print(f"setup: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(3)
lora = Path(a["lora"]) if a["lora"] else None
b = LlamaBackend(Path(a["path"]), a["n_ctx"], a["n_gpu_layers"], a["kv"], a["threads"], lora, probe=False)
b.llm.create_completion("Hello", max_tokens=2)  # the first decode: where cuBLAS handles and kernels start
b.close()
print("gpubox-probe: loaded", flush=True)
os._exit(0)  # loaded and decoded: a fault while the interpreter tears down is not this load's
"""

_passed: set[tuple[object, ...]] = set()
_lock = threading.Lock()


@functools.cache
def gpu_build() -> bool:
    """Whether the installed llama-cpp-python ships a GPU ggml library (read from its files: nothing is loaded)."""
    spec = importlib.util.find_spec("llama_cpp")
    roots = list(spec.submodule_search_locations or []) if spec else []
    names = [p.name for root in roots for p in Path(root).rglob("*ggml*") if _shared_library(p.name)]
    return any(lib in n for n in names for lib in GPU_LIBS)


def _shared_library(name: str) -> bool:
    return name.endswith(SHARED) or ".so." in name  # libggml-cuda.so, .so.0, .dylib, .dll; not a header


def _torch_cuda_started() -> bool:
    cuda = getattr(sys.modules.get("torch"), "cuda", None)  # None too while another thread is importing torch
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:  # a half-imported torch: treat its CUDA as not started
        return False


def check(path: Path, n_ctx: int, n_gpu_layers: int, kv: str, threads: int | None, lora: Path | None) -> None:
    """Raise ConfigError if loading `path` ends a child process set up like this one; no-op on CPU builds."""
    if not gpu_build():
        return
    first = tuple(m for m in list(sys.modules) if m in FIRST)  # sys.modules keeps import order
    args = {
        "first": first,
        "torch_cuda": _torch_cuda_started(),
        "path": str(path),
        "n_ctx": min(n_ctx, 512),
        "n_gpu_layers": min(n_gpu_layers, 1) if n_gpu_layers >= 0 else 1,
        "kv": kv,
        "threads": threads,
        "lora": str(lora) if lora else None,
    }
    key = (args["path"], first, args["torch_cuda"], args["n_gpu_layers"], kv, args["lora"])
    with _lock:
        if key in _passed:
            return
    if _run_child(args, path, first):
        with _lock:
            _passed.add(key)


def verdict(path: Path, first: tuple[str, ...]) -> str:
    """For `gpubox doctor`: whether a GPU build loads `path` (one layer offloaded) after importing `first`."""
    args = {"first": first, "torch_cuda": False, "path": str(path), "n_ctx": 256, "n_gpu_layers": 1, "kv": "f16",
            "threads": None, "lora": None}  # fmt: skip
    try:
        return "ok" if _run_child(args, path, first) else "could not tell (the child failed; see the log)"
    except ConfigError as exc:
        return f"crashed: {exc}"


def _run_child(args: dict[str, object], path: Path, first: tuple[str, ...]) -> bool:
    """True when the child loaded and decoded; False when it could not tell (it refused the model with an
    exception, which the real load reports with its reason, or its setup failed: logged); ConfigError when a
    signal ended it."""
    env = {**os.environ, "PYTHONPATH": import_path()}
    try:  # -P: no working-directory module may shadow what the child imports
        proc = subprocess.run(
            [sys.executable, "-P", "-c", _CHILD, json.dumps(args)],
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"loading {path} in a child process (a check that a GPU build of llama.cpp does not crash this server) "
            f"did not finish within {PROBE_TIMEOUT_S:.0f} s; the model was not loaded. Retry, or load it with "
            "n_gpu_layers=0 to see whether the GPU is the cause"
        ) from None
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    if LOADED in out:
        return True
    if proc.returncode >= 0:
        tail = err.strip().splitlines()[-1:] or ["no output"]
        what = "could not start" if proc.returncode == SETUP_FAILED else "refused the model"
        log.warning("llama.cpp load check for %s %s (exit %d): %s", path, what, proc.returncode, tail[0][:300])
        return False
    raise ConfigError(_crash_message(path, -proc.returncode, first, err))


def _crash_message(path: Path, sig: int, first: tuple[str, ...], stderr: str) -> str:
    name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
    last = [ln.strip() for ln in stderr.splitlines() if ln.strip()][-1:]
    said = f"; it printed: {last[0][:200]}" if last else ""
    head = (
        f"loading {path} with this GPU build of llama-cpp-python crashed a child process set up like this server "
        f"({name}{' after importing ' + ', '.join(first) if first else ''}{said}); it was not loaded here, so the "
        "server is unaffected."
    )
    if "torch" in first:
        return head + (
            " A CUDA build of llama.cpp in a process that had imported torch did this on H200 and H100 boxes, also "
            "with no layer offloaded: leave infer_llama_process at 'auto' (each model in "
            "a process of its own), or load it with backend='transformers' (needs gpubox[hf]; dequantises the GGUF, "
            "so it takes more memory)"
        )
    return head + " Try n_gpu_layers=0, or another build of llama-cpp-python for this GPU and driver"
