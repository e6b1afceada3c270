"""ONNX Runtime writes nothing outside the state dir: its telemetry cache (~/.cache/Microsoft/DeveloperTools/
.onnxruntime, a device id and an event database in onnxruntime 1.30) stays off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# the real query path in a fresh process (onnxruntime reads the setting once, at import): the model loads, the
# query encoder is exported, checked and run
QUERY = """
import sys
from pathlib import Path
from gpubox.bundled import minilm_dir
from gpubox.tools.search.embedder import Embedder
e = Embedder(minilm_dir(), dtype="float32", onnx_cache=Path(sys.argv[1]), onnx_int8=False)
e.encode_query("exponential backoff retry")
assert e._onnx is not None, "queries did not run on ONNX Runtime"
"""


@pytest.mark.slow  # needs onnxruntime and onnx: the folder's requires_search checks them without importing them
def test_onnx_query_path_leaves_nothing_under_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME")}
    env.update({"HOME": str(home), "HF_HUB_OFFLINE": "1"})
    cache = tmp_path / "state" / "onnx"
    done = subprocess.run(
        [sys.executable, "-c", QUERY, str(cache)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(cache.glob("*.onnx")), "the export belongs in the state dir"
    assert not (home / ".cache" / "Microsoft").exists(), sorted(str(p) for p in home.rglob("*"))
