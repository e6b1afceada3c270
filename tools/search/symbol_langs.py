"""Reading a definition node's name, kind and owner out of the tree: the generic reading (`name` field, C
declarator, Rust impl type) and one reader per grammar whose definitions it misreads (Kotlin enums, Swift
extensions, Lua `M.f = function`, Elixir `def` calls, C `typedef struct {...} name`, C++ `A::m`, ...).

Kept apart from symbols.py, which says which node types are symbols, in which language, and dispatches here: each
reader knows one grammar's tree shapes, so they change with the grammars, not with how chunker.py cuts symbols.
"""

from __future__ import annotations

import re
from typing import Any

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


def text(node: Any) -> str:
    return node.text.decode(errors="replace") if node is not None else ""


def name_of(node: Any) -> str | None:
    """The name a definition gives itself, wherever its grammar puts it."""
    n = node.child_by_field_name("name")
    if n is not None:
        return text(n)
    decl = node.child_by_field_name("declarator")  # C/C++: int *foo(int) -> dig to the identifier
    while decl is not None:
        if decl.type in ("identifier", "field_identifier", "qualified_identifier", "destructor_name", "operator_name"):
            return text(decl)
        decl = decl.child_by_field_name("declarator") or (decl.named_children[0] if decl.named_children else None)
    t = node.child_by_field_name("type")  # Rust `impl<'a> Foo<'a>` -> Foo
    return text(t).split("<")[0].strip() if t is not None else None


def _first(node: Any, *types: str) -> Any | None:
    return next((c for c in node.named_children if c.type in types), None)


def go_receiver(node: Any) -> str | None:
    """Go: the receiver type of `func (c *Command) Find()` -> Command."""
    recv = node.child_by_field_name("receiver")
    stack = [recv] if recv is not None else []
    while stack:
        n = stack.pop()
        if n.type == "type_identifier":
            return text(n)
        stack.extend(reversed(n.named_children))
    return None


def kotlin(node: Any, kind: str) -> tuple[str, str | None]:
    if node.type == "class_declaration":
        keywords = {c.type for c in node.children if not c.is_named}
        kind = "interface" if "interface" in keywords else "enum" if "enum" in keywords else "class"
    name = _first(node, "simple_identifier", "type_identifier")
    return kind, text(name) if name is not None else ("Companion" if node.type == "companion_object" else None)


def swift(node: Any, kind: str) -> tuple[str, str | None]:
    if node.type == "class_declaration":
        kind = _SWIFT.get(text(node.child_by_field_name("declaration_kind")), "class")
    if node.type == "init_declaration":
        return kind, "init"
    name = name_of(node)
    return kind, name.split("<")[0] if name else None  # `extension Array<Int>` -> Array


def scala(node: Any, kind: str) -> tuple[str, str | None]:
    if node.type == "given_definition" and node.child_by_field_name("name") is None:
        return kind, text(node.child_by_field_name("return_type")).split("[")[0] or None  # given Show[Int]
    if node.type == "extension_definition":  # extension (s: String) -> String, the type its methods extend
        params = node.child_by_field_name("parameters")
        param = _first(params, "parameter") if params is not None else None
        return kind, text(param.child_by_field_name("type")) if param is not None else None
    return kind, name_of(node)


def lua(node: Any) -> tuple[str, str | None, str | None] | None:
    """`function M.setup` / `function M.Foo:bar` -> (name, owner); `M.f = function ... end` likewise; a table
    constructor holding functions (`M.task = { run = function ... end }`) is a container of its fields."""
    if node.type == "field":
        value, key = node.child_by_field_name("value"), node.child_by_field_name("name")
        if value is None or value.type != "function_definition" or key is None:
            return None
        return "function", text(key).strip("\"'[]") or None, None
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
        full = text(targets.named_children[0])
    else:
        full = name_of(node) or ""
    owner, _, name = full.replace(":", ".").rpartition(".")
    return kind, name or None, full[: len(owner)] or None


def zig(node: Any) -> tuple[str, str | None] | None:
    """Old-style grammar: Decl holds an FnProto (a function) or a VarDecl (a container only when its value is
    `struct {...}`, `enum {...}`, `union(enum) {...}`)."""
    if node.type == "TestDecl":
        label = _first(node, "STRINGLITERALSINGLE", "IDENTIFIER")
        return "function", text(label).strip('"') if label is not None else "test"
    proto = _first(node, "FnProto")
    if proto is not None:
        return "function", text(proto.child_by_field_name("function")) or None
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
            word = re.match(r"\w+", text(head))
            kind = _ZIG.get(word.group(0) if word else "", "struct")
            return kind, text(var.child_by_field_name("variable_type_function")) or None
    return None


def _elixir_name(call: Any) -> str | None:
    args = _first(call, "arguments")
    head = args.named_children[0] if args is not None and args.named_children else None
    target = text(call.child_by_field_name("target"))
    if head is None:
        return None
    if target == "defimpl":  # defimpl Size, for: Map -> Size.Map (the module Elixir defines)
        pairs = _first(args, "keywords")
        forwhat = pairs.named_children[0].child_by_field_name("value") if pairs is not None else None
        return text(head) + ("." + text(forwhat) if forwhat is not None else "")
    if head.type in ("string", "alias"):
        return text(head).strip('"')
    while head.type == "binary_operator" and text(head.child_by_field_name("operator")) == "when":
        head = head.child_by_field_name("left")  # def f(x) when is_atom(x)
    if head.type == "call":
        head = head.child_by_field_name("target") or head
    if head.type == "binary_operator":  # def a + b
        return text(head.child_by_field_name("operator"))
    return text(head).split("(")[0] or None


def _elixir_start(node: Any) -> int:
    """Include the `@doc`/`@spec` attributes written directly above a def (a `@doc \"\"\"` heredoc is many lines)."""
    start = node.start_point[0]
    prev = node.prev_named_sibling
    while prev is not None and prev.type == "unary_operator" and prev.end_point[0] >= start - 1:
        operand = prev.child_by_field_name("operand")
        target = operand.child_by_field_name("target") if operand is not None and operand.type == "call" else None
        if text(prev)[:1] != "@" or text(target) not in _ELIXIR_ATTRS:
            break
        start = prev.start_point[0]
        prev = prev.prev_named_sibling
    return start


def elixir(node: Any) -> tuple[str, str | None, int] | None:
    """(kind, name, first line) of a `def`, `defmodule`, `test "name"`, ... call; None for any other call."""
    kind = _ELIXIR.get(text(node.child_by_field_name("target")), "")
    if not kind or _first(node, "arguments") is None:
        return None
    return kind, _elixir_name(node), _elixir_start(node)


def haskell(node: Any, kind: str) -> tuple[str, str | None] | None:
    if node.parent is None or node.parent.type not in _HASKELL_SCOPES:
        return None  # `function` is also a function type, `signature` a kind annotation `(a :: Type)`
    if node.type == "instance":  # instance FromJSON Bool -> Bool, as Rust's impl Display for Foo -> Foo
        types = node.child_by_field_name("patterns")
        return kind, (text(types).strip("()") or name_of(node)) if types is not None else name_of(node)
    name = node.child_by_field_name("name")
    if name is None:  # infix definition: x .: k = ..., data a :* b = ...
        infix = _first(node, "infix")
        name = infix.child_by_field_name("operator") if infix is not None else None
    return kind, (text(name).strip("()") or None) if name is not None else None


def c_family(node: Any, kind: str) -> tuple[str, str | None, str | None] | None:
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
            return kind, (text(declarator) or None) if declarator is not None else None, None
    if node.type == "function_definition":
        qualified = _out_of_line(node)
        if qualified is not None:
            owner, name = qualified
            return ("method", name, owner) if owner else (kind, name, None)
    return kind, name_of(node), None


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
        name = "operator " + text(d.child_by_field_name("type"))
    elif d.type == "template_function":  # Foo::bar<int>
        name = text(d.child_by_field_name("name"))
    else:
        name = text(d)
    return (text(scope) or None), name
