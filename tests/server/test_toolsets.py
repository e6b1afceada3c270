"""Toolsets: a server exposes only the chosen families (and single tools); resources and prompts follow."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from mcp import Client

from gpubox.app import build_server, state_of
from gpubox.errors import ConfigError
from gpubox.settings import Settings
from tests.conftest import GPUBOX, child_env

pytestmark = pytest.mark.anyio


async def listing(settings: Settings) -> tuple[set[str], set[str], set[str]]:
    mcp = build_server(settings)
    try:
        async with Client(mcp) as c:
            tools = {t.name for t in (await c.list_tools()).tools}
            uris = {str(r.uri) for r in (await c.list_resources()).resources}
            uris |= {str(r.uri_template) for r in (await c.list_resource_templates()).resource_templates}
            prompts = {p.name for p in (await c.list_prompts()).prompts}
    finally:
        state_of(mcp).close()
    return tools, uris, prompts


async def test_families_and_single_tools_choose_what_is_exposed(tmp_path: Path) -> None:
    everything, all_uris, all_prompts = await listing(Settings.load(state_dir=tmp_path / "a"))
    tools, uris, prompts = await listing(Settings.load(state_dir=tmp_path / "b", tools="gpu,estimate,infer_chat"))
    assert tools == {t for t in everything if t.startswith(("gpu_", "estimate_"))} | {"infer_chat"}
    assert len(tools) < len(everything)
    # gpubox://tools/{name} (a tool's full schema) serves whatever tools are exposed
    assert all(u.startswith(("gpu://", "box://", "estimate://", "models://", "gpubox://tools/")) for u in uris), uris
    assert any(u.startswith("search://") for u in all_uris) and not any(u.startswith("search://") for u in uris)
    assert prompts == {"gpu_health_check", "session_report"} and prompts < all_prompts  # the gpu family's prompts


def test_an_unknown_family_or_tool_is_a_config_error_naming_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown gpus, infer_chatt; use families"):
        build_server(Settings.load(state_dir=tmp_path, tools="gpus,infer_chatt"))


def test_the_cli_flag_and_client_config_carry_the_toolset(tmp_path: Path) -> None:
    env = child_env(tmp_path)
    out = subprocess.run(
        [GPUBOX, "client-config", "claude-desktop", "--tools", "gpu,search"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert '"GPUBOX_TOOLS": "gpu,search"' in out.stdout
