"""Symbol chunking (tools/search/chunker.py, symbols.py) of the languages of semble's code-search benchmark beyond
the first eight: each grammar's definitions become (symbol, kind) chunks, methods know their class, and a class
longer than MAX_LINES is cut into its members. Tree-sitter only: no embedding model is loaded."""

from __future__ import annotations

import pytest

from gpubox.tools.search.chunker import MAX_LINES, Chunk, chunk_text, first_branch
from gpubox.tools.search.walker import language_of, refine_language

CSHARP = """\
using System;

namespace Dapper.Tests
{
    /// <summary>Reads rows.</summary>
    public interface IRowReader { object Read(int index); }

    public struct Point
    {
        public int X;
        public Point(int x) { X = x; }
        public int Twice() => X * 2;
    }

    public enum Color { Red, Green }

    public record Person(string Name);

    [Serializable]
    public class SqlMapper : IRowReader
    {
        private int _count;

        public SqlMapper() { _count = 0; }

        /// <summary>Reads one row.</summary>
        public object Read(int index)
        {
            _count++;
            return index;
        }

        public static SqlMapper operator +(SqlMapper a, SqlMapper b) => a;
        public static explicit operator int(SqlMapper m) => m._count;
    }
}
"""

RUBY = """\
require "rack"

module Sinatra
  # Lets a request be read.
  class Request < Rack::Request
    def accept?(type)
      preferred_type(type)
    end

    def self.build(env)
      new(env)
    end
  end

  module Helpers
    def status(value = nil)
      response.status = value
    end
  end
end

def helper(x)
  x
end
"""

PHP = """\
<?php declare(strict_types=1);

namespace Monolog\\Handler;

use Monolog\\Logger;

/**
 * Base handler.
 */
abstract class AbstractHandler implements HandlerInterface
{
    protected int $level = Logger::DEBUG;

    public function __construct(int $level = Logger::DEBUG)
    {
        $this->level = $level;
    }

    #[\\ReturnTypeWillChange]
    public function isHandling(array $record): bool
    {
        return $record['level'] >= $this->level;
    }
}

interface HandlerInterface
{
    public function handle(array $record): bool;
}

trait ProcessableHandlerTrait
{
    public function pushProcessor(callable $callback): self
    {
        return $this;
    }
}

enum Level: int
{
    case Debug = 100;

    public function getName(): string
    {
        return 'DEBUG';
    }
}

function helper($x)
{
    return $x;
}
"""

KOTLIN = """\
package io.ktor.server.application

import kotlinx.coroutines.CoroutineScope

/** The running application. */
class Application(val environment: String) : CoroutineScope {
    fun start(wait: Boolean = false): Application {
        return this
    }

    companion object Factory {
        fun create(): Application = Application("test")
    }
}

interface Plugin<T> {
    fun install(pipeline: T)
}

object Registry {
    fun register(name: String) {}
}

enum class Color {
    RED;

    fun hex(): Int = 1
}

fun <T> List<T>.second(): T = this[1]
"""

SWIFT = """\
import Foundation

/// A session.
open class Session {
    public let id: Int

    public init(id: Int) {
        self.id = id
    }

    /// Makes a request.
    @discardableResult
    open func request(_ url: String) -> DataRequest {
        return DataRequest()
    }
}

public struct Point {
    var x: Int
    func norm() -> Int { x }
}

enum Method: String {
    case get
    func lowercased() -> String { rawValue }
}

protocol Handler {
    func handle(_ request: Request) async throws -> Response
}

extension Session: Handler {
    func handle(_ request: Request) async throws -> Response { fatalError() }
}

func topLevel<T>(_ x: T) -> T { x }
"""

SCALA = """\
package cats
package data

import cats.syntax.all._

/** Represents a function `A => F[B]`. */
final case class Kleisli[F[_], A, B](run: A => F[B]) { self =>
  def map[C](f: B => C)(implicit F: Functor[F]): Kleisli[F, A, C] =
    Kleisli(a => F.map(run(a))(f))
}

object Kleisli extends KleisliInstances {
  def pure[F[_], A, B](x: B): Kleisli[F, A, B] = ???
}

trait Functor[F[_]] {
  def fmap[A, B](fa: F[A])(f: A => B): F[B]
}

enum Color {
  case Red
  def hex: Int = 1
}

extension (s: String)
  def shout: String = s.toUpperCase

def top(x: Int): Int = x
"""

BASH = """\
#!/usr/bin/env bash
set -e

# Prints the version.
nvm_version() {
  local PATTERN
  PATTERN="${1-}"
  echo "$PATTERN"
}

function nvm_ls_remote {
  nvm_version "$@"
}

main "$@"
"""

BATS = """\
#!/usr/bin/env bats

load test_helper

@test "bats runs a passing test" {
  run bats "$FIXTURE_ROOT/passing.bats"
  [ "$status" -eq 0 ]
}

setup() {
  make_bats_test_suite_tmpdir
}
"""

LUA = """\
--- Lazy config.
local M = {}

---@param opts table
function M.setup(opts)
  M.opts = opts
end

function M.Foo:bar(x)
  return self
end

local function helper(a, b)
  return a + b
end

M.handler = function(ev)
  return ev
end

M.task = {
  skip = function(plugin)
    return false
  end,
  name = "task",
}

return M
"""

ZIG = """\
const std = @import("std");

/// A parser.
pub const Parser = struct {
    allocator: std.mem.Allocator,

    pub fn init(allocator: std.mem.Allocator) Parser {
        return .{ .allocator = allocator };
    }

    fn deinit(self: *Parser) void {
        _ = self;
    }
};

pub const Color = enum {
    red,
    green,

    pub fn isRed(c: Color) bool {
        return c == .red;
    }
};

pub fn main() !void {
    std.debug.print("hi\\n", .{});
}

test "parser init" {
    try std.testing.expect(true);
}
"""

ELIXIR = """\
defmodule Plug.Conn do
  @moduledoc \"\"\"
  The connection.
  \"\"\"
  alias Plug.Conn

  defstruct adapter: nil, halted: false

  @doc \"\"\"
  Assigns a value.
  \"\"\"
  @spec assign(t, atom, term) :: t
  def assign(%Conn{assigns: assigns} = conn, key, value) when is_atom(key) do
    %{conn | assigns: Map.put(assigns, key, value)}
  end

  def halt(%Conn{} = conn), do: %{conn | halted: true}
  def halt(conn), do: conn

  defp run_before_send(conn), do: conn

  defmacro __using__(_opts) do
    quote do
      import Plug.Conn
    end
  end

  defmodule NotSentError do
    defexception message: "not sent"
  end

  defprotocol Size do
    def size(data)
  end

  defimpl Size, for: Map do
    def size(map), do: map_size(map)
  end
end
"""

HASKELL = """\
{-# LANGUAGE OverloadedStrings #-}
-- | JSON values.
module Data.Aeson.Types
  ( Value(..)
  , decode
  ) where

import qualified Data.Text as T

-- | A JSON value.
data Value = Object Object | Null
  deriving (Eq, Show)

newtype Parser a = Parser { runParser :: a }

-- | Types that can be parsed.
class FromJSON a where
  parseJSON :: Value -> Parser a
  parseJSON _ = undefined

instance FromJSON Bool where
  parseJSON (Bool b) = pure b
  parseJSON _ = fail "expected Bool"

-- | Decode a value.
decode :: FromJSON a => ByteString -> Maybe a
decode bs = case parse bs of
  Just v -> Just v
  Nothing -> Nothing

main = do
  print 1
"""

CASES: dict[str, tuple[str, str, set[tuple[str, str]], set[tuple[str, str]]]] = {
    # language: (walker language, source, (symbol, kind) pairs, (method, parent) pairs)
    "csharp": (
        "csharp",
        CSHARP,
        {
            ("IRowReader", "interface"),
            ("Point", "struct"),
            ("Color", "enum"),
            ("Person", "class"),
            ("SqlMapper", "class"),
        },
        set(),
    ),
    "ruby": (
        "ruby",
        RUBY,
        {("Sinatra", "module"), ("Request", "class"), ("Helpers", "module"), ("helper", "method")},
        {("Request", "Sinatra"), ("Helpers", "Sinatra")},  # a module wrapping classes is split
    ),
    "php": (
        "php",
        PHP,
        {
            ("AbstractHandler", "class"),
            ("HandlerInterface", "interface"),
            ("ProcessableHandlerTrait", "trait"),
            ("Level", "enum"),
            ("helper", "function"),
        },
        set(),
    ),
    "kotlin": (
        "kotlin",
        KOTLIN,
        {
            ("Application", "class"),
            ("Plugin", "interface"),
            ("Registry", "class"),
            ("Color", "enum"),
            ("second", "function"),
        },
        set(),
    ),
    "swift": (
        "swift",
        SWIFT,
        {
            ("Session", "class"),
            ("Point", "struct"),
            ("Method", "enum"),
            ("Handler", "interface"),
            ("Session", "impl"),
            ("topLevel", "function"),
        },
        set(),
    ),
    "scala": (
        "scala",
        SCALA,
        {
            ("Kleisli", "class"),
            ("Functor", "trait"),
            ("Color", "enum"),
            ("String", "impl"),
            ("top", "function"),
        },
        set(),
    ),
    "bash": ("bash", BASH, {("nvm_version", "function"), ("nvm_ls_remote", "function")}, set()),
    "bats": ("bash", BATS, {("bats runs a passing test", "function"), ("setup", "function")}, set()),
    "lua": (
        "lua",
        LUA,
        {("setup", "function"), ("bar", "function"), ("helper", "function"), ("handler", "function")},
        {("setup", "M"), ("bar", "M.Foo"), ("handler", "M")},
    ),
    "zig": (
        "zig",
        ZIG,
        {("Parser", "struct"), ("Color", "enum"), ("main", "function"), ("parser init", "function")},
        set(),
    ),
    "elixir": (
        "elixir",
        ELIXIR,
        {
            ("Plug.Conn", "module"),
            ("assign", "function"),
            ("halt", "function"),
            ("run_before_send", "function"),
            ("__using__", "function"),
            ("NotSentError", "module"),
            ("Size", "interface"),
            ("Size.Map", "impl"),
        },
        {("assign", "Plug.Conn"), ("NotSentError", "Plug.Conn"), ("Size.Map", "Plug.Conn")},
    ),
    "haskell": (
        "haskell",
        HASKELL,
        {
            ("Value", "type"),
            ("Parser", "type"),
            ("FromJSON", "class"),
            ("Bool", "impl"),
            ("decode", "function"),
            ("main", "function"),
        },
        set(),
    ),
}


def _pairs(chunks: list[Chunk]) -> set[tuple[str, str]]:
    return {(c.symbol, c.kind) for c in chunks if c.symbol}


def _one(chunks: list[Chunk], symbol: str, kind: str | None = None) -> Chunk:
    found = [c for c in chunks if c.symbol == symbol and (kind is None or c.kind == kind)]
    assert len(found) == 1, (symbol, [(c.symbol, c.kind, c.start_line) for c in chunks])
    return found[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_symbols_of_each_language(case: str) -> None:
    language, source, expected, parents = CASES[case]
    chunks = chunk_text(source, language)
    assert expected <= _pairs(chunks), sorted(_pairs(chunks))
    for c in chunks:  # chunks are whole lines of the source, in order
        assert c.text == "\n".join(source.splitlines()[c.start_line - 1 : c.end_line])
    for method, parent in parents:
        assert any(c.symbol == method and c.parent == parent for c in chunks), (method, parent)


def test_doc_comments_and_attributes_stay_with_their_symbol() -> None:
    assert _one(chunk_text(CSHARP, "csharp"), "IRowReader").text.lstrip().startswith("/// <summary>Reads rows.")
    assert _one(chunk_text(CSHARP, "csharp"), "SqlMapper").text.lstrip().startswith("[Serializable]")
    assert _one(chunk_text(RUBY, "ruby"), "Request").text.lstrip().startswith("# Lets a request be read.")
    assert _one(chunk_text(PHP, "php"), "AbstractHandler").text.startswith("/**\n * Base handler.")
    assert _one(chunk_text(KOTLIN, "kotlin"), "Application").text.startswith("/** The running application. */")
    assert _one(chunk_text(SWIFT, "swift"), "Session", "class").text.startswith("/// A session.")
    assert chunk_text(SCALA, "scala")[1].text.startswith("/** Represents a function")
    assert _one(chunk_text(BASH, "bash"), "nvm_version").text.startswith("# Prints the version.")
    assert _one(chunk_text(LUA, "lua"), "setup").text.startswith("---@param opts table")
    assert _one(chunk_text(ZIG, "zig"), "Parser").text.startswith("/// A parser.")
    assert _one(chunk_text(HASKELL, "haskell"), "FromJSON").text.startswith("-- | Types that can be parsed.")


def test_elixir_defs_are_calls_but_only_defs_are_symbols() -> None:
    chunks = chunk_text(ELIXIR, "elixir")
    symbols = {c.symbol for c in chunks if c.symbol}
    assert not symbols & {"alias", "defstruct", "quote", "import", "moduledoc", "defexception"}
    # the module wraps another module, so it is split into its members whatever its length
    assert _one(chunks, "Plug.Conn").end_line < _one(chunks, "assign").start_line
    # `@doc \"\"\"...\"\"\"` and `@spec` above a def belong to it; the two `halt` clauses are one symbol
    assert _one(chunks, "assign").text.lstrip().startswith('@doc """')
    halt = _one(chunks, "halt")
    assert halt.end_line - halt.start_line == 1 and halt.text.count("def halt") == 2


def test_haskell_signature_and_equations_are_one_symbol() -> None:
    chunks = chunk_text(HASKELL, "haskell")
    decode = _one(chunks, "decode")
    assert decode.text.startswith("-- | Decode a value.\ndecode :: FromJSON a")
    assert decode.text.rstrip().endswith("Nothing -> Nothing")
    assert "parseJSON" not in {c.symbol for c in chunks}  # short class and instance stay whole
    # a kind annotation inside a type is no definition
    odd = "deriving via (a :: Type) instance FromJSON a => FromJSON (Identity a)\n"
    assert _pairs(chunk_text(odd, "haskell")) == set()


def test_lua_names_and_tables_of_functions() -> None:
    chunks = chunk_text(LUA, "lua")
    assert _one(chunks, "bar").qualified == "M.Foo.bar"
    assert _one(chunks, "task", "module").parent == "M"  # short table with a callback: one chunk
    assert "skip" not in {c.symbol for c in chunks}
    assert "M" not in {c.symbol for c in chunks}  # `local M = {}` holds no function


def test_bats_tests_are_named_by_their_label() -> None:
    chunks = chunk_text(BATS, "bash")
    test = _one(chunks, "bats runs a passing test")
    assert test.start_line == 5 and test.text.startswith('@test "bats runs a passing test" {')
    assert test.end_line == 8


def test_csharp_operators_are_named() -> None:
    long = CSHARP.replace("        private int _count;\n", "        private int _count;\n" + "\n" * MAX_LINES)
    chunks = chunk_text(long, "csharp")
    assert {("operator +", "SqlMapper"), ("operator int", "SqlMapper"), ("Read", "SqlMapper")} <= {
        (c.symbol, c.parent) for c in chunks if c.kind == "method"
    }


# one member per language, repeated until the container passes MAX_LINES
LONG: dict[str, tuple[str, str, str, str, str]] = {
    # language: (opening, member with {i}, closing, container symbol, container kind)
    "csharp": (
        "namespace N\n{\n    public class Big\n    {\n",
        "        /// <summary>Step {i}.</summary>\n        public int step{i}(int x)\n        {\n"
        "            return x + {i};\n        }\n\n",
        "    }\n}\n",
        "Big",
        "class",
    ),
    "ruby": ("class Big\n", "  # Step {i}.\n  def step{i}(x)\n    x + {i}\n  end\n\n", "end\n", "Big", "class"),
    "php": (
        "<?php\n\nclass Big\n{\n",
        "    /** Step {i}. */\n    public function step{i}(int $x): int\n    {\n        return $x + {i};\n    }\n\n",
        "}\n",
        "Big",
        "class",
    ),
    "kotlin": (
        "class Big {\n",
        "    /** Step {i}. */\n    fun step{i}(x: Int): Int {\n        return x + {i}\n    }\n\n",
        "}\n",
        "Big",
        "class",
    ),
    "swift": (
        "struct Big {\n",
        "    /// Step {i}.\n    func step{i}(_ x: Int) -> Int {\n        x + {i}\n    }\n\n",
        "}\n",
        "Big",
        "struct",
    ),
    "scala": (
        "object Big {\n",
        "  /** Step {i}. */\n  def step{i}(x: Int): Int =\n    x + {i}\n\n",
        "}\n",
        "Big",
        "class",
    ),
    "lua": (
        "M.big = {\n",
        "  -- Step {i}.\n  step{i} = function(x)\n    return x + {i}\n  end,\n\n",
        "}\n",
        "big",
        "module",
    ),
    "zig": (
        "pub const Big = struct {\n",
        "    /// Step {i}.\n    pub fn step{i}(x: u32) u32 {\n        return x + {i};\n    }\n\n",
        "};\n",
        "Big",
        "struct",
    ),
    "elixir": (
        "defmodule Big do\n",
        '  @doc "Step {i}."\n  def step{i}(x) do\n    x + {i}\n  end\n\n',
        "end\n",
        "Big",
        "module",
    ),
    "haskell": (
        "module Big where\n\nclass Big a where\n",
        "  -- | Step {i}.\n  step{i} :: a -> Int\n  step{i} _ = {i}\n\n",
        "",
        "Big",
        "class",
    ),
}


@pytest.mark.parametrize("language", sorted(LONG))
def test_long_container_is_split_into_members(language: str) -> None:
    opening, member, closing, name, kind = LONG[language]
    n = MAX_LINES // 4 + 5
    source = opening + "".join(member.replace("{i}", str(i)) for i in range(n)) + closing
    assert len(source.splitlines()) > MAX_LINES
    chunks = chunk_text(source, language)
    head = _one(chunks, name, kind)
    assert head.end_line - head.start_line < 5  # the container's own lines, not its members
    members = [c for c in chunks if c.symbol and c.symbol.startswith("step")]
    assert [c.symbol for c in members] == [f"step{i}" for i in range(n)]
    want = "function" if language in ("elixir", "lua") else "method"  # module functions stay functions
    assert {(c.kind, c.parent) for c in members} == {(want, name)}
    # each member carries its own doc comment, the first one included
    assert all(c.text.lstrip().startswith(("///", "#", "/**", "--", "@doc")) for c in members), members[0].text
    assert all(c.end_line - c.start_line + 1 <= MAX_LINES for c in chunks)


def test_long_bash_function_is_windowed_under_its_name() -> None:
    body = "".join(f'  echo "line {i}"\n' for i in range(MAX_LINES + 20))
    chunks = chunk_text(f"big() {{\n{body}}}\n", "bash")
    assert len(chunks) > 1 and {(c.symbol, c.kind) for c in chunks} == {("big", "function")}
    assert chunks[1].signature == "big() {"


@pytest.mark.parametrize(
    ("name", "language"),
    [
        ("Main.hs", "haskell"),
        ("router.ex", "elixir"),
        ("router_test.exs", "elixir"),
        ("build.gradle.kts", "kotlin"),
        ("span.hxx", "cpp"),
        ("format.ipp", "cpp"),
        ("inline.inl", "cpp"),
        ("run.bats", "bash"),
    ],
)
def test_walker_knows_the_extensions(name: str, language: str) -> None:
    assert language_of(name) == language


@pytest.mark.parametrize(
    ("language", "source", "signature"),
    [
        ("elixir", 'defmodule A do\n  @doc """\n  Big.\n  """\n  def big(x) do\n{body}  end\nend\n', "def big(x) do"),
        ("ruby", "def big(x)\n{body}end\n", "def big(x)"),
        ("lua", "function M.big(x)\n{body}end\n", "function M.big(x)"),
        ("scala", "def big(x: Int): Int =\n{body}\n", "def big(x: Int): Int ="),
    ],
)
def test_windows_of_a_long_function_repeat_its_def_line(language: str, source: str, signature: str) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES + 20))
    chunks = [c for c in chunk_text(source.replace("{body}", body), language) if c.symbol == "big"]
    assert len(chunks) > 1 and chunks[0].signature is None
    assert {c.signature for c in chunks[1:]} == {signature}


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("namespace fmt {\nint f();\n}\n", "cpp"),
        ("template <typename T> struct box { T v; };\n", "cpp"),
        ("class Cord : public Base {\n};\n", "cpp"),
        ("inline std::string name();\n", "cpp"),
        ('#ifdef __cplusplus\nextern "C" {\n#endif\nint uv_run(void *loop);\n', "c"),
        ("struct class_info { int classes; };  /* 'class' in a comment: public: */\n", "c"),
        ("/* This models std::pair. */\ntypedef struct { int a, b; } pair;\n", "c"),  # llvm-c/Types.h
        ("#ifdef __cplusplus\ntemplate <class T> struct wrap;\n# if 1\n#endif\n#endif\nint c_api(void);\n", "c"),
        ("#include <vector>\nint f();\n", "cpp"),
        ("enum class Color { kRed };\n", "cpp"),
    ],
)
def test_a_header_is_cpp_only_when_it_holds_cpp(text: str, language: str) -> None:
    assert refine_language("include/x.h", "c", text) == language
    assert refine_language("src/x.c", "c", text) == "c"  # a .c file is C whatever it holds


CPP_DECLS = """\
namespace absl {
class Cord;
struct Options;
template <typename T> class StatusOr;

// A rope of bytes.
class Cord {
 public:
  void Append(const Cord& src);
};

void Cord::Append(const Cord& src) {
  contents_.AppendTree(src);
}

template <typename T>
T Box<T>::get() const { return v_; }
}  // namespace absl
"""


def test_cpp_forward_declarations_are_no_symbols_and_out_of_line_methods_know_their_class() -> None:
    filler = "\n".join(f"int filler_{i}(int x) {{ return x + {i}; }}" for i in range(MAX_LINES))
    src = CPP_DECLS.replace("}  // namespace absl", filler + "\n}  // namespace absl")
    found = [(c.kind, c.symbol, c.parent) for c in chunk_text(src, "cpp") if "filler" not in (c.symbol or "")]
    assert ("class", "Cord", "absl") in found and found.count(("class", "Cord", "absl")) == 1  # not `class Cord;`
    assert not any(s in ("Options", "StatusOr") for _, s, _ in found)  # declared, never defined here
    assert ("method", "Append", "Cord") in found and ("method", "get", "Box") in found
    get = next(c for c in chunk_text(src, "cpp") if c.symbol == "get")
    assert get.text.startswith("template <typename T>")  # the template line belongs to what it templates


def test_a_short_cpp_namespace_is_split_into_what_it_defines() -> None:
    """A header's `namespace absl { class Cord {...} }` is class Cord (and its free functions), whatever its length:
    as one `namespace absl` chunk the class had no name a query could match."""
    chunks = chunk_text(CPP_DECLS, "cpp")
    found = [(c.kind, c.symbol, c.parent) for c in chunks]
    assert ("class", "Cord", "absl") in found and ("method", "Append", "Cord") in found
    assert ("method", "get", "Box") in found
    assert not any(c.kind == "namespace" and "class Cord {" in c.text for c in chunks)


def test_what_a_split_namespace_holds_between_its_members_is_kept() -> None:
    src = (
        "namespace db {\n\nusing Key = std::string;\nconstexpr int kMax = 5;\n\nclass A { int a; };\n\n"
        "int g = 3;\nstatic int h = 4;\n\nclass B { int b; };\nconstexpr int kMin = 1;\n}  // namespace db\n"
    )
    chunks = chunk_text(src, "cpp")
    kept = "\n".join(c.text for c in chunks)
    assert all(line in kept for line in ("int g = 3;", "static int h = 4;", "constexpr int kMin = 1;"))
    assert [(c.kind, c.symbol) for c in chunks if c.kind == "class"] == [("class", "A"), ("class", "B")]
    # a closing brace or `end` alone is no chunk; a one-line namespace is its member's chunk, not two
    assert [(c.kind, c.symbol) for c in chunk_text("namespace a { class Z {}; }\n", "cpp")] == [("class", "Z")]
    ruby = "module Foo\n  class A\n    def x; end\n  end\n  class B\n  end\nend # module Foo\n"
    assert [c.kind for c in chunk_text(ruby, "ruby")] == ["module", "class", "class"]
    defines = "namespace db {\nclass A { int a; };\n#define kMax 5\n#endif  // X\nclass B { int b; };\n}\n"
    assert [c.text for c in chunk_text(defines, "cpp") if c.kind == "module"] == ["#define kMax 5\n#endif  // X"]
    # a long class inside a namespace is split as it would be at the top level: no one-line `private:` chunks
    methods = "".join(f"  void m{i}() {{\n    int a = {i};\n    a++;\n  }}\n" for i in range(22))
    big = "class Big {\n public:\n" + methods + " private:\n  int count_;\n" + methods.replace("m", "n") + "};\n"
    inside = [c for c in chunk_text("namespace db {\n" + big + "}  // namespace db\n", "cpp") if c.kind == "module"]
    assert inside == [c for c in chunk_text(big, "cpp") if c.kind == "module"] == []
    # comments above a namespace whose first member shares its line go to that member
    head = chunk_text("// Copyright\n// License\nnamespace a { class Z {};\nclass Y {};\n}\n", "cpp")
    assert [(c.kind, c.symbol, c.start_line) for c in head] == [("class", "Z", 1), ("class", "Y", 4)]


def test_a_typedef_names_the_anonymous_c_struct_it_defines() -> None:
    src = "typedef struct {\n  int head;\n} ring_t;\n\ntypedef enum {\n  RED,\n  GREEN\n} *color_ref;\n"
    assert [(c.kind, c.symbol) for c in chunk_text(src, "c")] == [("struct", "ring_t"), ("enum", "color_ref")]
    both = "typedef struct {\n  int a;\n} *PFOO, FOO;\n\ntypedef struct {\n  int b;\n};\n"
    assert [(c.kind, c.symbol) for c in chunk_text(both, "c")] == [("struct", "FOO"), ("struct", None)]


def test_c_struct_mentions_are_no_symbols() -> None:
    src = "struct foo;\nstruct foo *global;\nstruct foo { int a; };\nint f(struct foo *p) { return p->a; }\n"
    assert [(c.kind, c.symbol, c.start_line) for c in chunk_text(src, "c")] == [
        ("struct", "foo", 3),
        ("function", "f", 4),
    ]


MACRO_CLASSES = """\
template <typename T>
class ABSL_MUST_USE_RESULT StatusOr : private internal_statusor::StatusOrData<T> {
 public:
  StatusOr();
};

class ABSL_LOCKABLE ABSL_ATTRIBUTE_WARN_UNUSED Mutex {
 public:
  void Lock();
};

struct FMT_EXPORT format_parse_context {
  int x;
};

ABSL_MUST_USE_RESULT bool ParseFlag(int x) {
  return x > 0;
}

class RGB {
  int r;
};
"""


def test_attribute_macros_do_not_turn_a_cpp_class_into_a_function() -> None:
    chunks = chunk_text(MACRO_CLASSES, "cpp")
    found = [(c.kind, c.symbol) for c in chunks]
    assert found == [
        ("class", "StatusOr"),
        ("class", "Mutex"),
        ("struct", "format_parse_context"),
        ("function", "ParseFlag"),
        ("class", "RGB"),  # an all-caps class name is the name, not a macro
    ]
    assert "class ABSL_LOCKABLE ABSL_ATTRIBUTE_WARN_UNUSED Mutex {" in chunks[1].text  # texts stay as written


@pytest.mark.parametrize(
    ("source", "symbol"),
    [
        ("class RGB final {\n int r;\n};\n", ("class", "RGB", None)),  # `final` is no class name
        ("class MY_API Foo final : public Base {\n int r;\n};\n", ("class", "Foo", None)),
        ("SIZE_T const& size() const { return n; }\n", ("function", "size", None)),  # the macro is the type
        ("FOO_T __stdcall get(int x) { return x; }\n", ("function", "get", None)),
        ("enum FOO_API Color { RED };\n", ("enum", "Color", None)),
        ("class FOO_API Foo\r\n{\r\n int x;\r\n};\r\n", ("class", "Foo", None)),
        ("void Foo<std::vector<int>>::bar() {}\n", ("method", "bar", "Foo")),  # `::` inside template arguments
        ("void Foo<A::B>::f() {}\n", ("method", "f", "Foo")),
        ("Foo::operator std::string() const { return s; }\n", ("method", "operator std::string", "Foo")),
        ("ABSL_MUST_USE_RESULT bool Foo::Bar(int x) { return x; }\n", ("method", "Bar", "Foo")),
        ("Foo::~Foo() {}\n", ("method", "~Foo", "Foo")),
        ("bool Foo::operator==(const Foo& o) const { return true; }\n", ("method", "operator==", "Foo")),
    ],
)
def test_cpp_heads_that_macros_and_qualified_names_make_hard(source: str, symbol: tuple[str, str, str | None]) -> None:
    assert [(c.kind, c.symbol, c.parent) for c in chunk_text(source, "cpp")] == [symbol]


NAMESPACE_MACROS = """\
#include <cstddef>

NLOHMANN_JSON_NAMESPACE_BEGIN
namespace detail
{

template<typename BasicJsonType, typename SAX = json_sax<BasicJsonType>>
class binary_reader
{
  public:
    bool sax_parse(int format);
};

}  // namespace detail
NLOHMANN_JSON_NAMESPACE_END
"""


def test_a_namespace_macro_alone_on_its_line_does_not_turn_the_file_into_one_function() -> None:
    # nlohmann-json, {fmt}, abseil and rapidjson open namespaces with an argument-less macro; the grammar read
    # `NLOHMANN_JSON_NAMESPACE_BEGIN namespace detail {...}` as a function named `namespace`
    chunks = chunk_text(NAMESPACE_MACROS, "cpp")
    assert ("class", "binary_reader") in [(c.kind, c.symbol) for c in chunks]
    assert "namespace" not in [c.symbol for c in chunks]
    cls = next(c for c in chunks if c.symbol == "binary_reader")
    assert cls.text.startswith("template<typename BasicJsonType, typename SAX") and cls.start_line == 7
    # a macro with arguments alone on its line may head a body (`TEST(Suite, Name)` then `{`): left alone
    test = "TEST(Suite, Name)\n{\n  EXPECT_TRUE(ok());\n}\n"
    assert [c.text for c in chunk_text(test, "cpp")] == [test.rstrip("\n")]


def test_a_brace_initialiser_is_no_class_head_and_nested_templates_stay_whole() -> None:
    assert [(c.kind, c.symbol) for c in chunk_text("void g() {\n  struct RGB_COLOR c{1, 2, 3};\n}\n", "cpp")] == [
        ("function", "g")
    ]
    (f,) = chunk_text("template <class T>\ntemplate <class U>\nvoid A<T>::f(U u) {}\n", "cpp")
    assert f.start_line == 1 and (f.symbol, f.parent) == ("f", "A")


def test_a_long_line_of_macro_like_words_is_chunked_in_linear_time() -> None:
    chunk_text("A_B " * 200_000 + "\n", "cpp")  # backtracked quadratically before the repetition was bounded


CSHARP_IF = """\
namespace Newtonsoft.Json
{
    public abstract partial class JsonReader
#if HAVE_ASYNC_DISPOSABLE
        : IAsyncDisposable
#endif
    {
        public bool Read()
        {
#if HAVE_SPAN
            if (_span) {
#else
            if (_array) {
#endif
                return true;
            }
            return false;
        }
    }
}
"""


def test_csharp_is_parsed_as_if_every_if_held() -> None:
    # a directive inside the class head named the class after its condition (HAVE_ASYNC_DISPOSABLE); two branches
    # that each open a block broke the braces of the method
    chunks = chunk_text(CSHARP_IF, "csharp")
    assert [(c.kind, c.symbol) for c in chunks] == [("class", "JsonReader")]
    assert chunks[0].text.splitlines()[1] == "#if HAVE_ASYNC_DISPOSABLE"  # texts stay as written
    assert first_branch(b"#if A\nint a;\n#elif B\nint b;\n#else\nint c;\n#endif\nint d;\n") == (
        b"     \nint a;\n       \n      \n     \n      \n      \nint d;\n"
    )


def test_a_long_blank_run_after_a_macro_name_is_chunked_in_linear_time() -> None:
    chunk_text("int f() { return 1; }\nFOO_BAR" + " " * 40_000 + "= 1;\n", "cpp")  # quadratic before
    chunk_text("FOO_BAR" + " \t" * 20_000 + "\n", "cpp")
    first_branch(b"#if X\n" * 20_000)  # walked the whole #if stack on every line


def test_a_csharp_definition_in_an_else_branch_is_kept_when_the_file_parses() -> None:
    src = "#if NET20\nclass Stub {}\n#else\npublic class OnlyInElse\n{\n    void F() {}\n}\n#endif\n"
    assert [c.symbol for c in chunk_text(src, "csharp")] == ["Stub", "OnlyInElse"]


def test_a_constant_ending_an_expression_is_not_blanked_as_a_macro() -> None:
    from gpubox.tools.search.chunker import without_macros

    src = b"int f() {\n  return a +\n    SOME_CONSTANT;\n}\n"
    assert without_macros(src) == src
    enum = b"enum Color {\n  RED_A,\n  GREEN_B\n};\nint g() {\n  return a +\n    SOME_CONSTANT\n    ;\n}\n"
    assert without_macros(enum) == enum  # indented: an enumerator or a value, not a namespace macro
