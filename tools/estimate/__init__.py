"""Estimate family: catalogs, inference/training estimates, calibrations; MCP registration in adapter.py."""
