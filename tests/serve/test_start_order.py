"""serve_start checks what the client gave before it looks for vLLM: an unknown model or a bad served name was
answered with "vLLM is not installed", sending the user to install an engine for a call that could not work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.bundled import smollm2_gguf
from gpubox.settings import Settings
from tests.conftest import call_err

pytestmark = pytest.mark.anyio


def bare(tmp_path: Path) -> Settings:
    """No vLLM here: this test's interpreter is the engine's."""
    return Settings.load(state_dir=tmp_path / "s", allowed_roots=[tmp_path], serve_python=Path(sys.executable))


async def test_an_unknown_model_is_told_before_a_missing_vllm(tmp_path: Path) -> None:
    mcp = build_server(bare(tmp_path))
    try:
        async with Client(mcp) as c:
            unknown = await call_err(c, "serve_start", model="no-such-model-xyz")
    finally:
        state_of(mcp).close()
    assert "no-such-model-xyz" in unknown and "vLLM" not in unknown, unknown


async def test_a_bad_served_name_is_told_before_a_missing_vllm(tmp_path: Path) -> None:
    if smollm2_gguf() is None:
        pytest.skip("needs the bundled SmolLM2 GGUF (gpubox[models]) as a model serve_start knows")
    mcp = build_server(bare(tmp_path))
    try:
        async with Client(mcp) as c:
            bad_name = await call_err(c, "serve_start", model="smollm2-135m-instruct", name="-bad name")
            missing = await call_err(c, "serve_start", model="smollm2-135m-instruct")
    finally:
        state_of(mcp).close()
    assert "served name '-bad name'" in bad_name and "vLLM" not in bad_name, bad_name
    assert "vLLM is not installed" in missing, missing  # this interpreter has no vLLM: the check still runs
