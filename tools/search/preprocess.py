"""C, C++ and C# source made readable to tree-sitter without moving a byte: the macros that break a definition's
parse blanked (without_macros), and every `#if` taken as held (first_branch). The chunker parses the result and
keeps the original's offsets and lines."""

from __future__ import annotations

import re

# C/C++ macros tree-sitter cannot expand, where they break a definition's parse: attribute macros between `class`
# and the class's name (`class ABSL_LOCKABLE Mutex {`, `struct FMT_EXPORT context {`), which make the grammar read
# the class as a function named after the macro, and in C++ a line-leading attribute macro before a function's type
# (`ABSL_MUST_USE_RESULT bool Foo(...)`). Blanked with spaces, so every byte and line keeps its place. In C++ also
# a line that is only a macro with no arguments (`NLOHMANN_JSON_NAMESPACE_BEGIN`, `FMT_BEGIN_NAMESPACE`,
# `ABSL_NAMESPACE_BEGIN`): such a namespace-opening macro before `namespace detail {` made the grammar read the whole
# file as one function named `namespace`, so nlohmann-json's `binary_reader` was no symbol at all. A macro with
# arguments alone on its line (`TEST(Suite, Name)` above its body) is left alone.
_MACRO = r"[A-Z][A-Z0-9_]{2,}(?:\([^()\n]*\))?"
# the class's name follows: not `final` (`class RGB final {` names RGB), then a base list, template arguments, a
# body's brace (not a brace initialiser `struct RGB_COLOR c{1, 2, 3};`) or the end of the line
_ATTRIBUTE = r"\[\[[^\[\]\n]*\]\]"  # C++11 `[[nodiscard]]`: alone the grammar reads it, beside a macro it does not
_CLASS_MACROS = re.compile(
    rf"\b(?:class|struct|union|enum(?:[ \t]+(?:class|struct))?)[ \t]+((?:(?:{_MACRO}|{_ATTRIBUTE})[ \t]+){{1,4}})"
    rf"(?=(?!final\b)[A-Za-z_]\w*(?:[ \t]+final)?(?:[ \t]*[:<]|[ \t]+\{{|[ \t]*\{{?[ \t]*\r?$))".encode(),
    re.MULTILINE,
)
# at most four macros, and not before a `const`/`volatile`/`__stdcall` that shows the ALL_CAPS word is the type
_LEADING_ATTRIBUTE = re.compile(
    rb"^[ \t]*((?:[A-Z][A-Z0-9]*_[A-Z0-9_]+(?:\([^()\n]*\))?[ \t]+){1,4})"
    rb"(?=(?!(?:const|volatile|__\w+)\b)[A-Za-z_][\w:<>,*& \t]*[ \t*&]~?(?:\w+::)*~?\w+[ \t]*\()",
    re.MULTILINE,
)
# at the start of its line with no `;` after it: an indented `SOME_CONSTANT` ending an expression or an enum is no
# namespace macro (and one blank run, not two around an optional character, keeps the match linear)
_MACRO_LINE = re.compile(rb"^([A-Z][A-Z0-9]*_[A-Z0-9_]+)[ \t]*(?://[^\n]*)?\r?$", re.MULTILINE)
# a statement macro with arguments at the start of its line, ended by `;` (googletest's
# `GMOCK_DEFINE_DEFAULT_ACTION_FOR_RETURN_TYPE_(unsigned char, '\0');`): type arguments are no expression the
# grammar reads, and its error recovery made one function of the 300 lines after them, `struct negation` and a dozen
# other definitions inside it. Column 0 only (namespace scope); `TEST(Suite, Name)` before a body has no `;`.
_MACRO_STATEMENT = re.compile(
    rb"^([A-Z][A-Z0-9]*_[A-Z0-9_]*\((?:[^()\n]|\([^()\n]*\))*\)[ \t]*;)[ \t]*(?://[^\n]*)?\r?$", re.MULTILINE
)
# after a parameter list (and `const`, `&`), before the body, `;`, an initialiser list, `= default` or the line's end:
# spdlog's `now() SPDLOG_NOEXCEPT {` made the grammar drop the function (a declaration's `SPDLOG_NOEXCEPT;` too)
_TRAILING_MACRO = re.compile(
    rb"\)[ \t]*(?:const[ \t]*)?(?:&&?[ \t]*)?([A-Z][A-Z0-9]*_[A-Z0-9_]+(?:\([^()\n]*\))?"
    rb"(?:[ \t]+[A-Z][A-Z0-9]*_[A-Z0-9_]+(?:\([^()\n]*\))?){0,2}[ \t]*)"
    rb"(?=override\b|final\b|[{;:=]|\r?$)",
    re.MULTILINE,
)


_HASH_LINE = re.compile(rb"[ \t]*#")  # a preprocessor line


_LINE_COMMENT = re.compile(rb"[ \t]*(?://|/\*|\*)")
_ENDS_STATEMENT = re.compile(rb"(?:[;{}:]|^[ \t]*#.*)[ \t]*(?://.*|/\*.*\*/)?\r?$")


def _starts_statement(src: bytes, pos: int) -> bool:
    """Whether the line at `pos` begins a statement: the file's first code line, or the last code line above it
    (comments and blank lines skipped) ends one (`;`, a brace, a label's or access specifier's `:`) or is a
    preprocessor line. Not `const int n =` / `ARRAY_SIZE(x);`, whose blanked end would take the next definition in,
    nor a `#define`'s continued body (its line ends with a backslash)."""
    end = pos - 1  # the newline before this line
    for _ in range(64):  # a long comment above it: counted as the start of a statement
        if end < 0:
            return True
        start = src.rfind(b"\n", 0, end) + 1
        line = src[start:end]
        if line.strip() and not _LINE_COMMENT.match(line):
            return bool(_ENDS_STATEMENT.search(line)) and not line.rstrip().endswith(b"\\")
        end = start - 1
    return True


def _blank(
    src: bytes, pattern: re.Pattern[bytes], group: int, code_only: bool = False, after_statement: bool = False
) -> bytes:
    """`src` with each match's `group` as spaces; `code_only`: not on a preprocessor line (`#define X(a) FOO(a)`
    blanked to an empty value makes the grammar take the next line as the macro's body); `after_statement`: only a
    match on a line that begins a statement (_starts_statement)."""
    out = bytearray(src)
    seen, directive = 0, bool(_HASH_LINE.match(src))  # the line of the previous match, searched on from there
    for m in pattern.finditer(src):
        a, b = m.span(group)
        if after_statement and not _starts_statement(src, a):
            continue
        if code_only:
            newline = src.rfind(b"\n", seen, a)
            if newline >= 0:
                directive = bool(_HASH_LINE.match(src, newline + 1))
            seen = a
            if directive:
                continue
        out[a:b] = b" " * (b - a)
    return bytes(out)


_DIRECTIVE = re.compile(rb"[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b")


def first_branch(src: bytes) -> bytes:
    """`src` as if every `#if` held: directive lines and `#elif`/`#else` branches blanked (same length, same lines).
    A directive inside a declaration (C#'s `partial class JsonReader` / `#if HAVE_ASYNC_DISPOSABLE` / `: IAsync...`)
    made the grammar name the class after the condition; two branches that each open a body broke the braces."""
    out = bytearray(src)
    skipping: list[bool] = []  # per open #if: is this line in a branch after the first
    later = 0  # how many of them are (so a line's test does not walk the stack)
    pos = 0
    for line in src.splitlines(keepends=True):
        m = _DIRECTIVE.match(line)
        blank = later > 0
        if m:
            word = m.group(1)
            if word in (b"if", b"ifdef", b"ifndef"):
                skipping.append(False)
            elif word in (b"elif", b"else") and skipping and not skipping[-1]:
                skipping[-1] = True
                later += 1
            elif word == b"endif" and skipping:
                later -= skipping.pop()
            blank = True
        if blank:
            end = len(line.rstrip(b"\r\n"))
            out[pos : pos + end] = b" " * end
        pos += len(line)
    return bytes(out)


def without_macros(src: bytes, cpp: bool = True) -> bytes:
    """`src` with the macros that break C/C++ definitions blanked (same length, same lines)."""
    src = _blank(src, _CLASS_MACROS, 1)
    if not cpp:
        return src
    src = _blank(_blank(src, _LEADING_ATTRIBUTE, 1), _MACRO_LINE, 1)
    return _blank(_blank(src, _MACRO_STATEMENT, 1, after_statement=True), _TRAILING_MACRO, 1, code_only=True)
