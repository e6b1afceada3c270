"""Configuration loading."""

from __future__ import annotations

import os
from dataclasses import dataclass


class ConfigError(Exception):
    """Raised when the configuration file is missing a key or has a bad value."""


@dataclass
class Config:
    database_url: str
    cache_size: int = 128
    debug: bool = False


def load_config(path: str) -> Config:
    """Read KEY=VALUE lines from a file; environment variables override the file."""
    values: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            values[key.strip().lower()] = value.strip()
    for key in ("database_url", "cache_size", "debug"):
        env = os.environ.get("INVENTORY_" + key.upper())
        if env is not None:
            values[key] = env
    if "database_url" not in values:
        raise ConfigError("database_url is required")
    return Config(
        database_url=values["database_url"],
        cache_size=int(values.get("cache_size", 128)),
        debug=values.get("debug", "false").lower() in ("1", "true", "yes"),
    )
