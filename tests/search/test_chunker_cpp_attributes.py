"""C++11 attributes in class heads, beside the export macros that libraries put there (googletest's gtest.h)."""

from __future__ import annotations

import pytest

from gpubox.tools.search.chunker import chunk_text

BODY = " {\n public:\n  int Run();\n  int x_;\n};\n"


@pytest.mark.parametrize(
    "head",
    [
        "class GTEST_API_ [[nodiscard]] UnitTest",
        "class [[nodiscard]] GTEST_API_ UnitTest",
        "class [[nodiscard]] UnitTest : public Test",
        'struct [[deprecated("use Other")]] ABSL_MUST_USE_RESULT UnitTest',
    ],
)
def test_a_class_head_with_attributes_and_macros_is_a_class(head: str) -> None:
    chunks = chunk_text(head + BODY, "cpp")
    assert [(c.kind, c.symbol) for c in chunks] == [("class" if "class" in head else "struct", "UnitTest")]


def test_the_classes_after_such_a_head_keep_their_names() -> None:
    # before, the grammar read the first head as a function and everything after it as one method's windows
    source = "class GTEST_API_ [[nodiscard]] A" + BODY + "\nclass [[nodiscard]] B : public A" + BODY
    assert [(c.kind, c.symbol) for c in chunk_text(source, "cpp")] == [("class", "A"), ("class", "B")]


@pytest.mark.parametrize(
    "signature",
    [
        "SPDLOG_INLINE spdlog::log_clock::time_point now() SPDLOG_NOEXCEPT {",
        "std::tm now(const std::time_t &t) const FMT_NOEXCEPT {",
        "std::tm now() ABSL_LOCKS_EXCLUDED(mu_) ABSL_NO_THREAD_SAFETY_ANALYSIS {",
    ],
)
def test_a_macro_after_the_parameter_list_keeps_the_function(signature: str) -> None:
    source = "namespace os {\n" + signature + "\n    return make();\n}\n}  // namespace os\n"
    names = [(c.kind, c.symbol) for c in chunk_text(source, "cpp")]
    assert ("function", "now") in names or ("method", "now") in names


def test_a_statement_macro_in_a_body_is_left_in_the_chunk_text() -> None:
    source = "void f(int x) {\n  if (x) LOG_FATAL_IF(x);\n  g(x) TRAILING_THING;\n}\n"
    chunks = chunk_text(source, "cpp")
    assert [(c.symbol, c.text) for c in chunks] == [("f", source.rstrip("\n"))]  # blanking is for the parse only


def test_a_long_run_of_macro_words_after_a_parenthesis_is_chunked_in_linear_time() -> None:
    chunk_text("f() " + "A_" * 100_000 + "x (\n" + ") " + "AB_CD " * 50_000 + "(\n", "cpp")  # would hang if cubic


@pytest.mark.parametrize(
    "directive",
    [
        "#define CHECK_OK(a) ABSL_PREDICT_TRUE(a)",  # blanked, the macro's value would become the next line
        "#if defined(FOO) && FOO_BAR",  # `&& FOO_BAR` is no reference qualifier and a macro after it
    ],
)
def test_preprocessor_lines_are_left_as_written(directive: str) -> None:
    source = directive + "\nint g() { return 1; }\n" + ("#endif\n" if directive.startswith("#if") else "")
    assert ("function", "g") in [(c.kind, c.symbol) for c in chunk_text(source, "cpp")]


def test_many_macro_calls_on_one_long_line_are_chunked_in_linear_time() -> None:
    chunk_text("f() FOO_BAR;" * 100_000, "cpp")  # each match looked back to its line's start: quadratic before


def test_statement_macros_with_type_arguments_keep_the_namespace_around_them() -> None:
    # googletest's gmock-actions.h: type arguments are no expression the grammar reads; its error recovery lost the
    # namespace here and, in the whole file, made one function named after the macro of the 300 lines after them
    # (`struct negation` and a dozen other definitions were no symbols)
    source = (
        "namespace internal {\n"
        "DEFINE_DEFAULT_(unsigned char, '\\0');  // NOLINT\n"
        "DEFINE_DEFAULT_(signed char, '\\0');\n"
        "DEFINE_DEFAULT_(double, 0);\n\n"
        "template <typename P>\nstruct negation\n    : std::integral_constant<bool, bool(!P::value)> {};\n"
        "}  // namespace internal\n\n"
        "template <typename R>\nclass OnceAction {\n public:\n  template <typename Callable>\n"
        "  OnceAction(Callable&& callable)  // NOLINT\n      : OnceAction(Ignore<Callable>{\n"
        "            std::forward<Callable>(callable)}) {}\n};\n"
    )
    chunks = chunk_text(source, "cpp")
    names = [(c.kind, c.symbol) for c in chunks]
    assert ("namespace", "internal") in names and ("struct", "negation") in names and ("class", "OnceAction") in names
    assert all(c.symbol != "DEFINE_DEFAULT_" for c in chunks)
    assert "DEFINE_DEFAULT_(unsigned char, '\\0');" in "".join(c.text for c in chunks)  # blanked for the parse only


def test_a_long_unclosed_statement_macro_line_is_chunked_in_linear_time() -> None:
    chunk_text("A_B(" + "x, (y) " * 100_000 + "\n" + "C_D(" * 50_000 + ";\n", "cpp")  # would hang if polynomial


@pytest.mark.parametrize(
    "source",
    [
        "const int kCount =\nARRAY_SIZE(kNames);\nclass Registry {\n public:\n  int x;\n};\n",  # an expression's end
        "Widget*\nMAKE_WIDGET(int a);\n\nclass Registry {\n public:\n  int x;\n};\n",  # a GNU-style prototype
        "#define REGISTER(a) \\\nDO_REGISTER(a, b);\nclass Registry {\n public:\n  int x;\n};\n",  # a macro's body
    ],
)
def test_a_macro_line_that_ends_another_statement_is_left_for_the_grammar(source: str) -> None:
    # blanking it would leave the statement above unfinished and take the next definition into it
    assert [(c.kind, c.symbol) for c in chunk_text(source, "cpp")] == [("class", "Registry")]


def test_many_statement_macros_under_long_comments_are_chunked_in_linear_time() -> None:
    chunk_text(("// " + "x" * 2_000 + "\n") * 200 + "A_B(int, 0);\n" * 20_000, "cpp")  # would hang if quadratic
