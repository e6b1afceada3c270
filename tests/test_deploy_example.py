"""The rented-box deploy recipe: its unit starts a command gpubox accepts, with settings gpubox accepts."""

from __future__ import annotations

import configparser
import shlex
import subprocess
from pathlib import Path

from gpubox.cli import build_parser
from gpubox.settings import Settings

from .conftest import ROOT

DEPLOY = ROOT / "examples" / "deploy"


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    unit.read(DEPLOY / "gpubox.service")
    return unit


def test_systemd_unit_serves_http_on_loopback_with_a_token_file() -> None:
    unit = _unit()
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    argv = shlex.split(unit["Service"]["ExecStart"].replace("%h", "/home/u"))
    assert argv[0].endswith("/.venv/bin/gpubox")
    ns = build_parser().parse_args(argv[1:])
    assert ns.command == "serve" and ns.transport == "http"
    assert ns.host == "127.0.0.1" and ns.token_file and ns.token is None
    assert unit["Service"]["Restart"] == "on-failure"


def test_deploy_config_is_valid_settings_with_a_dry_run_idle_guard(tmp_path: Path) -> None:
    settings = Settings.load(DEPLOY / "gpubox.toml", state_dir=tmp_path)
    assert settings.hourly_usd == 1.10 and settings.budget_usd == 26.40
    assert settings.idle_shutdown_minutes == 30 and settings.idle_dry_run is True
    assert settings.idle_command == "sudo shutdown -h now"


def test_tunnel_script_is_valid_bash_and_needs_a_host() -> None:
    script = DEPLOY / "tunnel.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "usage" in out.stderr
