"""JSON Schema `pattern` -> GBNF for the inside of a JSON string, built from Python's own regex parser.

llama-cpp-python's converter copies regex escapes such as `\\d` or `\\.` into the grammar verbatim; llama.cpp's
grammar parser does not know them and the process dies (SIGSEGV) on an everyday pattern like `^\\d+$`. It also
unrolls `{n}` into n copies before anything can bound it (`[ab]{100000000}` took 3 GB). Here the pattern is
parsed by `re._parser` (the parser `re.compile` uses, so every syntax error is the one Python would report), the
tree is checked (quantifier bounds and the size the grammar will expand to) before anything is emitted, and each
character set becomes an explicit class over code points. JSON Schema patterns follow ECMA-262, so `\\d` and
`\\w` are ASCII (https://json-schema.org/understanding-json-schema/reference/regular_expressions).

Characters are emitted as they must appear inside a JSON string: `"` and `\\` as their escapes, control
characters only as the named escapes (\\n, \\t, \\r). The grammar may admit fewer strings than the regex (never
more, up to possessive/atomic groups, which are treated as plain ones); the output is validated afterwards.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from gpubox.errors import InvalidInputError

# re's own parser and opcodes (private, untyped modules; the same in Python 3.11-3.13, which gpubox supports)
sre: Any = importlib.import_module("re._parser")
C: Any = importlib.import_module("re._constants")

MAX_REPEAT = 1000  # one quantifier's bound: llama.cpp expands {n,m} into copies of the repeated element
MAX_EXPANDED = 20_000  # elements after every quantifier is expanded (nested ones multiply)
MAX_NESTING = 64
UNICODE_MAX = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

# ECMA-262 classes (ASCII \d and \w; \s as the common whitespace: fewer strings is safe, more would not be)
DIGIT = [(0x30, 0x39)]
WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
SPACE = [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x2028, 0x2029), (0xFEFF, 0xFEFF)]
CATEGORIES = {
    C.CATEGORY_DIGIT: (DIGIT, False),
    C.CATEGORY_NOT_DIGIT: (DIGIT, True),
    C.CATEGORY_WORD: (WORD, False),
    C.CATEGORY_NOT_WORD: (WORD, True),
    C.CATEGORY_SPACE: (SPACE, False),
    C.CATEGORY_NOT_SPACE: (SPACE, True),
}
JSON_NAMED = {0x22: '\\\\\\"', 0x5C: "\\\\\\\\", 0x0A: "\\\\n", 0x09: "\\\\t", 0x0D: "\\\\r"}
NEWLINES = [(0x0A, 0x0A), (0x0D, 0x0D)]  # what `.` does not match
UNSUPPORTED = {
    C.GROUPREF: "back-references such as \\1 cannot be expressed as a grammar",
    C.GROUPREF_EXISTS: "conditional groups (?(1)...) cannot be expressed as a grammar",
    C.ASSERT: "lookahead/lookbehind assertions (?=...) (?<=...) are not supported in constrained output",
    C.ASSERT_NOT: "negative lookahead/lookbehind (?!...) (?<!...) is not supported in constrained output",
}
Ranges = list[tuple[int, int]]


def _bad(where: str, pattern: str, problem: str) -> InvalidInputError:
    shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
    return InvalidInputError(f"json_schema at {where or '(root)'}.pattern {shown!r}: {problem}; fix the pattern")


def pattern_to_gbnf(pattern: str, where: str = "") -> str:
    """GBNF for the characters between the quotes of a JSON string that matches `pattern` (unanchored sides
    match anything, as in JSON Schema). Raises InvalidInputError naming the problem."""
    tree = parse(pattern, where)
    return _Emitter(pattern, where).top(tree)


def expanded_size(pattern: str, where: str = "") -> int:
    """Grammar elements `pattern` unrolls to (after the checks `parse` makes)."""
    return _size(list(parse(pattern, where).data), pattern, where)


def parse(pattern: str, where: str = "") -> Any:
    depth = max_depth(pattern)
    if depth > MAX_NESTING:
        raise _bad(where, pattern, f"groups are nested {depth} deep; the limit is {MAX_NESTING}")
    try:
        tree = sre.parse(pattern)
    except re.error as exc:
        raise _bad(where, pattern, f"not a valid regular expression ({exc})") from None
    except (OverflowError, RecursionError) as exc:
        raise _bad(where, pattern, f"not a usable regular expression ({exc})") from None
    if tree.state.flags & ~(C.SRE_FLAG_UNICODE):
        raise _bad(where, pattern, "inline flags such as (?i) are not supported; spell the cases out: [Aa]")
    expanded = _size(tree.data, pattern, where)
    if expanded > MAX_EXPANDED:
        raise _bad(where, pattern, f"expands to {expanded:,} grammar elements (the limit is {MAX_EXPANDED:,})")
    return tree


def max_depth(pattern: str) -> int:
    """Deepest group nesting, counted without parsing (a very deep pattern would exhaust the parser's stack)."""
    depth = best = 0
    escaped = in_class = False
    for ch in pattern:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
            best = max(best, depth)
        elif ch == ")":
            depth = max(0, depth - 1)
    return best


def _size(items: list[Any], pattern: str, where: str) -> int:
    """Elements the grammar holds once every quantifier is expanded; checks each bound on the way."""
    total = 0
    for op, av in items:
        if op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
            lo, hi, sub = av
            bound = lo if hi == C.MAXREPEAT else hi
            if bound > MAX_REPEAT:
                raise _bad(where, pattern, f"a quantifier allows {bound:,} repetitions; the limit is {MAX_REPEAT}")
            total += _size(list(sub), pattern, where) * max(bound, 1)
        elif op == C.BRANCH:
            total += sum(_size(list(b), pattern, where) for b in av[1])
        elif op in (C.SUBPATTERN, C.ATOMIC_GROUP):
            total += _size(list(_group_body(op, av)), pattern, where)
        else:
            total += 1
        if total > MAX_EXPANDED:
            return total
    return total


class _Emitter:
    def __init__(self, pattern: str, where: str) -> None:
        self.pattern = pattern
        self.where = where

    def fail(self, problem: str) -> InvalidInputError:
        return _bad(self.where, self.pattern, problem)

    def top(self, tree: Any) -> str:
        items = list(tree.data)
        branches = [list(b) for b in items[0][1][1]] if len(items) == 1 and items[0][0] == C.BRANCH else [items]
        alts = [self.anchored(b) for b in branches]
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

    def anchored(self, items: list[Any]) -> str:
        """One top-level alternative: a missing ^ or $ lets any characters come before or after."""
        begin = bool(items) and items[0][0] == C.AT and items[0][1] in (C.AT_BEGINNING, C.AT_BEGINNING_STRING)
        end = len(items) > begin and items[-1][0] == C.AT and items[-1][1] in (C.AT_END, C.AT_END_STRING)
        core = self.seq(items[1 if begin else 0 : len(items) - 1 if end else len(items)])
        anything = self.charset([], negate=True) + "*"
        if not core:
            return "" if begin and end else anything
        return " ".join(([] if begin else [anything]) + [core] + ([] if end else [anything]))

    def seq(self, items: list[Any]) -> str:
        out: list[str] = []
        literal: list[int] = []
        for op, av in items:
            if op == C.LITERAL and _safe(av):
                literal.append(av)
                continue
            if literal:
                out.append(_literal(literal))
                literal = []
            out.append(self.item(op, av))
        if literal:
            out.append(_literal(literal))
        return " ".join(o for o in out if o)

    def item(self, op: Any, av: Any) -> str:
        if op in UNSUPPORTED:
            raise self.fail(UNSUPPORTED[op])
        if op == C.LITERAL:
            return self.charset([(av, av)], negate=False)
        if op == C.NOT_LITERAL:
            return self.charset([(av, av)], negate=True)
        if op == C.ANY:
            return self.charset(NEWLINES, negate=True)
        if op == C.CATEGORY:
            ranges, negate = CATEGORIES[av]
            return self.charset(ranges, negate)
        if op == C.IN:
            return self.klass(av)
        if op == C.BRANCH:
            # an empty alternative becomes `?` on the group: llama.cpp's parser has crashed on empty bodies
            alts = [self.seq(list(b)) for b in av[1]]
            body = " | ".join(a for a in alts if a)
            return "" if not body else f"({body})?" if not all(alts) else f"({body})"
        if op in (C.SUBPATTERN, C.ATOMIC_GROUP):
            if op == C.SUBPATTERN and (av[1] or av[2]):
                raise self.fail("inline flags such as (?i:...) are not supported; spell the cases out: [Aa]")
            body = self.seq(list(_group_body(op, av)))
            return f"({body})" if body else ""
        if op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
            return self.repeat(*av)
        if op == C.AT:
            raise self.fail("anchors (^, $, \\b, \\B) are only supported as ^ at the start and $ at the end")
        raise self.fail(f"the construct {op} is not supported in constrained output")

    def repeat(self, lo: int, hi: int, sub: Any) -> str:
        body = self.seq(list(sub))
        if not body:
            return ""
        unit = f"({body})"
        if hi == C.MAXREPEAT:
            return f"{unit}*" if lo == 0 else f"{unit}+" if lo == 1 else f"{unit}{{{lo},}}"
        if (lo, hi) == (0, 1):
            return f"{unit}?"
        return unit if lo == hi == 1 else f"{unit}{{{lo}}}" if lo == hi else f"{unit}{{{lo},{hi}}}"

    def klass(self, items: list[Any]) -> str:
        negate = bool(items) and items[0][0] == C.NEGATE
        ranges: Ranges = []
        for op, av in items[1:] if negate else items:
            if op == C.LITERAL:
                ranges.append((av, av))
            elif op == C.RANGE:
                ranges.append(av)
            elif op == C.CATEGORY:
                cat, cat_negate = CATEGORIES[av]
                ranges.extend(_complement(cat) if cat_negate else cat)
            else:
                raise self.fail(f"the class item {op} is not supported")
        return self.charset(ranges, negate)

    def charset(self, ranges: Ranges, negate: bool) -> str:
        chosen = _complement(ranges) if negate else _merge(ranges)
        safe = _subtract(chosen, [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), SURROGATES])
        alts = [f"[{''.join(_class_range(lo, hi) for lo, hi in safe)}]"] if safe else []
        alts += [f'"{esc}"' for cp, esc in JSON_NAMED.items() if _contains(chosen, cp)]
        if not alts:
            raise self.fail("a character class admits no character")
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _group_body(op: Any, av: Any) -> Any:
    return av if op == C.ATOMIC_GROUP else av[-1]  # (group, add_flags, del_flags, body) for SUBPATTERN


def _safe(cp: int) -> bool:
    """A character that appears as itself inside a JSON string."""
    return cp >= 0x20 and cp not in (0x22, 0x5C) and not SURROGATES[0] <= cp <= SURROGATES[1]


def _escape(cp: int, special: str) -> str:
    ch = chr(cp)
    if ch in special:
        return "\\" + ch
    if 0x20 <= cp < 0x7F:
        return ch
    return f"\\x{cp:02X}" if cp <= 0xFF else f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"


def _literal(cps: list[int]) -> str:
    return '"' + "".join(_escape(cp, '"\\') for cp in cps) + '"'


def _class_range(lo: int, hi: int) -> str:
    special = "]\\-^["
    return _escape(lo, special) if lo == hi else f"{_escape(lo, special)}-{_escape(hi, special)}"


def _merge(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: Ranges) -> Ranges:
    out: Ranges = []
    nxt = 0
    for lo, hi in _merge(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= UNICODE_MAX:
        out.append((nxt, UNICODE_MAX))
    return out


def _subtract(ranges: Ranges, remove: Ranges) -> Ranges:
    keep = _complement(remove)
    out = [(max(a, c), min(b, d)) for a, b in ranges for c, d in keep if max(a, c) <= min(b, d)]
    return _merge(out)


def _contains(ranges: Ranges, cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)
