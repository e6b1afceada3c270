"""Which tree-sitter nodes are symbols, per language: their kind, name, line span and owner (chunker.py cuts).

The grammar-specific reading of a name or kind lives in symbol_langs.py; classify here dispatches to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpubox.tools.search import symbol_langs

# node type -> kind, per tree-sitter grammar (the names tree_sitter_language_pack 0.13 ships). Kinds stay within
# rank.DEFINITION_KINDS (plus "namespace"): an object or companion is a class, a protocol an interface, an
# extension, instance or impl block an impl.
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
    # namespaces are left out: a block namespace wraps the whole file, its classes are the symbols
    "csharp": {
        "class_declaration": "class",
        "interface_declaration": "interface",
        "struct_declaration": "struct",
        "record_declaration": "class",
        "enum_declaration": "enum",
        "method_declaration": "method",
        "constructor_declaration": "method",
        "operator_declaration": "method",
        "conversion_operator_declaration": "method",
    },
    "ruby": {"class": "class", "module": "module", "method": "method", "singleton_method": "method"},
    "php": {
        "class_declaration": "class",
        "interface_declaration": "interface",
        "trait_declaration": "trait",
        "enum_declaration": "enum",
        "function_definition": "function",
        "method_declaration": "method",
    },
    "kotlin": {  # interfaces and enums are class_declaration with a keyword: see symbol_langs.kotlin
        "class_declaration": "class",
        "object_declaration": "class",
        "companion_object": "class",
        "function_declaration": "function",
    },
    "swift": {  # class, struct, enum, actor and extension are all class_declaration: see symbol_langs.swift
        "class_declaration": "class",
        "protocol_declaration": "interface",
        "function_declaration": "function",
        "protocol_function_declaration": "method",
        "init_declaration": "method",
    },
    "scala": {
        "class_definition": "class",
        "object_definition": "class",
        "trait_definition": "trait",
        "enum_definition": "enum",
        "package_object": "module",
        "given_definition": "impl",
        "extension_definition": "impl",
        "function_definition": "function",
        "function_declaration": "function",
    },
    "bash": {"function_definition": "function"},
    "lua": {"function_declaration": "function", "assignment_statement": "function", "field": "function"},
    "zig": {"Decl": "function", "TestDecl": "function"},  # fn, or a const bound to struct/enum/union: symbol_langs.zig
    "elixir": {"call": "function"},  # def/defp/defmacro/defmodule/... are calls: see symbol_langs.elixir
    "haskell": {
        "function": "function",
        "bind": "function",
        "signature": "function",  # merged with the equations that follow it
        "data_type": "type",
        "newtype": "type",
        "type_synomym": "type",  # sic: the grammar's spelling
        "class": "class",
        "instance": "impl",
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

GRAMMAR: dict[str, str] = {}  # walker language -> tree_sitter_language_pack name, where they differ (none in pack 0.13)

CONTAINERS = {"class", "impl", "trait", "interface", "namespace", "module"}
# structs and enums hold methods here (in C a struct's children are fields and type references)
MEMBER_CONTAINERS = {
    "csharp": {"struct"},
    "php": {"enum"},
    "kotlin": {"enum"},
    "swift": {"struct", "enum"},
    "scala": {"enum"},
    "zig": {"struct", "enum"},
}
METHOD_PARENTS = {"class", "impl", "interface", "trait", "struct", "enum"}  # a function inside is a method
# a module wrapping classes is a namespace: split it into its members whatever its length; a C++ namespace is split
# whatever it holds (a header's `namespace leveldb { class MemTable {...} }` is class MemTable, not namespace leveldb)
SPLIT_WRAPPERS = {"ruby": "module", "elixir": "module", "cpp": "namespace"}
MERGE_CLAUSES = {"haskell", "elixir"}  # one function written as several equations / clauses is one symbol
FUNCTION_VALUES = {"arrow_function", "function_expression", "function"}


@dataclass
class Sym:
    node: Any  # the node whose descendants hold a container's members
    kind: str
    name: str | None
    start: int  # 0-based first and last line
    end: int
    parent: str | None = None  # an owner named in the definition itself: Go receiver, Lua `function M.f`


def _end(node: Any, src: bytes, comments: bool = True) -> int:
    """Last line of the node's text, without the indentation or blank lines before its end (Zig doc comments)
    and, where `comments` is False, without the comments it ends with (an indented Scala body takes the next
    member's doc comment; a Python body's last comments are its own)."""
    last = node
    while not comments and last.child_count:
        kids = [k for k in last.children if k.end_byte > k.start_byte]
        while kids and ("comment" in kids[-1].type or kids[-1].type == "haddock"):
            kids.pop()
        if not kids:
            break
        last = kids[-1]
    row, end = last.end_point[0], last.end_byte
    while row > node.start_point[0]:
        line_start = src.rfind(b"\n", 0, end) + 1
        if src[line_start:end].strip():
            break
        row, end = row - 1, line_start - 1
    return row


def classify(language: str, node: Any, src: bytes) -> Sym | None:
    """The symbol a node of a type in SYMBOLS[language] defines, or None when it is none (a call that is no
    def, a variable not bound to a function)."""
    kind = SYMBOLS[language][node.type]
    start, parent = node.start_point[0], None
    span = node
    if node.type == "variable_declarator":  # JS: const f = () => ... ; cover the whole statement
        value = node.child_by_field_name("value")
        if value is None or value.type not in FUNCTION_VALUES:
            return None
        name = symbol_langs.name_of(node)
        span = node.parent if node.parent is not None else node
        start = span.start_point[0]
    elif language == "elixir":
        found = symbol_langs.elixir(node)
        if found is None:
            return None
        kind, name, start = found
    elif language == "lua":
        found = symbol_langs.lua(node)
        if found is None:
            return None
        kind, name, parent = found
        span = node.parent if node.parent is not None and node.parent.type == "variable_declaration" else node
        start = span.start_point[0]
    elif language == "zig":
        zig = symbol_langs.zig(node)
        if zig is None:
            return None
        kind, name = zig
    elif language == "kotlin":
        kind, name = symbol_langs.kotlin(node, kind)
    elif language == "swift":
        kind, name = symbol_langs.swift(node, kind)
    elif language == "scala":
        kind, name = symbol_langs.scala(node, kind)
    elif language == "haskell":
        found = symbol_langs.haskell(node, kind)
        if found is None:
            return None
        kind, name = found
    elif language == "csharp" and node.type.endswith("operator_declaration"):
        op = node.child_by_field_name("operator") or node.child_by_field_name("type")  # operator +, operator bool
        name = f"operator {symbol_langs.text(op)}"
    elif language == "ruby":
        name = symbol_langs.name_of(node)
        name = name.rpartition("::")[2] if name else None  # class Sinatra::Base -> Base
    elif language in ("c", "cpp"):
        found = symbol_langs.c_family(node, kind)
        if found is None:
            return None
        kind, name, parent = found
        while span.parent is not None and span.parent.type == "template_declaration":
            span = span.parent  # `template <typename T>` lines above a class or function are part of it
        start = span.start_point[0]
    else:
        name = symbol_langs.name_of(node)
        if node.type == "method_declaration" and language == "go":
            parent = symbol_langs.go_receiver(node)
    return Sym(node, kind, name, start, _end(span, src, language != "scala"), parent)


def merge_clauses(syms: list[Sym]) -> list[Sym]:
    """Haskell `f :: ...` then `f [] = ...`, `f (x:xs) = ...`; Elixir `def f(0)`, `def f(n)`: one symbol."""
    out: list[Sym] = []
    for s in syms:
        prev = out[-1] if out else None
        if prev is not None and prev.kind == s.kind == "function" and prev.name and prev.name == s.name:
            prev.end = max(prev.end, s.end)
        else:
            out.append(s)
    return out
