"""JSON schema -> GBNF grammar for llama.cpp, checked on both sides before llama.cpp parses it.

llama.cpp's grammar parser crashes the whole process (SIGSEGV) on a rule with an empty body, which
llama-cpp-python's converter emits for schemas that admit no value (`{"enum": []}`, `{"anyOf": []}`,
`{"type": []}`), and copies regex escapes such as `\\d` into the grammar, which llama.cpp's parser dies on. So
the schema gets a sanity pass (known types, no empty lists, bounded depth and size, local `$ref`s only, numeric
ranges and type combinations that admit a value, every regex parsed and its expanded size bounded before
anything is expanded), patterns are translated by gpubox.tools.inference.pattern instead of the converter, and
the generated grammar gets a structural pass (every rule non-empty, no empty alternative, every referenced rule
defined) before llama.cpp sees either. The backend then compiles it once in a child process (grammar_probe).
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

from gpubox.errors import InvalidInputError
from gpubox.tools.inference.pattern import expanded_size, pattern_to_gbnf
from gpubox.tools.inference.pattern import parse as parse_pattern

TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
MAX_DEPTH = 32
MAX_NODES = 5000
MAX_SCHEMA_CHARS = 64_000
MAX_REPEAT = 1000  # minItems/maxItems/minLength/maxLength: the converter unrolls repetitions into the grammar
MAX_INT_BOUND = 2**63  # a larger integer bound cannot be compared as a float (OverflowError)
MAX_GRAMMAR_CHARS = 1_000_000
# grammar elements after repetitions are unrolled, summed over the schema (min/maxLength, min/maxItems, patterns)
MAX_EXPANDED = 100_000
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
SCHEMA_ONE = ("items", "additionalProperties", "not", "contains")


def _bad(where: str, problem: str) -> InvalidInputError:
    return InvalidInputError(f"json_schema at {where or '(root)'} {problem}; fix that part of the schema")


def check_schema(schema: Any) -> None:
    """Raise InvalidInputError naming the first part of `schema` that admits no output or is out of bounds."""
    if not isinstance(schema, dict):
        raise _bad("", "must be a JSON object")
    try:
        size = len(json.dumps(schema))
    except RecursionError:  # nested past the interpreter's limit: far past MAX_DEPTH anyway
        raise _bad("", "is nested too deeply; flatten it") from None
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"json_schema is not plain JSON: {exc}") from None
    if size > MAX_SCHEMA_CHARS:
        raise InvalidInputError(f"json_schema is {size} characters; the limit is {MAX_SCHEMA_CHARS}")
    nodes = [0, 0]  # sub-schemas seen, grammar elements they expand to
    _walk(schema, schema, "", 0, nodes)


def _walk(node: Any, root: dict[str, Any], where: str, depth: int, nodes: list[int]) -> None:
    nodes[0] += 1
    if nodes[0] > MAX_NODES:
        raise InvalidInputError(f"json_schema has more than {MAX_NODES} sub-schemas; simplify it")
    if depth > MAX_DEPTH:
        raise _bad(where, f"is nested deeper than {MAX_DEPTH} levels")
    if node is True:
        return
    if node is False:
        raise _bad(where, "is `false`, which accepts no value")
    if not isinstance(node, dict):
        raise _bad(where, f"must be a schema object, not {type(node).__name__}")
    _check_keywords(node, root, where)
    nodes[1] += _expanded(node, where)
    if nodes[1] > MAX_EXPANDED:
        raise InvalidInputError(
            f"json_schema expands to more than {MAX_EXPANDED:,} grammar elements (repetition bounds and "
            f"patterns add up; the last part counted was {where or '(root)'}); lower maxLength/maxItems"
        )
    for key in SCHEMA_LISTS:
        if key in node:
            items = node[key]
            if not isinstance(items, list) or not items:
                raise _bad(f"{where}.{key}".lstrip("."), "must be a non-empty list (an empty one admits no value)")
            for i, sub in enumerate(items):
                _walk(sub, root, f"{where}.{key}[{i}]".lstrip("."), depth + 1, nodes)
    for key in SCHEMA_MAPS:
        if key in node:
            subs = node[key]
            if not isinstance(subs, dict):
                raise _bad(f"{where}.{key}".lstrip("."), "must be an object of schemas")
            for name, sub in subs.items():
                if key == "properties" and sub is False:
                    continue  # a forbidden property is fine: it is simply never emitted
                _walk(sub, root, f"{where}.{key}.{name}".lstrip("."), depth + 1, nodes)
    for key in SCHEMA_ONE:
        if key in node:
            sub = node[key]
            if key == "additionalProperties" and isinstance(sub, bool):
                continue
            if key == "items" and isinstance(sub, list):  # draft-4 tuple form
                for i, s in enumerate(sub):
                    _walk(s, root, f"{where}.items[{i}]".lstrip("."), depth + 1, nodes)
                continue
            if key == "not":  # the converter ignores `not`; only check it is well-formed
                if not isinstance(sub, dict | bool):
                    raise _bad(f"{where}.not".lstrip("."), "must be a schema")
                continue
            _walk(sub, root, f"{where}.{key}".lstrip("."), depth + 1, nodes)


def _check_keywords(node: dict[str, Any], root: dict[str, Any], where: str) -> None:
    def at(key: str) -> str:
        return f"{where}.{key}".lstrip(".")

    if "type" in node:
        t = node["type"]
        names = t if isinstance(t, list) else [t]
        if not names:
            raise _bad(at("type"), "is an empty list, which admits no value")
        for n in names:
            if n not in TYPES:
                raise _bad(at("type"), f"names unknown type {n!r} (known: {', '.join(sorted(TYPES))})")
    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        raise _bad(at("enum"), "must be a non-empty list (an empty enum admits no value)")
    if "required" in node and (
        not isinstance(node["required"], list) or not all(isinstance(r, str) for r in node["required"])
    ):
        raise _bad(at("required"), "must be a list of property names")
    for lo, hi in (("minItems", "maxItems"), ("minLength", "maxLength"), ("minProperties", "maxProperties")):
        for k in (lo, hi):
            if k in node and (not isinstance(node[k], int) or isinstance(node[k], bool) or node[k] < 0):
                raise _bad(at(k), "must be a non-negative integer")
            if k in node and k != "minProperties" and k != "maxProperties" and node[k] > MAX_REPEAT:
                raise _bad(at(k), f"is above {MAX_REPEAT} (the grammar unrolls repetitions)")
        if lo in node and hi in node and node[lo] > node[hi]:
            raise _bad(at(lo), f"is above {hi} ({node[lo]} > {node[hi]})")
    for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
        if k in node and (not isinstance(node[k], int | float) or isinstance(node[k], bool)):
            raise _bad(at(k), "must be a number")
        if k in node and isinstance(node[k], int) and abs(node[k]) > MAX_INT_BOUND:  # math on it overflows floats
            raise _bad(at(k), f"is beyond +-{MAX_INT_BOUND}")
    if "multipleOf" in node and not node["multipleOf"] > 0:  # a zero divides by zero when the output is checked
        raise _bad(at("multipleOf"), "must be above 0")
    if "minimum" in node and "maximum" in node and node["minimum"] > node["maximum"]:
        raise _bad(at("minimum"), f"is above maximum ({node['minimum']} > {node['maximum']})")
    if "pattern" in node and not isinstance(node["pattern"], str):
        raise _bad(at("pattern"), "must be a string")
    for regex in node.get("patternProperties", {}) if isinstance(node.get("patternProperties"), dict) else ():
        parse_pattern(regex, at("patternProperties"))  # the output check runs these regexes: they must be sane
    _check_satisfiable(node, at)
    if "$ref" in node:
        _check_ref(node["$ref"], root, at("$ref"))


def _expanded(node: dict[str, Any], where: str) -> int:
    """Grammar elements this node unrolls to: its longest repetition bound, or its pattern's expanded size."""
    size = 1
    for k in ("minItems", "maxItems", "minLength", "maxLength"):
        if isinstance(node.get(k), int):
            size = max(size, node[k])
    if isinstance(node.get("pattern"), str):
        pattern_to_gbnf(node["pattern"], where)  # refuses what a grammar cannot express, before the model loads
        size = max(size, expanded_size(node["pattern"], where))
    return size


def _types_of(node: dict[str, Any]) -> set[str] | None:
    t = node.get("type")
    if t is None:
        return None
    names = set(t if isinstance(t, list) else [t])
    return names | {"number"} if "integer" in names and "number" not in names else names


def _check_satisfiable(node: dict[str, Any], at: Any) -> None:
    """Refuse the combinations the grammar cannot honour and that admit no value at all."""
    allowed = _types_of(node)
    for i, sub in enumerate(node.get("allOf", []) if isinstance(node.get("allOf"), list) else []):
        sub_types = _types_of(sub) if isinstance(sub, dict) else None
        if sub_types is None:
            continue
        # integer is a subset of number: {"number"} ∩ {"integer", "number"} keeps the integers
        allowed = sub_types if allowed is None else allowed & sub_types
        if not allowed:
            raise _bad(at(f"allOf[{i}].type"), "contradicts the other types required (no value has all of them)")
    if node.get("type") == "integer":
        lo, hi = (
            _bound(node, "minimum", "exclusiveMinimum", math.ceil, 1),
            _bound(node, "maximum", "exclusiveMaximum", math.floor, -1),
        )
        if lo is not None and hi is not None and lo > hi:
            raise _bad(at("minimum"), "and maximum leave no integer in between; widen the range or use type number")


def _bound(node: dict[str, Any], inclusive: str, exclusive: str, rnd: Any, step: int) -> int | None:
    """The tightest integer bound from an inclusive and a (draft 6+, numeric) exclusive limit."""
    out: int | None = None
    for key, strict in ((inclusive, False), (exclusive, True)):
        v = node.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            continue
        b = rnd(v)
        if strict and b == v:
            b += step
        out = b if out is None else (max(out, b) if step > 0 else min(out, b))
    return out


def _check_ref(ref: Any, root: dict[str, Any], where: str) -> None:
    # the converter would fetch http(s) references over the network: only local ones are allowed
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise _bad(where, "must be a local reference such as '#/$defs/name' (remote references are not fetched)")
    target: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or part not in target:
            raise _bad(where, f"points to {ref}, which is not in the schema")
        target = target[part]


_TOKEN = re.compile(
    r"""(?P<ws>\s+|\#[^\n]*)
      |(?P<define>::=)
      |(?P<name>[A-Za-z0-9_-]+)
      |(?P<string>"(?:\\.|[^"\\])*")
      |(?P<cls>\[(?:\\.|[^\]\\])*\])
      |(?P<brace>\{\s*\d*\s*(?:,\s*\d*\s*)?\})
      |(?P<op>[()|*+?.])""",
    re.VERBOSE | re.DOTALL,
)


def check_gbnf(text: str) -> None:
    """Structural check of a GBNF grammar: a root rule, non-empty rules and alternatives, defined references."""
    if len(text) > MAX_GRAMMAR_CHARS:
        raise InvalidInputError(f"json_schema expands to a grammar of {len(text)} characters; simplify it")
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise InvalidInputError(f"json_schema produced an unparseable grammar near {text[pos : pos + 40]!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "ws":
            tokens.append((kind, m.group()))
    rules: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for i, tok in enumerate(tokens):
        if tok[0] == "name" and i + 1 < len(tokens) and tokens[i + 1][0] == "define":
            current = rules.setdefault(tok[1], [])
        elif tok[0] == "define":
            continue
        elif current is None:
            raise InvalidInputError("json_schema produced a grammar that does not start with a rule")
        else:
            current.append(tok)
    if "root" not in rules:
        raise InvalidInputError("json_schema produced a grammar without a root rule")
    for name, body in rules.items():
        _check_body(name, body, rules)


def _check_body(name: str, body: list[tuple[str, str]], rules: dict[str, Any]) -> None:
    where = f"grammar rule '{name}' (from the schema part of that name)"
    filled = [False]  # per open group: does the current alternative have an element yet
    for kind, value in body:
        if kind == "name":
            if value not in rules:
                raise InvalidInputError(f"{where} refers to an undefined rule '{value}'")
            filled[-1] = True
        elif kind in ("string", "cls") or value == ".":
            filled[-1] = True
        elif value == "(":
            filled.append(False)
        elif value in ("|", ")"):
            if not filled[-1]:
                raise InvalidInputError(f"{where} has an empty alternative; the schema admits no value there")
            if value == ")":
                if len(filled) == 1:
                    raise InvalidInputError(f"{where} has an unbalanced ')'")
                filled.pop()
                filled[-1] = True
            else:
                filled[-1] = False
        elif (kind == "brace" or value in ("*", "+", "?")) and not filled[-1]:
            raise InvalidInputError(f"{where} repeats nothing")
    if len(filled) != 1:
        raise InvalidInputError(f"{where} has an unclosed '('")
    if not filled[0]:
        raise InvalidInputError(f"{where} is empty; the schema admits no value there")


_LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def format_literal(literal: str) -> str:
    """A GBNF string literal matching `literal` exactly. The converter's own escapes only \\r, \\n and '"', so the
    backslashes of the JSON text it quotes (json.dumps writes '\\u0000', '\\"', '\\ud83d') were read by llama.cpp
    as escapes: a schema const holding a NUL aborted the whole server mid-generation, a quote broke the grammar,
    an emoji could never be produced."""
    if "\x00" in literal:  # llama.cpp ends a grammar element at code point 0
        raise InvalidInputError("json_schema holds a NUL character where no JSON text can carry it unescaped")
    out = (_LITERAL_ESCAPES.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x20 or ord(c) == 0x7F else c) for c in literal)
    return '"' + "".join(out) + '"'


def schema_to_gbnf(schema: dict[str, Any]) -> str:
    """The checked GBNF grammar for `schema` (llama-cpp-python's converter with gpubox's regex translation, run
    on the caller's thread)."""
    check_schema(schema)
    converter = _converter_class()(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        # a copy: resolve_refs rewrites $ref values in place
        converter.visit(converter.resolve_refs(json.loads(json.dumps(schema)), "input"), "")
        text = converter.format_grammar()
    except InvalidInputError:
        raise
    except Exception as exc:  # the converter raises plain exceptions (asserts) for unsupported constructs
        reason = str(exc) or type(exc).__name__
        raise InvalidInputError(f"json_schema could not be turned into a grammar: {reason}") from None
    check_gbnf(text)
    return text


@functools.cache
def _converter_class() -> type:
    from gpubox.tools.inference.llama_import import share_cxx_runtime

    share_cxx_runtime()  # before llama_cpp's libraries load (llama_import)
    from llama_cpp.llama_grammar import SchemaConverter

    class Converter(SchemaConverter):
        def resolve_refs(self, schema: dict[str, Any], url: str) -> Any:
            # upstream does not descend into a node that has a $ref: for a root $ref (pydantic's schema of any
            # recursive model) the refs inside $defs stayed unresolved and the conversion failed with a KeyError
            if isinstance(schema, dict) and "$ref" in schema:
                super().resolve_refs({k: v for k, v in schema.items() if k != "$ref"}, url)
            return super().resolve_refs(schema, url)

        def _format_literal(self, literal: str) -> str:
            return format_literal(literal)

        def _visit_pattern(self, pattern: str, name: str) -> str:
            # the upstream translation copies regex escapes into the grammar (see the module docstring)
            body = pattern_to_gbnf(pattern, name)
            return self._add_rule(name, f'"\\"" {body} "\\"" space')

    return Converter
