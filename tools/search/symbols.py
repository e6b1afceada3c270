"""Which tree-sitter nodes are symbols, per language: their kind, name, line span and owner (chunker.py cuts)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

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
    "kotlin": {  # interfaces and enums are class_declaration with a keyword: see _kotlin
        "class_declaration": "class",
        "object_declaration": "class",
        "companion_object": "class",
        "function_declaration": "function",
    },
    "swift": {  # class, struct, enum, actor and extension are all class_declaration: see _swift
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
    "zig": {"Decl": "function", "TestDecl": "function"},  # fn, or a const bound to a struct/enum/union: see _zig
    "elixir": {"call": "function"},  # def/defp/defmacro/defmodule/... are calls: see _elixir
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

_ELIXIR = {
    "def": "function",
    "defp": "function",
    "defmacro": "function",
    "defmacrop": "function",
    "defguard": "function",
    "defguardp": "function",
    "defdelegate": "function",
    "defn": "function",
    "defnp": "function",
    "test": "function",  # ExUnit: test "name" do
    "defmodule": "module",
    "defprotocol": "interface",
    "defimpl": "impl",
}
_ELIXIR_ATTRS = {"doc", "spec", "impl", "deprecated", "decorate", "dialyzer"}  # `@doc """...` above a def
_HASKELL_SCOPES = {"declarations", "class_declarations", "instance_declarations"}
_SWIFT = {"class": "class", "actor": "class", "struct": "struct", "enum": "enum", "extension": "impl"}
_ZIG = {"struct": "struct", "enum": "enum", "union": "struct", "opaque": "struct"}


@dataclass
class Sym:
    node: Any  # the node whose descendants hold a container's members
    kind: str
    name: str | None
    start: int  # 0-based first and last line
    end: int
    parent: str | None = None  # an owner named in the definition itself: Go receiver, Lua `function M.f`


def _text(node: Any) -> str:
    return node.text.decode(errors="replace") if node is not None else ""


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


def _name(node: Any) -> str | None:
    n = node.child_by_field_name("name")
    if n is not None:
        return _text(n)
    decl = node.child_by_field_name("declarator")  # C/C++: int *foo(int) -> dig to the identifier
    while decl is not None:
        if decl.type in ("identifier", "field_identifier", "qualified_identifier", "destructor_name", "operator_name"):
            return _text(decl)
        decl = decl.child_by_field_name("declarator") or (decl.named_children[0] if decl.named_children else None)
    t = node.child_by_field_name("type")  # Rust `impl<'a> Foo<'a>` -> Foo
    return _text(t).split("<")[0].strip() if t is not None else None


def _first(node: Any, *types: str) -> Any | None:
    return next((c for c in node.named_children if c.type in types), None)


def _receiver(node: Any) -> str | None:
    """Go: the receiver type of `func (c *Command) Find()` -> Command."""
    recv = node.child_by_field_name("receiver")
    stack = [recv] if recv is not None else []
    while stack:
        n = stack.pop()
        if n.type == "type_identifier":
            return _text(n)
        stack.extend(reversed(n.named_children))
    return None


def _kotlin(node: Any, kind: str) -> tuple[str, str | None]:
    if node.type == "class_declaration":
        keywords = {c.type for c in node.children if not c.is_named}
        kind = "interface" if "interface" in keywords else "enum" if "enum" in keywords else "class"
    name = _first(node, "simple_identifier", "type_identifier")
    return kind, _text(name) if name is not None else ("Companion" if node.type == "companion_object" else None)


def _swift(node: Any, kind: str) -> tuple[str, str | None]:
    if node.type == "class_declaration":
        kind = _SWIFT.get(_text(node.child_by_field_name("declaration_kind")), "class")
    if node.type == "init_declaration":
        return kind, "init"
    name = _name(node)
    return kind, name.split("<")[0] if name else None  # `extension Array<Int>` -> Array


def _scala(node: Any, kind: str) -> tuple[str, str | None]:
    if node.type == "given_definition" and node.child_by_field_name("name") is None:
        return kind, _text(node.child_by_field_name("return_type")).split("[")[0] or None  # given Show[Int]
    if node.type == "extension_definition":  # extension (s: String) -> String, the type its methods extend
        params = node.child_by_field_name("parameters")
        param = _first(params, "parameter") if params is not None else None
        return kind, _text(param.child_by_field_name("type")) if param is not None else None
    return kind, _name(node)


def _lua(node: Any) -> tuple[str, str | None, str | None] | None:
    """`function M.setup` / `function M.Foo:bar` -> (name, owner); `M.f = function ... end` likewise; a table
    constructor holding functions (`M.task = { run = function ... end }`) is a container of its fields."""
    if node.type == "field":
        value, key = node.child_by_field_name("value"), node.child_by_field_name("name")
        if value is None or value.type != "function_definition" or key is None:
            return None
        return "function", _text(key).strip("\"'[]") or None, None
    kind = "function"
    if node.type == "assignment_statement":
        targets, values = _first(node, "variable_list"), _first(node, "expression_list")
        if targets is None or values is None or len(targets.named_children) != 1 or len(values.named_children) != 1:
            return None
        value = values.named_children[0]
        if value.type == "table_constructor":
            fields = [f.child_by_field_name("value") for f in value.named_children if f.type == "field"]
            if not any(v is not None and v.type == "function_definition" for v in fields):
                return None
            kind = "module"
        elif value.type != "function_definition":
            return None
        full = _text(targets.named_children[0])
    else:
        full = _name(node) or ""
    owner, _, name = full.replace(":", ".").rpartition(".")
    return kind, name or None, full[: len(owner)] or None


def _zig(node: Any) -> tuple[str, str | None] | None:
    """Old-style grammar: Decl holds an FnProto (a function) or a VarDecl (a container only when its value is
    `struct {...}`, `enum {...}`, `union(enum) {...}`)."""
    if node.type == "TestDecl":
        label = _first(node, "STRINGLITERALSINGLE", "IDENTIFIER")
        return "function", _text(label).strip('"') if label is not None else "test"
    proto = _first(node, "FnProto")
    if proto is not None:
        return "function", _text(proto.child_by_field_name("function")) or None
    var = _first(node, "VarDecl")
    if var is None:
        return None
    value = var
    for _ in range(4):  # VarDecl > ErrorUnionExpr > SuffixExpr > ContainerDecl
        value = _first(value, "ErrorUnionExpr", "SuffixExpr", "ContainerDecl")
        if value is None:
            return None
        if value.type == "ContainerDecl":
            head = _first(value, "ContainerDeclType")
            word = re.match(r"\w+", _text(head))
            kind = _ZIG.get(word.group(0) if word else "", "struct")
            return kind, _text(var.child_by_field_name("variable_type_function")) or None
    return None


def _elixir_name(call: Any) -> str | None:
    args = _first(call, "arguments")
    head = args.named_children[0] if args is not None and args.named_children else None
    target = _text(call.child_by_field_name("target"))
    if head is None:
        return None
    if target == "defimpl":  # defimpl Size, for: Map -> Size.Map (the module Elixir defines)
        pairs = _first(args, "keywords")
        forwhat = pairs.named_children[0].child_by_field_name("value") if pairs is not None else None
        return _text(head) + ("." + _text(forwhat) if forwhat is not None else "")
    if head.type in ("string", "alias"):
        return _text(head).strip('"')
    while head.type == "binary_operator" and _text(head.child_by_field_name("operator")) == "when":
        head = head.child_by_field_name("left")  # def f(x) when is_atom(x)
    if head.type == "call":
        head = head.child_by_field_name("target") or head
    if head.type == "binary_operator":  # def a + b
        return _text(head.child_by_field_name("operator"))
    return _text(head).split("(")[0] or None


def _elixir_start(node: Any) -> int:
    """Include the `@doc`/`@spec` attributes written directly above a def (a `@doc \"\"\"` heredoc is many lines)."""
    start = node.start_point[0]
    prev = node.prev_named_sibling
    while prev is not None and prev.type == "unary_operator" and prev.end_point[0] >= start - 1:
        operand = prev.child_by_field_name("operand")
        target = operand.child_by_field_name("target") if operand is not None and operand.type == "call" else None
        if _text(prev)[:1] != "@" or _text(target) not in _ELIXIR_ATTRS:
            break
        start = prev.start_point[0]
        prev = prev.prev_named_sibling
    return start


def _haskell(node: Any, kind: str) -> tuple[str, str | None] | None:
    if node.parent is None or node.parent.type not in _HASKELL_SCOPES:
        return None  # `function` is also a function type, `signature` a kind annotation `(a :: Type)`
    if node.type == "instance":  # instance FromJSON Bool -> Bool, as Rust's impl Display for Foo -> Foo
        types = node.child_by_field_name("patterns")
        return kind, (_text(types).strip("()") or _name(node)) if types is not None else _name(node)
    name = node.child_by_field_name("name")
    if name is None:  # infix definition: x .: k = ..., data a :* b = ...
        infix = _first(node, "infix")
        name = infix.child_by_field_name("operator") if infix is not None else None
    return kind, (_text(name).strip("()") or None) if name is not None else None


def _c_family(node: Any, kind: str) -> tuple[str, str | None, str | None] | None:
    """C/C++: `class Cord;` or `struct foo *p` names a type without defining it (no body): no symbol, or every
    file that mentions a class would offer it as a definition. `void Cord::Append(...) {` is method Append of Cord."""
    if node.type.endswith("_specifier") and node.child_by_field_name("body") is None:
        return None
    if node.type.endswith("_specifier") and node.child_by_field_name("name") is None:
        typedef = node.parent  # `typedef struct {...} Curl_easy;`: the type's only name is the typedef's
        if typedef is not None and typedef.type == "type_definition":
            names = typedef.children_by_field_name("declarator")  # `} *PFOO, FOO;`: FOO names the type itself
            plain = [d for d in names if d.type == "type_identifier"]
            declarator = plain[0] if plain else (names[0] if names else None)
            while declarator is not None and declarator.type != "type_identifier" and declarator.named_children:
                declarator = declarator.child_by_field_name("declarator") or declarator.named_children[0]
            return kind, (_text(declarator) or None) if declarator is not None else None, None
    if node.type == "function_definition":
        qualified = _out_of_line(node)
        if qualified is not None:
            owner, name = qualified
            return ("method", name, owner) if owner else (kind, name, None)
    return kind, _name(node), None


def _out_of_line(node: Any) -> tuple[str | None, str] | None:
    """(owner, name) of `R A<T>::B::m(...)` read from the tree (`::` also occurs inside template arguments and
    conversion operators); None when the definition is not qualified or its declarator did not parse."""
    d = node.child_by_field_name("declarator")
    while d is not None and d.type != "qualified_identifier":
        if d.type in ("identifier", "field_identifier", "destructor_name", "operator_name", "operator_cast"):
            return None
        d = d.child_by_field_name("declarator") or (d.named_children[0] if d.named_children else None)
    if d is None or any(c.type == "ERROR" for c in d.children):
        return None
    scope = None
    while d is not None and d.type == "qualified_identifier":
        scope, d = d.child_by_field_name("scope"), d.child_by_field_name("name")
    if d is None:
        return None
    if scope is not None and scope.type == "template_type":  # Foo<T>::bar -> Foo
        scope = scope.child_by_field_name("name")
    if d.type == "operator_cast":
        name = "operator " + _text(d.child_by_field_name("type"))
    elif d.type == "template_function":  # Foo::bar<int>
        name = _text(d.child_by_field_name("name"))
    else:
        name = _text(d)
    return (_text(scope) or None), name


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
        name = _name(node)
        span = node.parent if node.parent is not None else node
        start = span.start_point[0]
    elif language == "elixir":
        kind = _ELIXIR.get(_text(node.child_by_field_name("target")), "")
        if not kind or _first(node, "arguments") is None:
            return None
        name = _elixir_name(node)
        start = _elixir_start(node)
    elif language == "lua":
        found = _lua(node)
        if found is None:
            return None
        kind, name, parent = found
        span = node.parent if node.parent is not None and node.parent.type == "variable_declaration" else node
        start = span.start_point[0]
    elif language == "zig":
        zig = _zig(node)
        if zig is None:
            return None
        kind, name = zig
    elif language == "kotlin":
        kind, name = _kotlin(node, kind)
    elif language == "swift":
        kind, name = _swift(node, kind)
    elif language == "scala":
        kind, name = _scala(node, kind)
    elif language == "haskell":
        found = _haskell(node, kind)
        if found is None:
            return None
        kind, name = found
    elif language == "csharp" and node.type.endswith("operator_declaration"):
        op = node.child_by_field_name("operator") or node.child_by_field_name("type")  # operator +, operator bool
        name = f"operator {_text(op)}"
    elif language == "ruby":
        name = _name(node)
        name = name.rpartition("::")[2] if name else None  # class Sinatra::Base -> Base
    elif language in ("c", "cpp"):
        found = _c_family(node, kind)
        if found is None:
            return None
        kind, name, parent = found
        while span.parent is not None and span.parent.type == "template_declaration":
            span = span.parent  # `template <typename T>` lines above a class or function are part of it
        start = span.start_point[0]
    else:
        name = _name(node)
        if node.type == "method_declaration" and language == "go":
            parent = _receiver(node)
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
