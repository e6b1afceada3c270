"""A GPU build of llama.cpp loads each model in a child process set up like the server first: a crash there is a
ConfigError naming what the child imported, and the server lives on (an H200 box segfaulted on the real load)."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path
from typing import Any

import pytest

from gpubox.bundled import smollm2_gguf
from gpubox.errors import ConfigError
from gpubox.tools.inference import load_probe
from tests.conftest import skip_without


def gguf() -> Path:
    path = smollm2_gguf()
    assert path is not None
    return path


def args(first: tuple[str, ...], path: Path | None = None) -> dict[str, object]:
    return {"first": first, "torch_cuda": False, "path": str(path or gguf()), "n_ctx": 256, "n_gpu_layers": 0,
            "kv": "f16", "threads": 1, "lora": None}  # fmt: skip


@pytest.mark.parametrize(
    ("files", "gpu"),
    [
        (["libggml-cuda.so", "libggml-base.so", "libllama.so"], True),  # a CUDA wheel's lib/ folder
        (["libggml-vulkan.so.0.25.3"], True),
        (["libggml-metal.dylib"], True),
        (["libggml-cpu.so", "libggml-base.so.0", "libllama.so"], False),  # a CPU build, as on this box
        (["ggml-cuda.h", "libggml-cpu.so"], False),  # a header is no GPU library
    ],
)
def test_a_gpu_build_is_told_from_the_packages_library_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: list[str], gpu: bool
) -> None:
    (tmp_path / "lib").mkdir()
    for name in files:
        (tmp_path / "lib" / name).write_bytes(b"")
    spec = importlib.machinery.ModuleSpec("llama_cpp", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(load_probe.importlib.util, "find_spec", lambda name: spec)
    load_probe.gpu_build.cache_clear()
    try:
        assert load_probe.gpu_build() is gpu
    finally:
        load_probe.gpu_build.cache_clear()


def test_the_child_loads_and_decodes_through_the_servers_code_after_what_the_server_imported() -> None:
    skip_without("hf")  # the child imports torch first, as a server that ran search or a transformers model has it
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
    assert "n_gpu_layers=0" in text  # not torch: no advice about torch's CUDA libraries
    assert "backend='transformers'" not in text


def test_a_child_that_cannot_tell_is_not_remembered_and_a_pass_holds_only_for_its_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load_probe, "gpu_build", lambda: True)  # as a CUDA build's files would say
    monkeypatch.setattr(load_probe, "_passed", set())
    ran: list[dict[str, Any]] = []
    real = load_probe._run_child
    monkeypatch.setattr(load_probe, "_run_child", lambda a, p, f: ran.append(a) or real(a, p, f))
    missing = tmp_path / "missing.gguf"
    for _ in range(2):  # the child refuses a missing file: no verdict, so it is asked again next time
        load_probe.check(missing, 512, -1, "f16", 1, None)
    assert len(ran) == 2 and not load_probe._passed
    load_probe.check(gguf(), 512, 0, "f16", 1, None)
    load_probe.check(gguf(), 512, 0, "f16", 1, None)  # passed with these settings: not probed again
    load_probe.check(gguf(), 512, -1, "f16", 1, None)  # offloaded this time: probed again, with one layer
    assert len(ran) == 4 and ran[2]["n_gpu_layers"] == 0 and ran[3]["n_gpu_layers"] == 1
    assert len(load_probe._passed) == 2


def test_the_backend_probes_before_it_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpubox.tools.inference.backends import LlamaBackend

    monkeypatch.setattr(load_probe, "gpu_build", lambda: True)
    monkeypatch.setattr(load_probe, "_passed", set())
    LlamaBackend(gguf(), 256, 0, "f16", 1).close()
    assert [k[0] for k in load_probe._passed] == [str(gguf())]


def test_doctor_reports_whether_a_gpu_build_loads_after_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_without("hf")
    from gpubox.doctor import _llama

    monkeypatch.setattr(load_probe, "gpu_build", lambda: True)  # as a CUDA build's files would say
    assert _llama()["load_after_torch"] == "ok"
    (tmp_path / "native_crash.py").write_text("import ctypes\nctypes.string_at(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_probe.verdict(gguf(), ("native_crash",)).startswith("crashed: loading")
