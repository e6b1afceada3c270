"""Symbol-aware chunking with tree-sitter (functions, classes, methods), overlapping line windows otherwise."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from gpubox.tools.search.preprocess import first_branch, without_macros
from gpubox.tools.search.symbols import (
    CONTAINERS,
    GRAMMAR,
    MEMBER_CONTAINERS,
    MERGE_CLAUSES,
    METHOD_PARENTS,
    SPLIT_WRAPPERS,
    SYMBOLS,
    Sym,
    classify,
    merge_clauses,
)

log = logging.getLogger("gpubox.search")

# Bumped when chunk boundaries change: an index built by an older chunker re-chunks every file on its next run.
# 2: symbols for C#, Ruby, PHP, Kotlin, Swift, Scala, Bash, Lua, Zig, Elixir and Haskell.
# 3: a `.h` file holding C++ is chunked by the C++ grammar (walker.refine_language).
# 4: C/C++ forward declarations are no symbols; `Cord::Append` is method Append of Cord; `template <...>` included.
# 5: C/C++ parsed with the macros that break definitions blanked (without_macros).
# 6: a C++ namespace is always split into its members; `typedef struct {...} name` is struct `name`.
# 7: what a split namespace or module holds between its members is kept however short.
# 8: ...but not a `#endif` or `end # module` alone, nor the lines of a member class split inside it.
# 9: a C++ line that is only an argument-less macro (`FMT_BEGIN_NAMESPACE`) is blanked before parsing; C# that
#    does not parse is parsed again as if every `#if` held (first_branch).
# 10: lines are cut at \n only, as tree-sitter counts them (a form feed no longer shifts every later chunk by a
#     line); a file with something in it but no symbol and under three lines (`from .x import A`) is one chunk.
# 11: a C++ class head with an attribute macro and a `[[nodiscard]]` (googletest's `class GTEST_API_ [[nodiscard]]
#     UnitTest {`) is read as a class: it was a function, and the rest of gtest.h one long method; a macro after a
#     parameter list (`now() SPDLOG_NOEXCEPT {`) is blanked.
# 12: a C++ statement macro with arguments at the start of a line (`GMOCK_DEFINE_..._(unsigned char, '\0');`) is
#     blanked: googletest's gmock-actions.h from there on was one function, `struct negation` no symbol.
CHUNKER_VERSION = 12
# a line longer than this (data: an inline image, a string table) keeps its start only; the line count stays
HUGE_LINE, KEPT_OF_HUGE = 100_000, 1_000
MAX_LINES = 80  # a symbol longer than this is split (classes into members, functions into windows)
WINDOW = 60
SHORT_FILE_CHARS = 2_000  # a file of under three lines and no symbol is one chunk up to this size
OVERLAP = 10

# a line that holds nothing to search: braces (and a comment after them), a comment, a closing `end`, a C/C++
# conditional (`#endif`); `#define kMax 5` or `/* c */ int x = 1;` hold something
_TRIVIAL_C = re.compile(
    r"\s*[{}()\[\];,]*\s*(?://.*|/\*(?:(?!\*/).)*(?:\*/)?|\*.*)?\s*|\s*#\s*(?:if|ifdef|ifndef|elif|else|endif)\b.*"
)
_TRIVIAL_HASH = re.compile(r"\s*(?:[{}()\[\];,]*|end)\s*(?:#.*)?")  # Ruby, Elixir: `end # module Foo`


def _trivial(line: str, language: str) -> bool:
    return bool((_TRIVIAL_HASH if language in ("ruby", "elixir") else _TRIVIAL_C).fullmatch(line))


LEADING = ("@", "#[", "//", "/*", "*", "# ", "--", '"""')  # decorators, attributes and comments above a symbol
COMMENTS = tuple(m for m in LEADING if m != '"""')  # a docstring's closing quotes end a class header


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


# no brace opens their bodies (`def f(x)`, `def f(x) do`, `f :: Int -> Int`): a line that does not end on a
# continuation ends the signature; Scala and Kotlin `def f(x: Int): Int =` end on `=`
_OPEN_ENDED = {"ruby", "lua", "bash", "elixir", "haskell"}
_ENDS = {"scala": ("=",), "kotlin": ("=",)}


def _signature(lines: list[str], start: int, language: str = "") -> str:
    """The opening line(s) of a definition: up to the line that opens its body (at most 4 lines)."""
    out = []
    for line in lines[start : start + 4]:
        out.append(line.strip())
        end = line.rstrip()
        if end.endswith((":", "{", "=>", *_ENDS.get(language, ()))) or "{" in line:
            break
        if language in _OPEN_ENDED and not end.endswith((",", "(", "\\", "|")):
            break
    return " ".join(out)


def _parser(language: str) -> Any | None:
    try:
        from tree_sitter_language_pack import get_parser

        return get_parser(GRAMMAR.get(language, language))  # type: ignore[arg-type]
    except Exception as exc:  # grammar missing: fall back to windows
        log.debug("no tree-sitter grammar for %s: %s", language, exc)
        return None


_BATS_TEST = re.compile(r"^(\s*)@test\s+(.+?)\s*\{\s*$")


def _bats(lines: list[str]) -> tuple[str, dict[int, str]]:
    """bats-core's `@test "name" {` is no shell: parse it as a function (same line count), named by its label."""
    names: dict[int, str] = {}
    out = list(lines)
    for i, line in enumerate(lines):
        m = _BATS_TEST.match(line)
        if m:
            names[i] = m.group(2).strip("\"'")
            out[i] = f"{m.group(1)}bats_test_{i}() {{"
    return "\n".join(out), names


def _parse(parser: Any, src: bytes, language: str) -> Any:
    """The syntax tree of `src`, read around what the grammar cannot (the byte offsets are the source's)."""
    if language in ("c", "cpp"):
        return parser.parse(without_macros(src, language == "cpp"))
    tree = parser.parse(src)
    if language == "csharp" and tree.root_node.has_error and b"#" in src:
        tree = parser.parse(first_branch(src))  # only then: a definition written in an #else branch is kept
    return tree


def split_lines(text: str) -> list[str]:
    """Lines as tree-sitter numbers them: cut at \\n only (str.splitlines also cuts at \\f, \\v, \\x85, \\u2028, which
    would put every chunk after a form feed a line off its symbol). `text` has \\r\\n and a lone \\r as \\n already."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _newlines(text: str) -> str:
    """\\r\\n as \\n before parsing and cutting; a lone \\r too, but only in a file with no \\n (classic Mac): in any
    other file it is a stray byte that grep, sed and git count as no line break either."""
    if "\r" not in text:
        return text
    text = text.replace("\r\n", "\n")
    return text if "\n" in text else text.replace("\r", "\n")


def chunk_text(text: str, language: str) -> list[Chunk]:
    text = _newlines(text)
    lines = split_lines(text)
    if not lines:
        return []
    if any(len(line) > HUGE_LINE for line in lines):  # a 20 MB line was one 20 MB chunk (4.8 GB of RAM to index)
        lines = [line if len(line) <= HUGE_LINE else line[:KEPT_OF_HUGE] + " …" for line in lines]
        text = "\n".join(lines)
    kinds = SYMBOLS.get(language)
    parser = _parser(language) if kinds else None
    if parser is None or kinds is None:
        return windows(lines, 0, len(lines), None, "window")
    labels: dict[int, str] = {}
    if language == "bash" and any(line.lstrip().startswith("@test") for line in lines):
        text, labels = _bats(lines)
    src = text.encode()
    tree = _parse(parser, src, language)
    containers = CONTAINERS | MEMBER_CONTAINERS.get(language, set())
    out: list[Chunk] = []
    covered = [False] * len(lines)
    wrapped = [False] * len(lines)  # inside a namespace or module split into its members

    def emit(sym: Sym, parent_kind: str | None, parent: str | None = None) -> None:
        kind, name = sym.kind, labels.get(sym.start, sym.name)
        if kind == "function" and parent_kind in METHOD_PARENTS:
            kind = "method"
        parent = sym.parent or parent
        s, e = sym.start, sym.end
        sig = _signature(lines, sym.node.start_point[0], language)  # the def line, not an Elixir @doc above it
        # decorators/comments directly above belong to the symbol
        while s > 0 and not covered[s - 1] and lines[s - 1].lstrip().startswith(LEADING):
            s -= 1
        inner = _symbol_children(sym.node) if kind in containers else []
        wrapper = kind == SPLIT_WRAPPERS.get(language) and (
            (kind == "namespace" and bool(inner)) or any(c.kind in containers for c in inner)
        )
        if (e - s + 1 <= MAX_LINES and not wrapper) or not inner:
            _span(s, e, name, kind, parent, sig)  # one chunk, or windows when long (a long function)
            return
        if wrapper:
            # what sits between its members is kept, however short (below); a member's own lines are its own (a
            # split class inside re-marks only its gaps)
            for i in range(s, e + 1):
                wrapped[i] = True
            for child in inner:
                for i in range(child.start, child.end + 1):
                    wrapped[i] = False
        if inner[0].start > sym.start:  # else `namespace a { class Z {}; }`: the member holds the head line
            header_end = max(s, inner[0].start - 1)
            while header_end > s and lines[header_end].lstrip().startswith(COMMENTS):
                header_end -= 1  # the first member's doc comment and decorators are its own
            _span(s, header_end, name, kind, parent, sig)  # a long preamble (a Lua config table) is windowed
        for child in inner:
            emit(child, kind, name)

    def _span(s: int, e: int, name: str | None, kind: str, parent: str | None, sig: str | None) -> None:
        """Lines s..e (0-based, inclusive) as one chunk, or as windows when longer than MAX_LINES; marked covered."""
        if e - s + 1 <= MAX_LINES:
            out.append(Chunk(s + 1, e + 1, "\n".join(lines[s : e + 1]), name, kind, parent))
        else:
            out.extend(windows(lines, s, e + 1, name, kind, parent, sig))
        for i in range(s, e + 1):
            covered[i] = True

    def _symbol_children(node: Any) -> list[Sym]:
        found: list[Sym] = []
        stack = list(reversed(node.named_children))
        while stack:
            n = stack.pop()
            sym = classify(language, n, src) if n.type in kinds else None
            if sym is not None:
                found.append(sym)
            elif not (n.type == "variable_declarator" and n.type in kinds):
                # an Elixir call that is no def, a Lua table, may hold definitions; JS `const x = 1` holds none
                stack.extend(reversed(n.named_children))
        return merge_clauses(found) if language in MERGE_CLAUSES else found

    try:
        for top in _symbol_children(tree.root_node):
            emit(top, None)
    except RecursionError:  # ~1,000 nested namespaces or classes failed the whole index: this file as windows
        return windows(lines, 0, len(lines), None, "window")

    # module-level code between symbols (imports, constants, scripts) as windows
    i = 0
    while i < len(lines):
        if covered[i]:
            i += 1
            continue
        j = i
        while j < len(lines) and not covered[j]:
            j += 1
        # a short gap at the top level is blank lines and an import or two; inside a split namespace or module it
        # is what that namespace holds besides its members (`constexpr int kMax = 5;`), so it is kept
        solid = sum(1 for k in range(i, j) if lines[k].strip())
        if solid >= 3 or any(wrapped[k] and not _trivial(lines[k], language) for k in range(i, j)):
            out.extend(windows(lines, i, j, None, "module"))
        i = j
    # a file of one or two lines and no symbol (`pub use x::Y;`, `export * from './a'`) is still found; not one that
    # holds only braces or comments, nor a one-line bundle (`!function(){...}()`, no `.min.js` name to skip it by)
    if not out and len(text) <= SHORT_FILE_CHARS and not all(_trivial(line, language) for line in lines):
        out = windows(lines, 0, len(lines), None, "module")
    out.sort(key=lambda c: (c.start_line, c.end_line))
    return out
