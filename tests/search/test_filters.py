"""search_code's language and path_glob filters: names as people write them, and a reason when they match nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gpubox.app import state_of
from gpubox.tools.search.adapter import search_service
from gpubox.tools.search.filters import languages_of, matches, relative_glob
from tests.conftest import call_err, call_ok
from tests.search.conftest import finished


@pytest.mark.parametrize(
    ("written", "means"),
    [("Python", {"python"}), ("py", {"python"}), (".rs", {"rust"}), ("C++", {"cpp"}), ("c#", {"csharp"}),
     ("TypeScript", {"typescript", "tsx"}), ("golang", {"go"}), ("klingon", {"klingon"})],
)  # fmt: skip
def test_a_language_is_read_by_name_alias_or_extension(written: str, means: set[str]) -> None:
    assert languages_of(written) == means


def test_a_glob_with_the_root_or_dot_slash_in_front_is_read_relative_to_the_root() -> None:
    assert relative_glob("/src/repo/pkg/*.py", "/src/repo") == "pkg/*.py"
    assert relative_glob("./pkg/*.py", "/src/repo") == "pkg/*.py"
    assert relative_glob("pkg/*.py", None) == "pkg/*.py"
    assert relative_glob("pkg\\*.py", None) == "pkg/*.py"  # written on Windows


def test_a_leading_double_star_also_matches_files_at_the_root() -> None:
    assert matches("setup.py", "**/setup.py") and matches("a/b/setup.py", "**/setup.py")
    assert not matches("setup.py", "*/setup.py")


@pytest.fixture
def indexed(search_env: tuple[Any, Path, Any]) -> Path:
    repo = search_env[1] / "filters"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "tax.py").write_text("def compute_tax(amount):\n    return amount * 0.2\n")
    (repo / "ui").mkdir()
    (repo / "ui" / "Total.tsx").write_text("export function Total(p: {n: number}) { return <b>{p.n}</b>; }\n")
    (repo / "ui" / "format.ts").write_text("export function formatTotal(n: number): string { return `${n}`; }\n")
    finished(search_service(state_of(search_env[0])).start_index(str(repo), "filters", [], [], None)[2])
    return repo


@pytest.mark.slow  # embeds the three files with MiniLM
@pytest.mark.anyio
async def test_filters_read_as_written_and_say_why_when_they_match_nothing(
    search_env: tuple[Any, Path, Any], indexed: Path
) -> None:
    async with Client(search_env[0]) as client:

        async def paths(**filters: str) -> set[str]:
            res = await call_ok(client, "search_code", query="total", index="filters", k=10, **filters)
            return {h["path"] for h in res["hits"]}

        assert await paths(language="TypeScript") == {"ui/Total.tsx", "ui/format.ts"}
        assert await paths(language="py") == {"pkg/tax.py"}
        assert await paths(path_glob=f"{indexed}/ui/*.ts") == {"ui/format.ts"}
        assert await paths(path_glob="./pkg/*") == {"pkg/tax.py"}

        misspelt = await call_err(client, "search_code", query="total", index="filters", language="pyhton")
        assert "Did you mean: python" in misspelt, misspelt
        absent = await call_err(client, "search_code", query="total", index="filters", language="rust")
        assert "no rust files" in absent and "python" in absent, absent
        elsewhere = await call_err(client, "search_code", query="total", index="filters", path_glob="src/*.py")
        assert "matches no file" in elsewhere and "relative to the index root" in elsewhere, elsewhere
        both = await call_err(
            client, "search_code", query="total", index="filters", path_glob="pkg/*", language="typescript"
        )
        assert "among its typescript files" in both and "ui/" in both, both
