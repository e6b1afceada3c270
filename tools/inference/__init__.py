"""Inference family: registry, backends, manager, service; MCP registration in adapter.py."""
