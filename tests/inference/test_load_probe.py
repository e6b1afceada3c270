"""A GPU build of llama.cpp loads each model in a child process set up like the server first: a crash there is a
ConfigError naming what the child imported, and the server lives on (an H200 box segfaulted on the real load)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpubox.bundled import smollm2_gguf
from gpubox.errors import ConfigError
from gpubox.tools.inference import load_probe


def gguf() -> Path:
    path = smollm2_gguf()
    assert path is not None
    return path


def args(first: tuple[str, ...]) -> dict[str, object]:
    return {"first": first, "torch_cuda": False, "path": str(gguf()), "n_ctx": 256, "n_gpu_layers": 0,
            "kv": "f16", "threads": 1, "lora": None}  # fmt: skip


def test_this_cpu_build_is_not_probed_and_its_files_say_so() -> None:
    lib = Path(sys.modules["llama_cpp"].__file__ or "").parent if "llama_cpp" in sys.modules else None
    assert load_probe.gpu_build() is False, lib
    load_probe.check(Path("/nonexistent.gguf"), 512, -1, "f16", 1, None)  # a CPU build loads in-process, unprobed


def test_the_child_loads_the_model_through_the_servers_own_code_after_what_the_server_imported() -> None:
    # torch first, as a server that ran search or a transformers model has it: a real load, no crash on a CPU
    assert load_probe._run_child(args(("torch",)), gguf(), ("torch",)) is True


def test_a_crash_in_the_child_is_an_error_naming_what_it_imported_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a native crash of the kind the H200 showed: a module whose import dereferences a null pointer
    (tmp_path / "native_crash.py").write_text("import ctypes\nctypes.string_at(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        load_probe._run_child(args(("native_crash",)), gguf(), ("native_crash",))
    text = str(err.value)
    assert "SIGSEGV after importing native_crash" in text and "the server is unaffected" in text
    assert "backend='transformers'" in text


def test_a_gpu_build_probes_a_model_once_before_the_backend_loads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpubox.tools.inference.backends import LlamaBackend

    monkeypatch.setattr(load_probe, "gpu_build", lambda: True)  # as a CUDA build's files would say
    monkeypatch.setattr(load_probe, "_passed", set())
    ran: list[tuple[str, ...]] = []
    real = load_probe._run_child
    monkeypatch.setattr(load_probe, "_run_child", lambda a, p, f: ran.append(f) or real(a, p, f))
    for _ in range(2):
        LlamaBackend(gguf(), 256, 0, "f16", 1).close()
    assert len(ran) == 1 and (str(gguf()), ran[0]) in load_probe._passed  # the second load was not probed again
