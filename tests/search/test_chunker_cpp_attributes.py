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
        "struct [[deprecated(\"use Other\")]] ABSL_MUST_USE_RESULT UnitTest",
    ],
)
def test_a_class_head_with_attributes_and_macros_is_a_class(head: str) -> None:
    chunks = chunk_text(head + BODY, "cpp")
    assert [(c.kind, c.symbol) for c in chunks] == [("class" if "class" in head else "struct", "UnitTest")]


def test_the_classes_after_such_a_head_keep_their_names() -> None:
    # before, the grammar read the first head as a function and everything after it as one method's windows
    source = "class GTEST_API_ [[nodiscard]] A" + BODY + "\nclass [[nodiscard]] B : public A" + BODY
    assert [(c.kind, c.symbol) for c in chunk_text(source, "cpp")] == [("class", "A"), ("class", "B")]
