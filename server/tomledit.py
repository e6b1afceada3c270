"""Replace or remove one table of a TOML file as text, leaving every other line as it was.

Codex keeps its MCP servers in ~/.codex/config.toml next to the user's own settings and comments; a TOML
library would rewrite (and lose) those, so gpubox edits the text of its own `[mcp_servers.<name>]` table
(and its sub-tables) only. Every edit is checked by parsing the result with tomllib: it must equal the
original document with just that table changed. Where the table is written in a form this editor does not
rewrite (an inline table, dotted keys, a header inside a multi-line string) the check fails and the file is
left alone with a ConfigError that says so.
"""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

from gpubox.errors import ConfigError

_HEADER = re.compile(r"^\s*(\[\[?)(?P<key>[^\[\]].*?)\]\]?\s*(#.*)?$")
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")
# TOML basic strings: '"', '\' and control characters other than tab must be escaped (toml.io/en/v1.0.0#string)
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\n": "\\n", "\f": "\\f", "\r": "\\r"}

Table = tuple[str, ...]


def parse(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid TOML ({exc}); fix or move it, then run again. It was not changed."
        ) from None
    except RecursionError:
        raise ConfigError(
            f"{path} is nested too deeply to read; gpubox will not rewrite it. It was not changed."
        ) from None


def _string(value: str) -> str:
    out = []
    for ch in value:
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif (ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(name: str) -> str:
    return name if _BARE.match(name) else _string(name)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def render(table: Table, entry: dict[str, Any]) -> str:
    """`[a.b]` with the scalar keys, then one `[a.b.sub]` per nested table (one level, as MCP entries need)."""
    head = ".".join(_key(k) for k in table)
    lines = [f"[{head}]"] + [f"{_key(k)} = {_value(v)}" for k, v in entry.items() if not isinstance(v, dict)]
    for k, sub in entry.items():
        if isinstance(sub, dict):
            lines += ["", f"[{head}.{_key(k)}]"] + [f"{_key(sk)} = {_value(sv)}" for sk, sv in sub.items()]
    return "\n".join(lines) + "\n"


def _header_path(line: str) -> Table | None:
    """The key path of a `[table]` / `[[array]]` header line, read by tomllib itself (quotes, spaces)."""
    m = _HEADER.match(line)
    if m is None:
        return None
    try:
        doc: Any = tomllib.loads(f"[{m.group('key')}]")
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    while isinstance(doc, dict) and len(doc) == 1:
        key = next(iter(doc))
        path.append(key)
        doc = doc[key]
    return tuple(path)


def _is_content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _spans(lines: list[str], table: Table) -> list[tuple[int, int]]:
    """[start, end) line ranges of `table` and its sub-tables; comments just before the next table stay."""
    headers = [(i, p) for i, line in enumerate(lines) if (p := _header_path(line)) is not None]
    spans = []
    for n, (start, path) in enumerate(headers):
        if path[: len(table)] != table or (spans and spans[-1][1] > start):
            continue
        stop = len(lines)
        for later, other in headers[n + 1 :]:
            if other[: len(table)] != table:
                stop = later
                break
        end = start + 1
        for i in range(start + 1, stop):
            if _is_content(lines[i]):
                end = i + 1
        spans.append((start, end))
    return spans


def _without(lines: list[str], spans: list[tuple[int, int]]) -> list[str]:
    out: list[str] = []
    cut = {i for start, end in spans for i in range(start, end)}
    for i, line in enumerate(lines):
        if i in cut:
            continue
        # one blank line where a table was taken out, not two
        if not line.strip() and (i - 1 in cut) and (not out or not out[-1].strip()):
            continue
        out.append(line)
    return out


def _expect(doc: dict[str, Any], table: Table, entry: dict[str, Any] | None) -> dict[str, Any]:
    want = copy.deepcopy(doc)
    node = want
    for key in table[:-1]:
        node = node.setdefault(key, {})
    if entry is None:
        node.pop(table[-1], None)
    else:
        node[table[-1]] = entry
    return want


def _pruned(doc: dict[str, Any], parents: Table) -> dict[str, Any]:
    """`doc` without empty tables along `parents`: `[mcp_servers]` left empty may or may not have a header."""
    for depth in range(len(parents), 0, -1):
        node: Any = doc
        for key in parents[: depth - 1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(parents[depth - 1]) == {}:
            del node[parents[depth - 1]]
    return doc


def _checked(text: str, doc: dict[str, Any], table: Table, entry: dict[str, Any] | None, path: Path) -> str:
    try:
        got = _pruned(tomllib.loads(text), table[:-1])
        ok = got == _pruned(_expect(doc, table, entry), table[:-1])
    except tomllib.TOMLDecodeError:
        ok = False
    if not ok:
        name = ".".join(table)
        raise ConfigError(
            f"{path} defines [{name}] in a form gpubox does not rewrite (inline table or dotted keys); "
            f"edit that entry by hand (`--print` shows what gpubox would write). The file was not changed."
        )
    return text


def _lines(text: str) -> tuple[list[str], str]:
    """The lines of `text` split at "\n" only, each keeping a "\r" it had (str.splitlines also split at U+2028 or
    U+0085 inside a string or a comment, and dropped CRLF endings); and "\r" when the file has CRLF endings, for the
    lines gpubox adds."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines, "\r" if "\r\n" in text else ""


def set_table(text: str, table: Table, entry: dict[str, Any], path: Path) -> str:
    """`text` with `table` replaced by `entry` where it was, or appended at the end."""
    doc = parse(text, path)
    lines, cr = _lines(text)
    block = [line + cr for line in render(table, entry).split("\n")[:-1]]
    spans = _spans(lines, table)
    if spans:  # in place of the first span; later ones (sub-tables defined further down) go
        start, end = spans[0]
        rest = _without(lines, spans[1:])
        new = rest[:start] + block + rest[end:]
    else:
        new = ([*lines, cr] if lines and lines[-1].strip() else lines) + block
    return _checked("\n".join(new) + "\n", doc, table, entry, path)


def remove_table(text: str, table: Table, path: Path) -> str:
    doc = parse(text, path)
    lines = _lines(text)[0]
    lines = _without(lines, _spans(lines, table))
    while lines and not lines[-1].strip():
        lines.pop()
    return _checked("\n".join(lines) + "\n" if lines else "", doc, table, None, path)
