"""Error channels and state ownership, through the in-memory Client (server/registry.py, server/app.py)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
from mcp import Client, MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS

from gpubox.app import build_server, state_of
from gpubox.errors import BusyError
from gpubox.registry import gpubox_resource
from gpubox.settings import Settings
from tests.conftest import call_err, call_ok, requires_models, requires_search

pytestmark = pytest.mark.anyio


def _break_the_gpu_catalog(settings: Settings) -> None:
    catalog = settings.state_dir / "catalog"
    catalog.mkdir(parents=True)
    (catalog / "gpus.json").write_text("{not json")


def test_a_server_owns_its_state_and_both_are_freed_together(settings: Settings) -> None:
    mcp = build_server(settings)
    state = weakref.ref(state_of(mcp))
    state_of(mcp).close()
    del mcp
    gc.collect()
    assert state() is None, "something outside the server keeps its AppState alive"


async def test_an_unknown_calibration_kind_is_an_invalid_params_error_naming_the_valid_kinds(client: Client) -> None:
    with pytest.raises(MCPError) as err:
        await client.read_resource("estimate://calibrations/trainig")
    assert err.value.code == INVALID_PARAMS
    assert "unknown calibration kind 'trainig'" in err.value.message and "training" in err.value.message


async def test_a_configuration_error_in_a_tool_is_a_protocol_error_with_the_fix(settings: Settings) -> None:
    _break_the_gpu_catalog(settings)
    mcp = build_server(settings)
    try:
        for mode in ("auto", "legacy"):
            async with Client(mcp, mode=mode) as client:  # type: ignore[arg-type]
                with pytest.raises(MCPError) as err:
                    await client.call_tool("estimate_gpus", {})
            assert err.value.code == INTERNAL_ERROR
            assert "gpus.json is not valid JSON" in err.value.message and "fix or remove it" in err.value.message
    finally:
        state_of(mcp).close()


async def test_a_configuration_error_in_a_resource_is_a_protocol_error_with_the_fix(settings: Settings) -> None:
    _break_the_gpu_catalog(settings)
    mcp = build_server(settings)
    try:
        async with Client(mcp) as client:
            with pytest.raises(MCPError) as err:
                await client.read_resource("estimate://gpus")
        assert err.value.code == INTERNAL_ERROR and "gpus.json is not valid JSON" in err.value.message
        assert err.value.data == {"error": "ConfigError"}
    finally:
        state_of(mcp).close()


async def test_an_input_error_in_a_tool_stays_a_tool_error_the_model_can_read(client: Client) -> None:
    assert "unknown model 'no-such-model-zz'" in await call_err(client, "estimate_inference", model="no-such-model-zz")


async def test_other_gpubox_errors_in_a_resource_keep_their_message_and_crashes_stay_masked(
    settings: Settings,
) -> None:
    mcp = build_server(settings)

    @gpubox_resource(mcp, "test://busy/{what}")
    async def busy(what: str) -> str:
        raise BusyError(f"{what} is busy; retry when the fine-tune finishes")

    @gpubox_resource(mcp, "test://crash")
    def crash() -> str:
        raise RuntimeError("internal detail /etc/shadow")

    try:
        async with Client(mcp) as client:
            with pytest.raises(MCPError) as err:
                await client.read_resource("test://busy/gpu0")
            assert err.value.code == INTERNAL_ERROR and "gpu0 is busy; retry" in err.value.message
            with pytest.raises(MCPError) as err:
                await client.read_resource("test://crash")
            assert "/etc/shadow" not in err.value.message
    finally:
        state_of(mcp).close()


@requires_search
@requires_models
@pytest.mark.slow
async def test_reading_an_unknown_index_names_it_and_the_indexes_that_exist(settings: Settings, tmp_path: Path) -> None:
    repo = settings.allowed_roots[0]
    (repo / "hello.py").write_text("def hello():\n    return 'hi'\n")
    mcp = build_server(settings.model_copy(update={"search_index_wait_seconds": 300.0}))
    try:
        async with Client(mcp) as client:
            await call_ok(client, "search_index", path=str(repo), name="tiny")
            with pytest.raises(MCPError) as err:
                await client.read_resource("search://indexes/tin")
        assert err.value.code == INVALID_PARAMS
        assert "unknown index 'tin'" in err.value.message and "tiny" in err.value.message
        assert "Error creating resource" not in err.value.message
    finally:
        state_of(mcp).close()
