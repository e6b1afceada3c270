"""Inventory service package."""

__version__ = "1.2.0"
