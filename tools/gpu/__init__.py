"""GPU monitoring family: NVML telemetry (nvml.py), host facts (host.py); MCP registration in adapter.py."""
