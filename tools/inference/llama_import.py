"""Import llama-cpp-python so that its libraries find the C++ runtime the process already holds.

A CUDA build of llama-cpp-python made on an H200 box (bench/results/gpu_h200_20261127/llama_libstdcxx.md) loaded
and ran a model in a fresh interpreter, but ended the process with SIGSEGV in its tokenizer set-up (`init_tokenizer`,
inside `llama_model_load_from_file`, also with no layer offloaded) whenever numpy had been imported first: so
also after torch, gguf or anything else that imports numpy, and in gpubox's server. That build's libllama.so does
not list libstdc++ among the libraries it needs (`readelf -d`), and numpy's C++ extension had loaded libstdc++
privately (`RTLD_LOCAL`, as Python loads every extension). Loading libstdc++ into the global scope before
llama_cpp's libraries load made every such order work on that box: numpy, torch with CUDA in use, the MCP server's
in-process load, and torch imported after llama.cpp (which aborted with `free(): invalid pointer` before).
Every import of llama_cpp in gpubox's server process goes through `llama_cpp()` below (or `share_cxx_runtime()`
first); the grammar check's child (grammar_probe) does the same in its own script.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from types import ModuleType

log = logging.getLogger(__name__)

LIBSTDCXX = "libstdc++.so.6"


@functools.cache
def share_cxx_runtime() -> bool:
    """Put libstdc++ in the process's global symbol scope (Linux with glibc's libstdc++); True when it is there."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        # dlopen with RTLD_GLOBAL promotes a copy already loaded privately instead of loading a second one
        ctypes.CDLL(LIBSTDCXX, mode=os.RTLD_GLOBAL)
    except OSError as exc:  # no libstdc++ under that name: llama.cpp then loads its own as it always did
        log.debug("libstdc++ not shared globally: %s", exc)
        return False
    return True


def llama_cpp() -> ModuleType:
    """The llama_cpp package, imported after `share_cxx_runtime()`."""
    share_cxx_runtime()
    import llama_cpp

    return llama_cpp
