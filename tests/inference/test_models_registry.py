"""infer_models caches metadata per file (mtime, size); bad files and paths give clear errors, never tracebacks."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.bundled import smollm2_gguf
from gpubox.errors import PathNotAllowedError
from gpubox.settings import Settings
from gpubox.tools.inference import registry
from gpubox.tools.inference.adapter import manager
from tests.conftest import call_err, call_ok, requires_hf

# each test builds a server that lists real model files, whose GGUF headers the gguf package (the hf extra) reads
pytestmark = [pytest.mark.anyio, pytest.mark.slow, requires_hf]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("needs the bundled SmolLM2 GGUF (gpubox[models])")
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(gguf, models / "copy.gguf")
    mcp = build_server(Settings.load(state_dir=tmp_path / "state", model_dirs=[models], allowed_roots=[models]))
    yield mcp, models
    state_of(mcp).close()


async def listed(client: Client) -> dict[str, dict[str, Any]]:
    """infer_models' entries by name."""
    return {m["name"]: m for m in (await call_ok(client, "infer_models"))["models"]}


async def test_a_repeated_listing_reads_no_header_and_a_changed_file_is_read_again(
    env: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Path] = []
    real = registry.read_gguf

    def counting(path: Path) -> Any:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(registry, "read_gguf", counting)
    mcp, models = env
    async with Client(mcp) as client:
        first = await listed(client)
        n = len(reads)
        assert n >= 2 and first["copy"]["params"] > 1e8  # the bundled model and the copy
        again = await listed(client)
        assert len(reads) == n and again["copy"]["params"] == first["copy"]["params"]
        st = (models / "copy.gguf").stat()
        os.utime(models / "copy.gguf", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        await listed(client)
    assert reads[n:] == [models / "copy.gguf"]


async def test_a_broken_config_json_is_listed_with_the_problem_and_refused_by_name(env: tuple[Any, Path]) -> None:
    mcp, models = env
    broken = models / "broken-hf"
    broken.mkdir()
    (broken / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], ')
    (broken / "model.safetensors").write_bytes(b"\0" * 16)
    async with Client(mcp) as client:
        entry = (await listed(client))["broken-hf"]
        assert entry["format"] == "hf" and "config.json" in entry["problem"] and "JSON" in entry["problem"]
        text = await call_err(client, "infer_load", name="broken-hf")
    assert str(broken / "config.json") in text and "not valid JSON" in text


async def test_a_file_that_is_not_a_gguf_is_listed_with_the_problem_and_refused(
    env: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    mcp, models = env
    (models / "fake.gguf").write_text("this is not a model\n" * 10)
    async with Client(mcp) as client:
        entry = (await listed(client))["fake"]
        assert entry["problem"] and "fake.gguf" in entry["problem"] and entry["params"] is None
        reads: list[Path] = []
        read = registry.read_gguf
        monkeypatch.setattr(registry, "read_gguf", lambda path: reads.append(path) or read(path))
        assert (await listed(client))["fake"]["problem"] == entry["problem"]
        assert models / "fake.gguf" not in reads  # a broken file is not read again until it changes
        text = await call_err(client, "infer_load", name="fake")
    assert "fake.gguf" in text and "not a GGUF file" in text


async def test_a_name_with_a_nul_byte_is_an_input_error(env: tuple[Any, Path]) -> None:
    async with Client(env[0]) as client:
        text = await call_err(client, "infer_load", name="copy\x00.gguf")
        assert "NUL byte" in text
        text = await call_err(client, "infer_chat", model="a\x00b", messages=[{"role": "user", "content": "hi"}])
        assert "NUL byte" in text


async def test_symlinks_that_leave_the_roots_are_not_listed_or_loaded_and_the_target_is_not_revealed(
    env: tuple[Any, Path], tmp_path: Path
) -> None:
    mcp, models = env
    outside = tmp_path / "secret-place"
    outside.mkdir()
    shutil.copy(models / "copy.gguf", outside / "hidden.gguf")
    (models / "escape.gguf").symlink_to(outside / "hidden.gguf")
    (models / "dangling.gguf").symlink_to(outside / "does-not-exist.gguf")
    async with Client(mcp) as client:
        names = await listed(client)
        assert "escape" not in names and "dangling" not in names
        for name in ("escape", "dangling"):
            text = await call_err(client, "infer_load", name=name)
            assert "secret-place" not in text and "hidden" not in text and "does-not-exist" not in text


def test_a_file_swapped_for_a_symlink_after_listing_is_refused_at_open_time(
    env: tuple[Any, Path], tmp_path: Path
) -> None:
    mcp, models = env
    mgr = manager(state_of(mcp))
    outside = tmp_path / "secret-place"
    outside.mkdir()
    shutil.copy(models / "copy.gguf", outside / "hidden.gguf")
    d = mgr.find("copy")  # listed while it was a plain file
    (models / "copy.gguf").unlink()
    (models / "copy.gguf").symlink_to(outside / "hidden.gguf")
    with pytest.raises(PathNotAllowedError) as err:
        mgr._check_files(d, None)  # what load runs right before handing the path to a backend
    assert "secret-place" not in str(err.value) and "hidden" not in str(err.value)


async def test_the_manager_plans_from_the_cached_header(env: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    mgr = manager(state_of(env[0]))
    mgr.list()
    monkeypatch.setattr(registry, "read_gguf", lambda path: pytest.fail(f"re-read {path}"))
    d = mgr.find("copy")
    from gpubox.tools.inference.planning import plan

    p = plan(mgr.settings, mgr.meta, d, "llama.cpp", 512, None, "f16")
    assert p.context_length == 512 and p.backend == "llama.cpp"


async def test_a_context_beyond_the_models_is_capped_and_the_plan_says_so(env: tuple[Any, Path]) -> None:
    mgr = manager(state_of(env[0]))
    from gpubox.tools.inference.planning import plan

    p = plan(mgr.settings, mgr.meta, mgr.find("copy"), "llama.cpp", 1_000_000, None, "f16")
    assert p.context_length == 8192 and "context_length 1000000 capped to the model's maximum, 8192" in p.reason
    assert "capped" not in plan(mgr.settings, mgr.meta, mgr.find("copy"), "llama.cpp", 512, None, "f16").reason
