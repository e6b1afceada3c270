"""llama_cpp's libraries load with libstdc++ in the global scope, whatever loaded libstdc++ privately first.

On an H200 box a CUDA build of llama.cpp segfaulted at load whenever numpy (torch, gguf, the server) had been
imported first, and loaded everywhere once libstdc++ was global (bench/results/gpu_h200_20261127/). The
crash needs that build, so these tests check the condition that prevented it, in a fresh interpreter each.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's dynamic loader scopes")

# libstdc++ loaded privately first (as numpy's C++ extension loads it), then llama_cpp imported through gpubox;
# a finder ahead of the real ones records whether libstdc++'s symbols were global when llama_cpp's import began
SCRIPT = r"""
import ctypes, json, sys
ctypes.CDLL("libstdc++.so.6")  # RTLD_LOCAL, like any extension module's dependencies
def is_global():
    return hasattr(ctypes.CDLL(None), "__once_proxy")  # dlsym on the global scope
seen = {"before": is_global(), "at_import": None}
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "llama_cpp":
            seen["at_import"] = is_global()
        return None
sys.meta_path.insert(0, Watch())
from gpubox.tools.inference.llama_import import llama_cpp
try:
    llama_cpp()
except ImportError:  # a core-only install: what matters is the scope when the import began
    pass
print(json.dumps(seen))
"""


def run(script: str) -> dict[str, bool | None]:
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_libstdcxx_is_global_before_llama_cpp_starts_loading() -> None:
    seen = run(SCRIPT)
    if seen["before"]:
        pytest.skip("this interpreter already holds libstdc++ globally: nothing to show")
    assert seen["at_import"] is True


def test_a_grammar_converter_import_shares_it_too() -> None:
    script = SCRIPT.replace(
        "from gpubox.tools.inference.llama_import import llama_cpp\n",
        "from gpubox.tools.inference.grammar import _converter_class as llama_cpp\n",
    )
    seen = run(script)
    if seen["before"]:
        pytest.skip("this interpreter already holds libstdc++ globally: nothing to show")
    assert seen["at_import"] is True
