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
    parent: str | None = None  # the enclosing class/impl/receiver type of a method (Context.invoke)
    signature: str | None = None  # a long symbol's opening line(s), on its windows after the first

    @property
    def qualified(self) -> str | None:
        return f"{self.parent}.{self.symbol}" if self.parent and self.symbol else self.symbol


EMBED_HEADER_CHARS = 400  # MiniLM reads 256 word pieces: the header must leave most of them to the code


def embedding_text(path: str, c: Chunk) -> str:
    """What the embedding model sees: where the chunk lives, what it defines (qualified: Class.method) and, for a
    window cut from the middle of a long symbol, that symbol's signature; then the code, whose first lines hold
    the signature and docstring. A description of behaviour then lands on the right method of a big class."""
    head = [path]
    if c.symbol:
        head.append(f"{c.kind} {c.qualified}")
    if c.signature:
        head.append(c.signature)
    return "\n".join(head)[:EMBED_HEADER_CHARS] + "\n" + c.text


def windows(
    lines: list[str],
    start: int,
    end: int,
    symbol: str | None,
    kind: str,
    parent: str | None = None,
    signature: str | None = None,
) -> list[Chunk]:
    """Overlapping windows over lines[start:end] (0-based), skipping blank-only pieces."""
    out = []
    i = start
    while i < end:
        j = min(end, i + WINDOW)
        text = "\n".join(lines[i:j])
        if text.strip():
            # the first window starts with the signature itself; later ones repeat it for the embedding
            out.append(Chunk(i + 1, j, text, symbol, kind, parent, signature if i > start else None))
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
    t = node.child_by_field_name("type")  # Rust `impl<'a> Foo<'a>` -> Foo
    return t.text.decode(errors="replace").split("<")[0].strip() if t is not None else None


def _signature(lines: list[str], start: int) -> str:
    """The opening line(s) of a definition: up to the line that opens its body (at most 4 lines)."""
    out = []
    for line in lines[start : start + 4]:
        out.append(line.strip())
        if line.rstrip().endswith((":", "{", "=>")) or "{" in line:
            break
    return " ".join(out)


def _receiver(node: Any) -> str | None:
    """Go: the receiver type of `func (c *Command) Find()` -> Command."""
    recv = node.child_by_field_name("receiver")
    if recv is None:
        return None
    idents = [n for n in _walk(recv) if n.type == "type_identifier"]
    return idents[0].text.decode(errors="replace") if idents else None


def _walk(node: Any) -> list[Any]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(reversed(n.named_children))
    return out


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

    def emit(node: Any, parent_kind: str | None, parent: str | None = None) -> None:
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
        if node.type == "method_declaration" and language == "go":
            parent = _receiver(node) or parent
        s, e = node.start_point[0], node.end_point[0]
        sig = _signature(lines, s)
        # decorators/comments directly above belong to the symbol
        while s > 0 and not covered[s - 1] and lines[s - 1].lstrip().startswith(LEADING):
            s -= 1
        inner = [c for c in _symbol_children(node)] if kind in CONTAINERS else []
        if e - s + 1 <= MAX_LINES or (not inner and kind not in ("function", "method")):
            if e - s + 1 <= MAX_LINES:
                out.append(Chunk(s + 1, e + 1, "\n".join(lines[s : e + 1]), name, kind, parent))
            else:
                out.extend(windows(lines, s, e + 1, name, kind, parent, sig))
            for i in range(s, e + 1):
                covered[i] = True
            return
        if inner:
            first = inner[0].start_point[0]
            header_end = max(s, first - 1)
            out.append(Chunk(s + 1, header_end + 1, "\n".join(lines[s : header_end + 1]), name, kind, parent))
            for i in range(s, header_end + 1):
                covered[i] = True
            for child in inner:
                emit(child, kind, name)
            return
        out.extend(windows(lines, s, e + 1, name, kind, parent, sig))
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
