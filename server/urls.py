"""One check for an http(s) URL a user gives (`gpubox install --remote`, serve_attach's base_url): a URL httpx or
a client cannot connect to is refused here with an example, not at the first connection (a port past 65535 reached
httpx as an unexplained OverflowError)."""

from __future__ import annotations

from urllib.parse import urlsplit

from gpubox.errors import InvalidInputError


def check_http_url(url: str, what: str, example: str) -> str:
    """`url` when it is http(s) with a host and a port from 1 to 65535; else an InvalidInputError naming `what`
    (the argument) and showing `example`."""
    shown = repr(url[:200])
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        # urlsplit drops tab, CR and LF before it parses, so they passed the check and reached the config file
        raise InvalidInputError(f"{what} {shown} holds a space or a control character; {example}")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number or is above 65535
    except ValueError as exc:
        raise InvalidInputError(f"{what} {shown} is not a valid URL ({exc}); {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInputError(f"{what} {shown} is not an http(s) URL with a host; {example}")
    if port == 0:
        raise InvalidInputError(f"{what} {shown}: port 0 cannot be connected to; use the server's port, {example}")
    return url
