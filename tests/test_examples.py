from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import GPUBOX, ROOT, child_env

pytestmark = pytest.mark.slow
EXAMPLES = ROOT / "examples"


def test_stdio_client_example_lists_tools_and_reads_gpu_status(tmp_path: Path) -> None:
    env = child_env(tmp_path)
    env["PATH"] = str(Path(GPUBOX).parent) + ":" + env.get("PATH", "")
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "stdio_client.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "gpu_status" in out.stdout.splitlines()[0]
    assert '"available"' in out.stdout


def test_remote_http_client_example_calls_the_server_with_a_token(tmp_path: Path, http_server: tuple[str, str]) -> None:
    base, token = http_server
    env = child_env(tmp_path, GPUBOX_URL=f"{base}/mcp", GPUBOX_TOKEN=token)
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "remote_http_client.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["host"]["cpu_count_logical"] >= 1


def test_claude_desktop_example_has_the_shape_client_config_prints(tmp_path: Path) -> None:
    example = json.loads((EXAMPLES / "claude_desktop_config.json").read_text())
    printed = json.loads(
        subprocess.run(
            [GPUBOX, "client-config", "claude-desktop"],
            env=child_env(tmp_path),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    ex, pr = example["mcpServers"]["gpubox"], printed["mcpServers"]["gpubox"]
    assert set(ex) == set(pr) and ex["args"] == pr["args"]
    assert set(ex["env"]) <= set(pr["env"])
