"""How a list setting given as one string (an env var, a TOML string) becomes a list.

Paths split on os.pathsep only, names (hosts, origins, tools) on commas only; either may be a JSON list.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

_IPV6_FIRST = re.compile(r"\[[0-9A-Fa-f:.%]*\](:(\d+|\*))?\s*(,|$)")


def _json_list(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{what} starts with '[' but is not a valid JSON list ({exc})") from None


def split_paths(value: Any, what: str, blank_ok: bool = True) -> Any:
    """A JSON list, or a string separated by os.pathsep only: a comma is a legal character in a directory
    name, so splitting on it would turn '/x/proj,v2' into '/x/proj' plus a relative 'v2' the user never allowed."""
    if not isinstance(value, str):
        return _no_blank(value, what)
    text = value.strip()
    if text.startswith("["):
        return _no_blank(_json_list(text, what), what)
    parts = [p.strip() for p in text.split(os.pathsep) if p.strip()]
    if not parts and not blank_ok:  # '' or ':': no roots at all is no default, every path would be refused
        raise ValueError(f"{what} is set but names no directory; unset it for the default")
    for part in parts:
        # Older configs separated paths with commas; refuse such an entry rather than guess which it meant.
        if "," in part and not Path(part).expanduser().exists():
            raise ValueError(
                f"{what} entry '{part}' does not exist; separate paths with '{os.pathsep}' or give a JSON list "
                '(e.g. ["/a", "/b"]), not commas'
            )
    return parts


def _no_blank(items: Any, what: str) -> Any:
    """A list of paths with an empty entry is refused: Path('') is the working directory, which the server's
    client chose (often / or $HOME), not the user."""
    if isinstance(items, list | tuple) and any(isinstance(x, str) and not x.strip() for x in items):
        raise ValueError(
            f"{what} has an empty entry, which would mean the server's working directory; remove it or write the "
            "directory out"
        )
    return items


def split_names(value: Any, what: str) -> Any:
    """A JSON list, or a string separated by commas only: hosts and origins carry ':' ('gpu-box.internal:*',
    'https://gpu-box.internal'), so os.pathsep must not split them."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("[") and not _IPV6_FIRST.match(text):  # '[::1]:*' is a host, not a JSON list
        return _json_list(text, what)
    return [p.strip() for p in text.split(",") if p.strip()]


def check_hosts(hosts: Any, what: str) -> Any:
    """Each entry a host, optionally ':port' or ':*'. Older configs separated hosts with ':' ('gpu-box:gpu-box.lan'),
    which now reads as one host whose "port" is a name: refused with the fix rather than kept as an entry that
    matches no request."""
    if not isinstance(hosts, list):
        return hosts
    for host in hosts:
        text = str(host)
        if text.startswith("[") and text.endswith("]"):  # a bare IPv6 literal
            continue
        _, sep, port = text.rpartition(":")
        if sep and not text.endswith("]") and port != "*" and not port.isdigit():
            raise ValueError(
                f"{what} entry '{text}' is not a host, host:port or host:*; separate hosts with ',' or give a JSON "
                'list (e.g. ["gpu-box", "gpu-box.lan:*"]), not \':\''
            )
    return hosts
