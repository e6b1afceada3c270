"""The protocol as a real third-party client sees it: MCP Inspector's CLI against `gpubox serve` over stdio, and
over streamable HTTP and SSE with a bearer token.

Skips when npx is missing or the Inspector package cannot be fetched from the npm registry."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import GPUBOX, child_env, running_http_server

pytestmark = pytest.mark.slow
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


def _inspect(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, Any, str]:
    """(exit code, JSON result, stderr). Inspector passes the server only the variables given with -e, as
    hosts such as Claude Desktop do, so the state dir goes there too."""
    server_env = {"GPUBOX_STATE_DIR": str(tmp_path / "state"), "HF_HUB_OFFLINE": "1", **(env or {})}
    flags = [f for k, v in server_env.items() for f in ("-e", f"{k}={v}")]
    return _inspector(tmp_path, *flags, GPUBOX, "serve", *args)


def _inspector(tmp_path: Path, *args: str) -> tuple[int, Any, str]:
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("npx (Node.js) is not installed; MCP Inspector runs on it")
    out = subprocess.run(
        [npx, "-y", INSPECTOR, "--cli", *args],
        env=child_env(tmp_path) | {"npm_config_update_notifier": "false"},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    if out.returncode != 0 and any(e in out.stderr for e in ("ENOTFOUND", "E404", "ETIMEDOUT", "EAI_AGAIN")):
        pytest.skip(f"MCP Inspector could not be fetched from npm: {out.stderr.strip()[-200:]}")
    return out.returncode, json.loads(out.stdout) if out.stdout.strip() else None, out.stderr


def test_inspector_lists_every_family_and_reads_the_session_meter(tmp_path: Path) -> None:
    rc, listed, err = _inspect(tmp_path, "--method", "tools/list")
    assert rc == 0, err[-2000:]
    tools = {t["name"]: t for t in listed["tools"]}
    for name in ("gpu_status", "estimate_training", "search_code", "infer_chat", "finetune_launch", "bench_device"):
        assert name in tools
        assert "outputSchema" in tools[name] and tools[name]["annotations"]
    rc, read, err = _inspect(
        tmp_path, "--method", "resources/read", "--uri", "box://session", env={"GPUBOX_HOURLY_USD": "2.5"}
    )
    assert rc == 0, err[-2000:]
    session = json.loads(read["contents"][0]["text"])
    assert session["usd_per_hour"] == 2.5 and session["price_source"] == "setting hourly_usd"


def test_inspector_sees_an_actionable_tool_error_for_an_ambiguous_gpu(tmp_path: Path) -> None:
    rc, _, err = _inspect(
        tmp_path,
        "--method",
        "tools/call",
        "--tool-name",
        "estimate_inference",
        "--tool-arg",
        "model=Llama-3-8B",
        "--tool-arg",
        "gpu=A100",
    )
    # Inspector 2.x exits 5 on a tool result with isError and prints the tool's message to stderr
    assert rc == 5, err[-2000:]
    assert "tool_is_error" in err and "ambiguous" in err and "A100-80GB-SXM" in err
    assert "Traceback" not in err


def test_inspector_passes_a_folded_parameter_inside_more_and_sees_a_misspelt_one_refused(tmp_path: Path) -> None:
    common = ["--method", "tools/call", "--tool-name", "estimate_training", "--tool-arg", "model=Llama-3.1-8B"]
    rc, out, err = _inspect(tmp_path, *common, "--tool-arg", "gpu=A10", "--tool-arg", 'more={"optim": "sgd"}')
    assert rc == 0, err[-2000:]
    assert out["structuredContent"]["optimizer"] == "sgd"
    rc, out, err = _inspect(tmp_path, *common, "--tool-arg", "gpu=A10", "--tool-arg", "optimm=sgd")
    text = out["content"][0]["text"] if out else err
    assert rc == 5 and "unknown argument 'optimm'. Did you mean: optim?" in text, err[-2000:]


@pytest.mark.parametrize(("transport", "path"), [("http", "/mcp"), ("sse", "/sse")])
def test_inspector_over_the_network_needs_the_token_and_then_runs_tools(
    tmp_path: Path, transport: str, path: str
) -> None:
    with running_http_server(tmp_path) as (base, token, _, _):
        target = ["--server-url", base + path, "--transport", transport]
        call = ["--method", "tools/call", "--tool-name", "gpu_status"]
        rc, _, err = _inspector(tmp_path, *target, *call)
        assert rc != 0 and "auth_required" in err, err[-2000:]  # the 401 made it ask for a login
        rc, out, err = _inspector(tmp_path, *target, "--header", f"Authorization: Bearer {token}", *call)
        assert rc == 0, err[-2000:]
        assert not out.get("isError") and "gpus" in out["structuredContent"]
