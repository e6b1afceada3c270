"""Symbol-aware chunking with tree-sitter (functions, classes, methods), overlapping line windows otherwise."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("gpubox.search")

MAX_LINES = 80  # a symbol longer than this is split (classes into members, functions into windows)
WINDOW = 60
OVERLAP = 10

# node type -> kind, per tree-sitter grammar
SYMBOLS: dict[str, dict[str, str]] = {
    "python": {"function_definition": "function", "class_definition": "class"},
    "javascript": {
        "function_declaration": "function",
        "generator_function_declaration": "function",
        "class_declaration": "class",
        "method_definition": "method",
        "variable_declarator": "function",
    },
    "go": {"function_declaration": "function", "method_declaration": "method", "type_spec": "type"},
    "rust": {
        "function_item": "function",
        "impl_item": "impl",
        "struct_item": "struct",
        "enum_item": "enum",
        "trait_item": "trait",
        "mod_item": "module",
        "macro_definition": "macro",
    },
    "java": {
        "class_declaration": "class",
        "interface_declaration": "interface",
        "enum_declaration": "enum",
        "record_declaration": "class",
        "method_declaration": "method",
        "constructor_declaration": "method",
    },
    "c": {"function_definition": "function", "struct_specifier": "struct", "enum_specifier": "enum"},
    "cpp": {
        "function_definition": "function",
        "class_specifier": "class",
        "struct_specifier": "struct",
        "enum_specifier": "enum",
        "namespace_definition": "namespace",
    },
}
SYMBOLS["typescript"] = {
    **SYMBOLS["javascript"],
    "interface_declaration": "interface",
    "type_alias_declaration": "type",
    "enum_declaration": "enum",
    "abstract_class_declaration": "class",
}
SYMBOLS["tsx"] = SYMBOLS["typescript"]
LEADING = ("@", "#[", "//", "/*", "*", "# ", "--", '"""')  # decorators, attributes and comments above a symbol
CONTAINERS = {"class", "impl", "trait", "interface", "namespace", "module"}
FUNCTION_VALUES = {"arrow_function", "function_expression", "function"}


@dataclass
class Chunk:
    start_line: int  # 1-based, inclusive
    end_line: int
    text: str
    symbol: str | None
    kind: str  # function, method, class, ..., or "window"/"module"


def windows(lines: list[str], start: int, end: int, symbol: str | None, kind: str) -> list[Chunk]:
    """Overlapping windows over lines[start:end] (0-based), skipping blank-only pieces."""
    out = []
    i = start
    while i < end:
        j = min(end, i + WINDOW)
        text = "\n".join(lines[i:j])
        if text.strip():
            out.append(Chunk(i + 1, j, text, symbol, kind))
        if j == end:
            break
        i = j - OVERLAP
    return out


def _name(node: Any) -> str | None:
    n = node.child_by_field_name("name")
    if n is not None:
        return n.text.decode(errors="replace")
    decl = node.child_by_field_name("declarator")  # C/C++: int *foo(int) -> dig to the identifier
    while decl is not None:
        if decl.type in ("identifier", "field_identifier", "qualified_identifier", "destructor_name", "operator_name"):
            return decl.text.decode(errors="replace")
        decl = decl.child_by_field_name("declarator") or (decl.named_children[0] if decl.named_children else None)
    t = node.child_by_field_name("type")  # Rust `impl Foo`
    return t.text.decode(errors="replace") if t is not None else None


def _parser(language: str) -> Any | None:
    try:
        from tree_sitter_language_pack import get_parser

        return get_parser(language)  # type: ignore[arg-type]
    except Exception as exc:  # grammar missing: fall back to windows
        log.debug("no tree-sitter grammar for %s: %s", language, exc)
        return None


def chunk_text(text: str, language: str) -> list[Chunk]:
    lines = text.splitlines()
    if not lines:
        return []
    kinds = SYMBOLS.get(language)
    parser = _parser(language) if kinds else None
    if parser is None or kinds is None:
        return windows(lines, 0, len(lines), None, "window")
    tree = parser.parse(text.encode())
    out: list[Chunk] = []
    covered = [False] * len(lines)

    def emit(node: Any, parent_kind: str | None) -> None:
        kind = kinds[node.type]
        if node.type == "variable_declarator":
            value = node.child_by_field_name("value")
            if value is None or value.type not in FUNCTION_VALUES:
                return
            # cover the whole `const f = () => ...;` statement
            node = node.parent if node.parent is not None else node
        if kind == "function" and parent_kind in ("class", "impl", "interface", "trait"):
            kind = "method"
        name = _name(node) if node.type != "lexical_declaration" else _name(node.named_children[0])
        s, e = node.start_point[0], node.end_point[0]
        # decorators/comments directly above belong to the symbol
        while s > 0 and not covered[s - 1] and lines[s - 1].lstrip().startswith(LEADING):
            s -= 1
        inner = [c for c in _symbol_children(node)] if kind in CONTAINERS else []
        if e - s + 1 <= MAX_LINES or (not inner and kind not in ("function", "method")):
            if e - s + 1 <= MAX_LINES:
                out.append(Chunk(s + 1, e + 1, "\n".join(lines[s : e + 1]), name, kind))
            else:
                out.extend(windows(lines, s, e + 1, name, kind))
            for i in range(s, e + 1):
                covered[i] = True
            return
        if inner:
            first = inner[0].start_point[0]
            header_end = max(s, first - 1)
            out.append(Chunk(s + 1, header_end + 1, "\n".join(lines[s : header_end + 1]), name, kind))
            for i in range(s, header_end + 1):
                covered[i] = True
            for child in inner:
                emit(child, kind)
            return
        out.extend(windows(lines, s, e + 1, name, kind))
        for i in range(s, e + 1):
            covered[i] = True

    def _symbol_children(node: Any) -> list[Any]:
        found: list[Any] = []
        stack = list(reversed(node.named_children))
        while stack:
            n = stack.pop()
            if n.type in kinds:
                found.append(n)
            else:
                stack.extend(reversed(n.named_children))
        return found

    for top in _symbol_children(tree.root_node):
        emit(top, None)

    # module-level code between symbols (imports, constants, scripts) as windows
    i = 0
    while i < len(lines):
        if covered[i]:
            i += 1
            continue
        j = i
        while j < len(lines) and not covered[j]:
            j += 1
        if sum(1 for k in range(i, j) if lines[k].strip()) >= 3:
            out.extend(windows(lines, i, j, None, "module"))
        i = j
    out.sort(key=lambda c: (c.start_line, c.end_line))
    return out
