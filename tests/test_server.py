from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import Context

from gpubox.app import build_server, state_of
from gpubox.errors import ConfigError, UnknownNameError
from gpubox.registry import app_state
from gpubox.settings import Settings

from .conftest import GPUBOX, ROOT, child_env, requires_models

pytestmark = pytest.mark.anyio
CONTRACT = ROOT / "tests" / "contract" / "tools.json"


async def _full_schema(client: Client, tool: str) -> Any:
    """Every parameter, those tools/list folds into `more` included (they are public too)."""
    contents = (await client.read_resource(f"gpubox://tools/{tool}")).contents
    return json.loads(contents[0].text)  # type: ignore[union-attr]


async def _contract(client: Client) -> dict[str, Any]:
    tools = (await client.list_tools()).tools
    return {
        t.name: {
            "annotations": t.annotations.model_dump(by_alias=True, exclude_none=True) if t.annotations else None,
            "input_schema": t.input_schema,
            "all_parameters": await _full_schema(client, t.name),
            "output_schema": t.output_schema,
        }
        for t in sorted(tools, key=lambda t: t.name)
    }


async def test_public_tool_list_matches_the_pinned_contract(server: object) -> None:
    async with Client(server, mode="legacy") as client:  # type: ignore[arg-type]
        current = await _contract(client)
    if os.environ.get("GPUBOX_UPDATE_CONTRACT") == "1":
        CONTRACT.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    pinned = json.loads(CONTRACT.read_text())
    assert sorted(current) == sorted(pinned), "tool names changed; rerun with GPUBOX_UPDATE_CONTRACT=1 if deliberate"
    for name in pinned:
        assert current[name] == pinned[name], f"contract of {name} drifted; GPUBOX_UPDATE_CONTRACT=1 to accept"


async def test_every_tool_has_annotations_a_description_and_an_output_schema(client: Client) -> None:
    for tool in (await client.list_tools()).tools:
        assert tool.annotations is not None, tool.name
        assert tool.annotations.read_only_hint is not None, tool.name
        assert tool.description and len(tool.description) > 30, tool.name
        assert tool.output_schema is not None, tool.name


async def test_prompt_and_resource_lists_are_served(client: Client) -> None:
    prompts = {p.name for p in (await client.list_prompts()).prompts}
    assert "gpu_health_check" in prompts
    rendered = await client.get_prompt("gpu_health_check", {"workload": "QLoRA on Mistral-7B"})
    text = rendered.messages[0].content.text  # type: ignore[union-attr]
    assert "gpu_status" in text and "QLoRA on Mistral-7B" in text
    uris = {str(r.uri) for r in (await client.list_resources()).resources}
    assert "gpu://status" in uris


async def test_unknown_tool_is_an_error_result_not_a_crash(client: Client) -> None:
    result = await client.call_tool("no_such_tool", {})
    assert result.is_error


def test_importing_gpubox_and_listing_tools_loads_no_heavy_library() -> None:
    code = (
        "import sys, anyio\n"
        "from mcp import Client\n"
        "import gpubox\n"
        "from gpubox.app import build_server\n"
        "from gpubox.settings import Settings\n"
        "async def main():\n"
        "    async with Client(build_server(Settings.load(state_dir='/tmp/gpubox-import-test'))) as c:\n"
        "        await c.list_tools(); await c.list_resources(); await c.list_prompts()\n"
        "anyio.run(main)\n"
        "heavy = [m for m in ('torch', 'transformers', 'faiss', 'llama_cpp', 'sentence_transformers') "
        "if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_settings_read_env_prefix_and_split_path_lists(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv("GPUBOX_ALLOWED_ROOTS", f"{a}{os.pathsep}{b}")
    monkeypatch.setenv("GPUBOX_PORT", "9100")
    s = Settings.load()
    assert s.allowed_roots == [a.resolve(), b.resolve()]
    assert s.port == 9100


def test_settings_toml_file_is_read_and_overrides_win(tmp_path: Path) -> None:
    cfg = tmp_path / "gpubox.toml"
    cfg.write_text(f'state_dir = "{tmp_path / "s"}"\nport = 9001\nlog_level = "DEBUG"\n')
    s = Settings.load(cfg, port=9002)
    assert s.state_dir == tmp_path / "s" and s.log_level == "DEBUG" and s.port == 9002


def test_settings_reject_out_of_range_and_unknown_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="port"):
        Settings.load(port=70000)
    cfg = tmp_path / "bad.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(ValueError, match="prot"):
        Settings.load(cfg)
    with pytest.raises(ConfigError, match="not found"):
        Settings.load(tmp_path / "missing.toml")


def test_token_comes_from_the_token_file(tmp_path: Path) -> None:
    f = tmp_path / "tok"
    f.write_text("s3cret\nignored\n")
    assert Settings.load(token_file=f).resolved_token() == "s3cret"


def test_unknown_name_error_suggests_close_matches() -> None:
    err = UnknownNameError("GPU", "H10O", ["H100-SXM", "H100-PCIe", "A100-80GB-SXM"])
    assert "Did you mean" in str(err) and "H100-SXM" in str(err)


async def test_one_state_object_is_shared_by_every_client_connection(settings: Settings) -> None:
    mcp = build_server(settings)

    @mcp.tool(name="state_id")
    def state_id(ctx: Context) -> int:  # type: ignore[type-arg]
        return id(app_state(ctx))

    ids = []
    for _ in range(2):
        async with Client(mcp) as c:
            ids.append((await c.call_tool("state_id", {})).structured_content)
    assert ids[0] == ids[1] == {"result": id(state_of(mcp))}


def test_cli_call_prints_structured_json(tmp_path: Path) -> None:
    out = subprocess.run(
        [GPUBOX, "call", "gpu_status"], env=child_env(tmp_path), capture_output=True, text=True, check=True
    )
    data = json.loads(out.stdout)
    assert "available" in data and "host" in data


def test_cli_call_with_an_unknown_tool_names_the_valid_ones(tmp_path: Path) -> None:
    out = subprocess.run([GPUBOX, "call", "gpu_stat"], env=child_env(tmp_path), capture_output=True, text=True)
    assert out.returncode == 2
    assert "gpu_status" in out.stderr


@requires_models
def test_cli_doctor_reports_extras_models_and_state_dir(tmp_path: Path) -> None:
    out = subprocess.run(
        [GPUBOX, "doctor", "--json"], env=child_env(tmp_path), capture_output=True, text=True, check=True
    )
    rep = json.loads(out.stdout)
    assert {e["name"] for e in rep["extras"]} >= {"gpu", "llama", "hf", "train", "search", "models"}
    assert rep["state_dir"] == str(tmp_path / "state")
    assert rep["bundled_models"]["smollm2_gguf"].endswith(".gguf")
    assert "available" in rep["nvml"]


@pytest.mark.parametrize("target", ["claude-desktop", "cursor", "vscode", "remote"])
def test_cli_client_config_prints_valid_json_with_absolute_command(tmp_path: Path, target: str) -> None:
    out = subprocess.run(
        [GPUBOX, "client-config", target], env=child_env(tmp_path), capture_output=True, text=True, check=True
    )
    cfg = json.loads(out.stdout)
    servers = cfg.get("mcpServers") or cfg["servers"]
    entry = servers["gpubox"]
    if target == "remote":
        assert entry["url"].endswith("/mcp")
        assert "ssh -N -L" in out.stderr
    else:
        assert Path(entry["command"]).is_absolute() and Path(entry["command"]).exists()
        assert entry["env"]["GPUBOX_STATE_DIR"] == str(tmp_path / "state")
        # passed on only when the installing shell sets it: a default of "0" hid every other GPU of the box
        assert ("CUDA_VISIBLE_DEVICES" in entry["env"]) == ("CUDA_VISIBLE_DEVICES" in child_env(tmp_path))


def test_cli_call_reports_a_configuration_error_with_exit_2_not_a_traceback(tmp_path: Path) -> None:
    catalog = tmp_path / "state" / "catalog"
    catalog.mkdir(parents=True)
    (catalog / "gpus.json").write_text("{not json")
    out = subprocess.run([GPUBOX, "call", "estimate_gpus"], env=child_env(tmp_path), capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("gpubox: configuration error:") and "gpus.json is not valid JSON" in out.stderr
    assert "Traceback" not in out.stderr
