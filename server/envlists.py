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


def check_hosts(hosts: Any, what: str, *, origin: bool = False) -> Any:
    """Each entry a host, optionally ':port' or ':*' (an origin: scheme://host[:port|:*], no path). Older configs
    separated hosts with ':' ('gpu-box:gpu-box.lan'), which now reads as one host whose "port" is a name: refused
    with the fix. Any other entry the HTTP guard cannot read ('*', a trailing '/', a space) is refused too: kept,
    it matched no request, and every client got 421/403 with nothing said at start."""
    if not isinstance(hosts, list):
        return hosts
    from gpubox.httpguard import MalformedHeader, parse_strict

    example = '"https://gpu-box.example", "http://gpu-box.lan:*"' if origin else '"gpu-box", "gpu-box.lan:*"'
    for host in hosts:
        text = str(host)
        _, sep, port = text.rpartition(":")
        bare_v6 = text.startswith("[") and text.endswith("]")
        if not origin and not bare_v6 and sep and not text.endswith("]") and port != "*" and not port.isdigit():
            raise ValueError(
                f"{what} entry '{text}' is not a host, host:port or host:*; separate hosts with ',' or give a JSON "
                f"list (e.g. [{example}]), not ':'"
            )
        try:
            parse_strict(text, origin=origin, pattern=True)
        except MalformedHeader as exc:
            raise ValueError(f"{what} entry '{text}' matches no request: {exc} (e.g. [{example}])") from None
    return hosts
